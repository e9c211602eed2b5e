"""Micro-batches that cannot move the weights: not trained, the update stays bitwise the same.

With algo.beta = 0 every term of the loss (engine/train/losses.py: PPO-clip or pg, × rollout-correction weights) is
a product with the row's advantage; entropy is a metric only. A micro-batch whose rows all have advantage
exactly 0 (a zero-variance group's rows) has loss exactly 0 and, when that loss is finite, a gradient of
exactly 0 in every parameter it reaches: backward is linear in its incoming gradient, so zeros in, zeros
out. Adding it changes no .grad, so its backward is skipped.

Its forward (train.score_zero_advantage = false, the default): where every row weighs the same in the gradient
whatever micro-batch holds it (`packable`), the zero-advantage rows fill micro-batches of their own after the
others' (engine/rollout/batching.py micro_batches), and those are not run at all (`unscored`; issue 27: on a
GSM8K-shaped rollout of a 135M chat model most groups have no reward spread). The metrics of the loss (entropy, ratios, clip fractions) and the rollout/train mismatch are then
over the rows that were run; one micro-batch always runs, so every step measures the mismatch. With
train.score_zero_advantage = true the micro-batches are those of a run without skipping and each one's
forward runs (π for the mismatch telemetry, the loss's metrics), so every value the step computes is the one
it computes without skipping.

One thing a backward of zeros does change: a parameter it reaches whose .grad was None gets a zero
.grad, and AdamW then steps it (weight decay, moment decay) where it would skip a None. `Skipped` keeps
the parameters each skipped loss reaches (its autograd graph) and gives those a zero .grad at the end
(a step whose every micro-batch is skipped; with forwards run, a mixture-of-experts expert only a skipped
micro-batch routed to).

Off (`skippable`) where that is not exact: algo.beta > 0 (the KL term's gradient needs no advantage), more
than one process (FSDP reduce-scatters on every backward; ddp's one all-reduce after the micro-batches
would see the same .grads, but no test covers it yet), and fp16 (a forward that overflows where the loss
does not read turns a backward of zeros into NaN there, a skipped step without skipping, a taken one with
it).

docs/performance.md, "Zero-advantage micro-batches".
"""

from __future__ import annotations

import torch

from ...contract import loss_types


def skippable(cfg, dist, precision) -> bool:
    """Whether this run may skip the backward of zero-advantage micro-batches at all."""
    return cfg.algo.beta == 0 and dist.world == 1 and not precision.loss_scaling


def packable(cfg, dist, precision) -> bool:
    """Whether the step's zero-advantage rows are batched apart from the others, in micro-batches of their own
    after them: train.score_zero_advantage off (they are then not run; with it on the micro-batches are as
    without skipping), skipping possible (`skippable`; in fp16 a micro-batch of them would run all the same) and
    a loss type whose rows weigh the same whatever micro-batch holds them (contract/loss_types.py)."""
    anywhere = loss_types.of(cfg.algo.loss_type).same_weight_anywhere(bool(cfg.train.micro_batch_tokens))
    return skippable(cfg, dist, precision) and anywhere and not cfg.train.score_zero_advantage


def unscored(micro_batches: list[torch.Tensor], advantages: torch.Tensor, skip: bool, score: bool) -> list[bool]:
    """Which micro-batches skip their forward too: those whose rows all have advantage 0, unless skipping is
    off or train.score_zero_advantage asks for their forward; the first runs when all would be skipped (the
    step's mismatch telemetry then has its rows)."""
    out = [skip and not score and not bool(advantages[rows].any()) for rows in micro_batches]
    if out and all(out):
        out[0] = False
    return out


def zero_gradient(advantages: torch.Tensor, loss: float) -> bool:
    """The micro-batch's gradient is exactly 0: every advantage is 0 and the loss is 0 (so finite)."""
    return loss == 0.0 and not bool(advantages.any())


class Skipped:
    """The skipped micro-batches of one step: their rows, and the parameters their losses reach."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []
        self.reached: dict[int, torch.Tensor] = {}

    def rows(self) -> torch.Tensor:
        """The skipped rows' indices."""
        return torch.cat(self.parts) if self.parts else torch.zeros(0, dtype=torch.long)

    def add(self, loss: torch.Tensor, rows: torch.Tensor) -> None:
        self.parts.append(rows.cpu())
        seen, todo = set(), [loss.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            leaf = getattr(node, "variable", None)  # AccumulateGrad: a leaf, here a trained parameter
            if leaf is not None:
                self.reached[id(leaf)] = leaf
            todo.extend(fn for fn, _ in node.next_functions)

    def fill(self) -> None:
        """A zero .grad where a skipped backward would have left one and none is there (AdamW steps it)."""
        for p in self.reached.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
