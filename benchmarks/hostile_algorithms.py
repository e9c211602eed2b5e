"""The fault suite's hostile cases for the algorithm keys (benchmarks/fault_probes.py says how they run): IcePop's
band (algo.is_floor with algo.is_cap) and pass@k advantages (algo.advantage, algo.pass_k). Meaningless
combinations are refused in one line before the model loads (contract/config_rules.py); odd numbers reaching the
loss or the advantages (a NaN or -inf sampler log-prob, a graded or infinite reward, a group of 1024) give finite
weights and the documented result (engine/train/losses.py, engine/rollout/advantages.py)."""

from __future__ import annotations

import math
from pathlib import Path

from .fault_cases import Case, train
from .fault_probes import Probe, named_probes, short_run_rows

CATEGORY = "algorithms"
PASS_AT_K = ('rewards.funcs=["correctness"]', "algo.advantage=pass_at_k")  # as --set values


def commands() -> list[Case]:
    """`train` with a combination that cannot act: one line, exit 2, no run directory."""
    sets = {
        "a floor above the cap": ("algo.name=icepop", "algo.is_cap=0.4"),
        "a floor equal to the cap": ("algo.is_level=token", "algo.is_floor=0.5", "algo.is_cap=0.5"),
        "a floor above 1": ("algo.is_level=token", "algo.is_floor=1.5"),
        "a floor without rollout correction (auto on hf)": ("algo.is_floor=0.5",),
        "icepop with is_level none": ("algo.name=icepop", "algo.is_level=none"),
        "icepop with mask and no cap": ("algo.name=icepop", "algo.is_cap=0"),
        "is_mode icepop (a preset, not a mode)": ("algo.is_mode=icepop",),
        "a negative floor": ("algo.name=icepop", "algo.is_floor=-0.5"),
        "a NaN floor": ("algo.name=icepop", "algo.is_floor=nan"),
        "pass_k without pass_at_k": ("algo.pass_k=2",),
        "advantage misspelt": ("algo.advantage=pass@k",),
        "pass_at_k with two reward functions": ("algo.advantage=pass_at_k",),
        "pass_at_k with batch std": (*PASS_AT_K, "algo.scale_rewards=batch"),
        "pass_k equal to num_generations": (*PASS_AT_K, "algo.pass_k=8"),
        "pass_k above num_generations": (*PASS_AT_K, "algo.pass_k=9"),
        "default pass_k above a group of 2": (*PASS_AT_K, "rollout.num_generations=2"),
        "pass_k 0": (*PASS_AT_K, "algo.pass_k=0"),
        "pass_k negative": (*PASS_AT_K, "algo.pass_k=-3"),
        "pass_k not an integer": (*PASS_AT_K, "algo.pass_k=2.5"),
        "pass_k a word": (*PASS_AT_K, "algo.pass_k=four"),
        "pass_k huge": (*PASS_AT_K, "algo.pass_k=" + "9" * 30),
    }
    return [
        Case(CATEGORY, name, train(*[arg for s in values for arg in ("--set", s)])) for name, values in sets.items()
    ]


# ---- probes: numbers that reach the loss and the advantages -----------------------------------------------


def _advantages(rewards: list[float], group: int, k: int, scale: str = "group"):
    import torch

    from ..engine.rollout.advantages import compute_advantages

    table = torch.tensor(rewards, dtype=torch.float32).unsqueeze(1)
    return compute_advantages(table, torch.ones(1), group, scale, "pass_at_k", k)[0]


def graded_rewards_are_thresholded_at_zero(tmp: Path) -> str | None:
    """A non-binary reward under pass@k: > 0 passes, the rest fails, the magnitude dropped (docs/algorithms.md)."""
    graded = _advantages([0.3, -1.0, 0.0, 2.0, 1e30, -1e30, float("inf"), float("-inf")], 8, 3)
    binary = _advantages([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0], 8, 3)
    return None if graded.tolist() == binary.tolist() else f"graded {graded.tolist()} vs binary {binary.tolist()}"


def a_group_of_1024_is_finite_and_centred(tmp: Path) -> str | None:
    """C(1024, 512) is far beyond a float: the closed form divides exact integers, so R̄ stays in [0, 1]."""
    adv = _advantages([1.0] * 3 + [0.0] * 1021, 1024, 512)
    if not all(math.isfinite(a) for a in adv.tolist()):
        return f"non-finite advantages: {adv[:4].tolist()}"
    total = sum(adv.double().tolist())
    return None if abs(total) < 1e-3 and adv[0] > 0 > adv[-1] else f"sum {total}, first {adv[0]}, last {adv[-1]}"


def unscored_rows_get_zero(tmp: Path) -> str | None:
    """Every reward function returned None (NaN): the row leaves its group, advantage 0, the rest still score."""
    adv = _advantages([1.0, float("nan"), 0.0, float("nan"), 0.0, 1.0], 6, 2).tolist()
    if adv[1] != 0.0 or adv[3] != 0.0 or not adv[0] > 0 > adv[2]:
        return f"advantages {adv}"
    return None


def a_group_with_fewer_scored_than_k_is_zero(tmp: Path) -> str | None:
    adv = _advantages([1.0, float("nan"), float("nan"), 0.0], 4, 3).tolist()
    return None if adv == [0.0] * 4 else f"advantages {adv}"


def band_weights_stay_finite(tmp: Path) -> str | None:
    """μ = -inf (ρ = inf) is masked, a NaN μ is ρ = 1 (kept, as TRL), π_old = -inf (ρ = 0) is under the floor."""
    import torch

    from ..engine.train.losses import rollout_correction

    inf, nan = float("inf"), float("nan")
    old = torch.tensor([[-1.0, -1.0, -inf, -1.0]])
    mu = torch.tensor([[-inf, nan, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    for mode, want in (("mask", [0.0, 1.0, 0.0, 1.0]), ("truncate", [5.0, 1.0, 0.5, 1.0])):
        weights, metrics = rollout_correction(old, mu, mask, "token", mode, 5.0, 0.5)
        if weights.flatten().tolist() != want or metrics["mismatch/masked_frac"] != 0.5:
            return f"{mode}: weights {weights.flatten().tolist()}, masked_frac {metrics['mismatch/masked_frac']}"
    return None


def icepop_trains_with_a_bf16_rollout(tmp: Path) -> str | None:
    """Two steps of the preset against a bf16 sampler: every step logs a finite loss and masked_frac in [0, 1]."""
    return _short_run(tmp, ["algo.name=icepop", "rollout.dtype=bf16"], "mismatch/masked_frac")


def pass_at_k_trains_on_a_graded_reward(tmp: Path) -> str | None:
    """Two steps with proximity (scores in [-1, 2]) under pass@k: thresholded, finite, trained."""
    return _short_run(tmp, ['rewards.funcs=["proximity"]', "algo.advantage=pass_at_k", "algo.pass_k=3"], "loss")


def _short_run(tmp: Path, sets: list[str], metric: str) -> str | None:
    rows = short_run_rows(tmp, sets)
    if isinstance(rows, str):
        return rows
    values = [row.get(metric) for row in rows]
    ok = len(rows) == 2 and all(v is not None and math.isfinite(v) for v in values)
    if ok and metric == "mismatch/masked_frac":
        ok = all(0 <= v <= 1 for v in values)
    return None if ok else f"{metric} per step: {values}"


def probes() -> list[Probe]:
    fast = [
        graded_rewards_are_thresholded_at_zero,
        a_group_of_1024_is_finite_and_centred,
        unscored_rows_get_zero,
        a_group_with_fewer_scored_than_k_is_zero,
        band_weights_stay_finite,
    ]
    runs = [icepop_trains_with_a_bf16_rollout, pass_at_k_trains_on_a_graded_reward]
    return named_probes(CATEGORY, fast) + named_probes(CATEGORY, runs, timeout_s=300, slow=True)


def cases() -> list:
    return [*probes(), *commands()]
