"""grpo_studio.engine.rollout.advantages.compute_advantages against TRL 1.16 and against hand computation.

TRL computes advantages inline in `GRPOTrainer._generate_and_score_completions`, which needs a
model and a generator. The oracle here extracts that method's advantage block verbatim with
`inspect.getsource` (from "# A completion for which every reward function returned None" to
"# Slice to keep only the local part of the data") and its reward-metric block (from
"# Calculate mean reward per function" to "# Log prompts and completions"), then executes them on
our tensors: the reference numbers are TRL's own code, not a copy of it.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from grpo_studio.engine.rollout.advantages import compute_advantages

NAN = float("nan")


def _trl_block(method, start: str, end: str) -> str:
    src = inspect.getsource(method)
    i, j = src.index(start), src.index(end)  # ValueError here means TRL changed: re-read it
    i, j = src.rindex("\n", 0, i) + 1, src.rindex("\n", 0, j) + 1
    return textwrap.dedent(src[i:j])


@pytest.fixture(scope="module")
def trl_advantages():
    import trl.trainer.grpo_trainer as grpo  # the oracle: in the dev extra; missing TRL fails, never skips

    method = grpo.GRPOTrainer._generate_and_score_completions
    adv_block = _trl_block(
        method,
        "# A completion for which every reward function returned None",
        "# Slice to keep only the local part of the data",
    )
    metric_block = _trl_block(method, "# Calculate mean reward per function", "# Log prompts and completions")

    def run(rewards_per_func, weights, group_size, scale):
        metrics = defaultdict(list)
        trainer = SimpleNamespace(
            multi_objective_aggregation="sum_then_normalize",
            reward_weights=weights,
            scale_rewards=scale,
            reward_func_names=[f"f{i}" for i in range(rewards_per_func.shape[1])],
            _metrics={"train": metrics},
        )
        scope = {
            "self": trainer,
            "torch": torch,
            "math": math,
            "nanstd": grpo.nanstd,
            "device": "cpu",
            "rewards_per_func": rewards_per_func,
            "num_generations": group_size,
            "mode": "train",
        }
        exec(adv_block + metric_block, scope)
        return scope["advantages"], {
            "reward/mean": metrics["reward"][-1],
            "reward/std": metrics["reward_std"][-1],
            "reward/frac_zero_std": metrics["frac_reward_zero_std"][-1],
        }

    return run


def _rewards():
    """3 groups of 4 completions, 3 reward functions; None (NaN) per function and for whole rows."""
    g = torch.Generator().manual_seed(7)
    r = torch.randint(0, 3, (12, 3), generator=g).float() + 0.25 * torch.rand(12, 3, generator=g)
    r[1, 2] = NAN  # one function not applicable to one completion
    r[5] = NAN  # unscorable completion: every function returned None
    r[8:12] = torch.tensor([1.0, 0.5, 2.0])  # a group with identical rewards: zero std
    r[2, 0] = NAN  # nansum counts a None as 0 in the weighted sum
    return r


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_matches_trl(trl_advantages, scale):
    rewards, weights = _rewards(), torch.tensor([1.0, 0.5, 2.0])
    adv, metrics = compute_advantages(rewards, weights, 4, scale)
    ref_adv, ref_metrics = trl_advantages(rewards, weights, 4, scale)
    torch.testing.assert_close(adv, ref_adv, atol=1e-6, rtol=0)
    assert adv[5] == 0 and adv.abs().sum() > 0
    assert (scale == "batch") or metrics["reward/frac_zero_std"] == pytest.approx(
        1 / 3
    )  # group 3 of 3 (per completion)
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key


def test_single_function_matches_trl_and_zero_std_groups(trl_advantages):
    rewards = torch.tensor([[1.0], [0.0], [1.0], [0.0], [1.0], [1.0], [1.0], [1.0]])
    adv, metrics = compute_advantages(rewards, torch.tensor([1.0]), 4, "group")
    ref_adv, ref_metrics = trl_advantages(rewards, torch.tensor([1.0]), 4, "group")
    torch.testing.assert_close(adv, ref_adv, atol=1e-6, rtol=0)
    assert metrics["reward/frac_zero_std"] == ref_metrics["reward/frac_zero_std"] == 0.5


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_groups_of_two_match_trl(trl_advantages, scale):
    """G = 2 (the smallest rollout.num_generations): a pair's std has one degree of freedom; one
    pair ties (zero std). And the smallest batch, one prompt of 2."""
    rewards = torch.tensor([[1.0, 0.5], [0.0, 0.5], [2.0, 1.0], [2.0, 1.0], [0.25, 0.0], [1.0, 0.0]])
    weights = torch.tensor([1.0, 2.0])
    for r in (rewards, rewards[:2]):
        adv, metrics = compute_advantages(r, weights, 2, scale)
        ref_adv, ref_metrics = trl_advantages(r, weights, 2, scale)
        torch.testing.assert_close(adv, ref_adv, atol=1e-6, rtol=0)
        assert adv.abs().max() > 0.1
        for key, value in ref_metrics.items():
            assert metrics[key] == pytest.approx(value, abs=1e-6), key


def test_advantages_are_float32_whatever_the_weights_dtype():
    rewards = torch.tensor([[2.0], [0.0], [1.0], [1.0]])
    adv64, _ = compute_advantages(rewards, torch.tensor([1.0], dtype=torch.float64), 4, "group")
    adv32, _ = compute_advantages(rewards, torch.tensor([1.0]), 4, "group")
    assert adv64.dtype == torch.float32 and torch.equal(adv64, adv32)


def test_hand_computed_group_zscore():
    """Group [2, 0, 1, 1]: mean 1, unbiased std sqrt((1+1+0+0)/3) = 0.816497;
    advantages (r - 1) / (0.816497 + 1e-4) = [1.224307, -1.224307, 0, 0].
    With scale 'none' they are just r - 1 = [1, -1, 0, 0]."""
    rewards = torch.tensor([[2.0], [0.0], [1.0], [1.0]])
    adv, metrics = compute_advantages(rewards, torch.tensor([1.0]), 4, "group")
    s = math.sqrt(2 / 3)
    torch.testing.assert_close(adv, torch.tensor([1 / (s + 1e-4), -1 / (s + 1e-4), 0.0, 0.0]), atol=1e-6, rtol=0)
    assert metrics["reward/mean"] == pytest.approx(1.0) and metrics["reward/std"] == pytest.approx(s)
    adv, _ = compute_advantages(rewards, torch.tensor([1.0]), 4, "none")
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="allowed: group, batch, none"):
        compute_advantages(torch.zeros(4, 1), torch.ones(1), 4, "grup")
    with pytest.raises(ValueError, match="multiple of 3"):
        compute_advantages(torch.zeros(4, 1), torch.ones(1), 3, "group")
