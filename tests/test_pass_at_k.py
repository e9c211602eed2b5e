"""algo.advantage = pass_at_k (Chen et al. 2025, arXiv 2508.10751) against brute force: every k-subset of a small
group enumerated, its score the best of its members (pass = reward > 0), R̄ and σ taken over all C(n, k) subsets,
and each completion's advantage the mean of (score − R̄)/σ over the subsets that hold it (float32, as the trainer's totals). Also its config rules,
each refused in one line."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from grpo_studio.contract import config
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.rollout.advantages import compute_advantages


def enumerated(rewards: list[float], k: int, scale: str) -> list[float]:
    """The pass@k advantages of one group by enumerating its k-subsets (the oracle)."""
    n = len(rewards)
    subsets = list(itertools.combinations(range(n), k))
    scores = {s: float(any(rewards[i] > 0 for i in s)) for s in subsets}
    mean = sum(scores.values()) / len(subsets)
    std = math.sqrt(sum((v - mean) ** 2 for v in scores.values()) / len(subsets))  # population std
    if scale == "group" and std == 0:
        return [0.0] * n
    divide = std if scale == "group" else 1.0
    return [
        sum((scores[s] - mean) / divide for s in subsets if i in s) / sum(1 for s in subsets if i in s)
        for i in range(n)
    ]


def ours(groups: list[list[float]], k: int, scale: str = "group") -> tuple[torch.Tensor, dict]:
    rewards = torch.tensor([r for g in groups for r in g], dtype=torch.float64).unsqueeze(1)
    return compute_advantages(rewards, torch.tensor([1.0], dtype=torch.float64), len(groups[0]), scale, "pass_at_k", k)


@pytest.mark.parametrize("scale", ["group", "none"])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_every_pass_count_and_k_matches_enumeration(n, scale):
    for k in range(1, n + 1):
        groups = [[1.0] * c + [0.0] * (n - c) for c in range(n + 1)]  # every pass count c, one group each
        adv, _ = ours(groups, k, scale)
        expected = [a for g in groups for a in enumerated(g, k, scale)]
        assert adv.tolist() == pytest.approx(expected, abs=1e-6), (n, k)


def test_a_worked_group_by_hand():
    """n = 8, k = 4, c = 2: R̄ = 1 − C(6,4)/C(8,4) = 1 − 15/70 = 11/14, σ = sqrt(R̄(1 − R̄)); a passing completion
    gets (1 − R̄)/σ, a failing one (1 − R̄ − C(5,3)/C(7,3))/σ = (3/14 − 10/35)/σ."""
    mean = 11 / 14
    std = math.sqrt(mean * (1 - mean))
    adv, metrics = ours([[2.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]], 4)
    passing, failing = (1 - mean) / std, (3 / 14 - 10 / 35) / std
    assert adv.tolist() == pytest.approx([passing, failing, failing, passing, failing, failing, failing, failing])
    assert passing == pytest.approx(0.5222, abs=1e-4) and failing == pytest.approx(-0.1741, abs=1e-4)
    assert sum(adv.tolist()) == pytest.approx(0.0, abs=1e-6)
    assert metrics["reward/frac_zero_std"] == 0.0 and metrics["reward/mean"] == 0.5


def test_k1_is_grpo_with_the_population_std_and_no_epsilon():
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0]
    adv, _ = ours([rewards], 1)
    t = torch.tensor(rewards, dtype=torch.float64)
    assert adv.tolist() == pytest.approx(((t - t.mean()) / t.std(unbiased=False)).tolist(), abs=1e-6)


def test_rewards_pass_above_zero_and_the_magnitude_is_dropped():
    """The threshold is the documented one: > 0 passes, 0 and below fail, however large."""
    adv_graded, _ = ours([[0.3, -1.0, 0.0, 2.0, 0.0]], 2)
    adv_binary, _ = ours([[1.0, 0.0, 0.0, 1.0, 0.0]], 2)
    assert adv_graded.tolist() == adv_binary.tolist()


def test_no_signal_groups_are_zero_and_counted_as_zero_std():
    """No pass, every pass, and fewer than k failures (every k-subset holds a pass) give σ = 0: advantage 0."""
    adv, metrics = ours([[0.0] * 4, [1.0] * 4, [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], 3)
    assert adv[:12].tolist() == [0.0] * 12
    assert adv[12:].tolist() == pytest.approx(enumerated([1.0, 0.0, 0.0, 0.0], 3, "group"))
    assert metrics["reward/frac_zero_std"] == 0.75


def test_unscored_rows_leave_the_group_and_get_zero():
    """A row every reward function returned None for (NaN) is out of the group, as in GRPO."""
    rewards = torch.tensor([[1.0], [float("nan")], [0.0], [0.0], [1.0]], dtype=torch.float64)
    adv, _ = compute_advantages(rewards, torch.tensor([1.0], dtype=torch.float64), 5, "group", "pass_at_k", 2)
    expected = enumerated([1.0, 0.0, 0.0, 1.0], 2, "group")
    assert adv.tolist() == pytest.approx([expected[0], 0.0, *expected[1:]], abs=1e-6)


# ---- config rules: each one line ------------------------------------------------------------------


def refused(*sets: str) -> str:
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", list(sets))
    return str(err.value)


def test_pass_k_is_refused_at_or_above_the_group_size_and_below_one():
    one = ['rewards.funcs=["correctness"]', "algo.advantage=pass_at_k"]
    assert refused(*one, "algo.pass_k=8") == (
        "config error: algo.pass_k = 8: must be below rollout.num_generations = 8: pass@k advantages average over "
        "the k-subsets of a group, and at k >= 8 there is at most one, so every advantage would be 0"
    )
    assert refused(*one, "algo.pass_k=0") == "config error: algo.pass_k = 0: must be >= 1"
    assert "algo.pass_k = '2.5'" in refused(*one, "algo.pass_k=2.5")
    assert config.load("tiny-arith", [*one, "algo.pass_k=7"]).algo.pass_k == 7


def test_pass_at_k_refuses_several_reward_functions_and_batch_scaling():
    assert refused("algo.advantage=pass_at_k") == (
        "config error: rewards.funcs = ['correctness', 'format']: algo.advantage = 'pass_at_k' takes pass "
        "(reward > 0) or fail from one reward function, as eval/pass@k does; give one, e.g. ['correctness']"
    )
    assert refused('rewards.funcs=["correctness"]', "algo.advantage=pass_at_k", "algo.scale_rewards=batch") == (
        "config error: algo.scale_rewards = 'batch': pass@k advantages are divided by the std of their group's "
        "k-subset rewards, or not at all; allowed with algo.advantage = 'pass_at_k': group, none"
    )


def test_pass_k_without_pass_at_k_is_refused():
    assert refused("algo.pass_k=2") == (
        "config error: algo.pass_k = 2: has no effect with algo.advantage = 'grpo'; set algo.advantage = "
        "'pass_at_k' or leave this at 4"
    )
