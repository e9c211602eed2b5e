"""contract/loss_types.py: each algo.loss_type one object, the registry the list of allowed values.

The properties every loss type must have, checked for each one registered (so a new one is checked the day it
is added): its micro-batch weights put a cut batch back together (the accumulated loss equals the whole batch's),
its rank units put the ranks back together, and its normaliser matches a hand computation.
"""

import pytest
import torch

from grpo_studio.contract import config, loss_types
from grpo_studio.contract.errors import UserError

# 3 rows of 4 tokens: lengths 4, 2, 1
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [7.0, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
HAND = {  # by hand from the tables above (max_completion_len 4, num_items 10)
    "grpo": (10 / 4 + 11 / 2 + 7 / 1) / 3,
    "bnpo": 28 / 7,
    "dr_grpo": 28 / (3 * 4),
    "dapo": 28 / 10,
}


def test_the_registry_is_the_keys_allowed_values():
    info = next(i for i in config.key_info() if i.key == "algo.loss_type")
    assert list(info.choices) == list(loss_types.BY_NAME) == ["grpo", "bnpo", "dr_grpo", "dapo"]
    assert all(kind.summary in info.help for kind in loss_types.BY_NAME.values())
    with pytest.raises(UserError) as refused:
        loss_types.of("seq_mean")
    assert str(refused.value) == "config error: algo.loss_type = 'seq_mean': allowed: grpo, bnpo, dr_grpo, dapo"


@pytest.mark.parametrize("name", list(loss_types.BY_NAME))
def test_normaliser_by_hand(name):
    value = loss_types.of(name).normalise(LOSS * MASK, MASK, 4, 10 if name == "dapo" else None)
    assert value.item() == pytest.approx(HAND[name], rel=1e-6)


def test_dapo_without_num_items_is_the_batch_token_sum():
    assert loss_types.of("dapo").normalise(LOSS * MASK, MASK, 4, None).item() == pytest.approx(28 / 7)
    assert loss_types.of("dapo").normalise(LOSS * MASK, MASK, 4, torch.tensor(10)).item() == pytest.approx(2.8)


def test_dr_grpo_needs_a_completion_length():
    with pytest.raises(UserError, match=r"needs rollout.max_completion_len > 0"):
        loss_types.of("dr_grpo").normalise(LOSS * MASK, MASK, 0, None)


def _batch(rows=8, width=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(rows, width, generator=g)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width) < lengths[:, None]).float()
    return loss, mask


@pytest.mark.parametrize("token_budget", [False, True])
@pytest.mark.parametrize("name", list(loss_types.BY_NAME))
def test_micro_batch_weights_put_the_batch_back_together(name, token_budget):
    """Σ weight_k · L(micro-batch k) = L(whole batch), for every cut, where the loss type says a row weighs the
    same anywhere; bnpo under micro_batch_size is TRL's per-micro-batch token mean, weighted by rows."""
    kind = loss_types.of(name)
    loss, mask = _batch()
    num_items = float(mask.sum()) if name == "dapo" else None
    whole = kind.normalise(loss * mask, mask, 6, num_items).item()
    for cut in ([0, 3, 8], [0, 1, 2, 7, 8], [0, 5, 8]):
        parts = [slice(a, b) for a, b in zip(cut, cut[1:])]
        total = sum(
            kind.micro_batch_weight(mask[p], mask, token_budget)
            * kind.normalise(loss[p] * mask[p], mask[p], 6, num_items)
            for p in parts
        )
        if kind.same_weight_anywhere(token_budget):
            assert total.item() == pytest.approx(whole, rel=1e-5, abs=1e-6)
        else:  # TRL's: each micro-batch its own token mean, by its share of rows
            trl = sum(len(range(8)[p]) / 8 * (loss[p] * mask[p]).sum() / mask[p].sum() for p in parts)
            assert total.item() == pytest.approx(trl.item(), rel=1e-5)


@pytest.mark.parametrize("name", list(loss_types.BY_NAME))
def test_rank_units_put_the_ranks_back_together(name):
    """Σ_r w_r · L_r = L, w_r = units_r / Σ units (1 where rank_units is None): what distributed.share computes."""
    kind = loss_types.of(name)
    loss, mask = _batch(rows=8, seed=1)
    num_items = float(mask.sum()) if name == "dapo" else None
    whole = kind.normalise(loss * mask, mask, 6, num_items).item()
    ranks = [slice(0, 3), slice(3, 8)]
    units = [kind.rank_units(mask[r]) for r in ranks]
    weights = [1.0] * 2 if units[0] is None else [float(u) / float(sum(units)) for u in units]
    total = sum(w * kind.normalise(loss[r] * mask[r], mask[r], 6, num_items).item() for w, r in zip(weights, ranks))
    assert total == pytest.approx(whole, rel=1e-5)
