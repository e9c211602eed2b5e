"""`algo.loss_type`: each value one object holding all it means, chosen once from the config.

A loss type says how the per-token losses of a step become one scalar, and everything that follows from it:

  normalise            the scalar of one forward's rows (TRL 1.16 `_compute_loss`'s normalisation)
  micro_batch_weight   what a micro-batch's loss is multiplied by when a step is cut into several
  rank_units           what one data-parallel rank holds of the global normaliser (None: it is global already)
  same_weight_anywhere whether a row weighs the same whatever micro-batch holds it (zero-advantage rows may then
                       be batched apart: engine/train/zero_advantage.py)

The registry BY_NAME is the list of allowed values (contract/config_bounds.py reads it), so adding a loss type is
one class here and its test (docs/design.md, "Adding a loss type"). The math is torch-free (tensor methods only),
so the contract, which every process imports, can hold it.
"""

from __future__ import annotations

from .errors import UserError


class LossType:
    name = ""
    summary = ""  # how its token losses are averaged, for the key's help

    def normalise(self, masked, mask, max_completion_len: int | None, num_items):
        """The scalar loss of `masked` (per-token loss × mask, [B, T]) over these rows."""
        raise NotImplementedError

    def micro_batch_weight(self, part_mask, step_mask, exact: bool) -> float:
        """A micro-batch's share of the step's loss: by default its share of the rows, since the loss is a mean
        over rows (GRPO arXiv 2402.03300, Dr. GRPO arXiv 2503.20783). `exact`: the micro-batches must add up to
        the whole batch's loss (train.micro_batch_tokens, train.micro_batch_size = auto); else a loss type may
        follow TRL's per-micro-batch semantics (an explicit train.micro_batch_size)."""
        return part_mask.shape[0] / step_mask.shape[0]

    def rank_units(self, mask):
        """This rank's part of the global normaliser (a tensor for the all-reduce); by default its rows."""
        return mask.new_tensor(float(mask.shape[0]))

    def same_weight_anywhere(self, exact: bool) -> bool:
        return True


class Grpo(LossType):
    name = "grpo"
    summary = "per sequence (grpo)"

    def normalise(self, masked, mask, max_completion_len, num_items):
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()  # tokens of each sequence, then sequences


class Bnpo(LossType):
    name = "bnpo"
    summary = "per batch token (bnpo)"

    def normalise(self, masked, mask, max_completion_len, num_items):
        return masked.sum() / mask.sum().clamp(min=1.0)

    def micro_batch_weight(self, part_mask, step_mask, exact):
        """Exact: its share of the step's tokens; under an explicit train.micro_batch_size each micro-batch is its
        own token mean, weighted by rows, as in TRL."""
        if exact:
            return (part_mask.sum() / step_mask.sum().clamp(min=1.0)).item()
        return super().micro_batch_weight(part_mask, step_mask, exact)

    def rank_units(self, mask):
        return mask.sum()

    def same_weight_anywhere(self, exact):
        return exact


class DrGrpo(LossType):
    name = "dr_grpo"
    summary = "by B·L_max (dr_grpo)"

    def normalise(self, masked, mask, max_completion_len, num_items):
        # a constant normaliser B·L_max (Dr. GRPO, arXiv 2503.20783)
        if not max_completion_len or max_completion_len <= 0:
            raise UserError("algo.loss_type = 'dr_grpo' needs rollout.max_completion_len > 0")
        return masked.sum() / (masked.size(0) * max_completion_len)


class Dapo(LossType):
    name = "dapo"
    summary = "over the rollout's tokens (dapo, TRL's default)"

    def normalise(self, masked, mask, max_completion_len, num_items):
        # the token sum over the active tokens of the whole generation batch (DAPO arXiv 2503.14476, eq. 8): the
        # normaliser is already global, so micro-batch and rank losses simply add up
        if num_items is None:
            total = mask.sum()
        else:  # a count, or a tensor holding one (TRL's num_items_in_batch)
            total = num_items.to(mask.dtype) if hasattr(num_items, "to") else mask.new_tensor(num_items)
        return masked.sum() / total.clamp(min=1.0)

    def micro_batch_weight(self, part_mask, step_mask, exact):
        return 1.0

    def rank_units(self, mask):
        return None


BY_NAME: dict[str, LossType] = {kind.name: kind for kind in (Grpo(), Bnpo(), DrGrpo(), Dapo())}


def of(name: str) -> LossType:
    if name not in BY_NAME:
        raise UserError(key="algo.loss_type", value=name, allowed=tuple(BY_NAME))
    return BY_NAME[name]
