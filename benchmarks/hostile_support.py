"""The fault suite's hostile cases for log-probs on the sampler's truncated support (algo.logprob_support;
docs/mismatch.md, "Truncated sampling"; benchmarks/fault_probes.py says how they run). Out-of-range top-p/top-k
and a sampler that cannot return its kept sets are refused in one line before the model loads
(contract/config_rules.py); odd kept sets and odd logits reaching the log-prob paths give the hand-computed,
finite result (engine/train/logprobs.py, engine/train/chunked_logsoftmax.py)."""

from __future__ import annotations

import math
from pathlib import Path

from .fault_cases import Case, train
from .fault_probes import Probe, named_probes, short_run_rows

CATEGORY = "support"


def commands() -> list[Case]:
    """`train` with a value or a combination that cannot act: one line, exit 2, no run directory."""
    sampler = "algo.logprob_support=sampler"
    sets = {
        "top_p 0 with the key": ("rollout.top_p=0", sampler),
        "top_p 1.5 with the key": ("rollout.top_p=1.5", sampler),
        "top_p NaN with the key": ("rollout.top_p=nan", sampler),
        "top_p inf with the key": ("rollout.top_p=inf", sampler),
        "top_p negative with the key": ("rollout.top_p=-0.5", sampler),
        "top_k negative with the key": ("rollout.top_k=-1", sampler),
        "top_k a fraction with the key": ("rollout.top_k=2.5", sampler),
        "support misspelt": ("rollout.top_p=0.9", "algo.logprob_support=samplr"),
        "support empty": ("rollout.top_p=0.9", "algo.logprob_support="),
        "support 'trainer' (a rebuilt set, not offered)": ("rollout.top_p=0.9", "algo.logprob_support=trainer"),
        "support a number": ("rollout.top_p=0.9", "algo.logprob_support=1"),
        "sampler support on a vLLM rollout": ("rollout.backend=vllm", "rollout.top_p=0.9", sampler),
        "sampler support on auto-resolved vLLM with top_k": ("rollout.backend=vllm", "rollout.top_k=20"),
        "sampler support through a rollout server": (
            "rollout.backend=vllm",
            "rollout.colocate=false",
            "rollout.server=http://127.0.0.1:9",
            "rollout.top_k=5",
        ),
        "full support with token correction": ("rollout.top_p=0.9", "algo.logprob_support=full", "algo.is_level=token"),
        "full support with sequence correction under top_k": (
            "rollout.top_k=5",
            "algo.logprob_support=full",
            "algo.is_level=sequence",
        ),
    }
    return [
        Case(CATEGORY, name, train(*[arg for s in values for arg in ("--set", s)])) for name, values in sets.items()
    ]


# ---- probes: odd kept sets and logits reaching the log-prob paths -----------------------------------------


def _both_paths(logits, kept, y, tau=1.0):
    """(logps, entropy) of [N, V] logits on kept sets [N, V] through the materialised path and through
    ChunkedLogSoftmax (logits as h = logits, W = identity: its tiles see the same numbers), 3 columns a tile."""
    import torch

    from ..engine.sampler.base import pack_support
    from ..engine.train.chunked_logsoftmax import ChunkedLogSoftmax
    from ..engine.train.logprobs import materialised_logps

    packed = pack_support(kept)
    whole = materialised_logps(logits[:, None], y[:, None], tau, with_entropy=True, support=packed[:, None])
    eye = torch.eye(logits.shape[1])
    tiled = ChunkedLogSoftmax.apply(logits, eye, y, tau, 1, 1.0, None, False, True, 3, packed)
    return (whole[0][:, 0], whole[1][:, 0]), tiled


def a_kept_set_of_one_token_is_certain(tmp: Path) -> str | None:
    """top_p → 0 keeps one token: log π_S = 0 and entropy 0 on both paths, whatever the logits."""
    import torch

    logits = torch.tensor([[3.0, -2.0, 50.0, 0.0, 1.0, 7.0, -80.0]])
    kept = torch.zeros(1, 7, dtype=torch.bool)
    kept[0, 4] = True
    for name, (logps, entropy) in zip(("materialised", "chunked"), _both_paths(logits, kept, torch.tensor([4]))):
        if logps.tolist() != [0.0] or entropy.tolist() != [0.0]:
            return f"{name}: log pi {logps.tolist()}, entropy {entropy.tolist()}"
    return None


def infinite_and_huge_logits_outside_the_set_do_not_leak(tmp: Path) -> str | None:
    """Logits of ±3e38 outside the kept set (both paths), and -inf and NaN there (the materialised path: the
    chunked one computes logits from hidden states): π on the set is the hand log_softmax of its logits."""
    import torch

    from ..engine.sampler.base import pack_support
    from ..engine.train.logprobs import materialised_logps

    kept = torch.zeros(1, 10, dtype=torch.bool)
    kept[0, [1, 3, 5, 8]] = True
    want = torch.log_softmax(torch.tensor([1.0, 2.0, 0.5, 4.0]), -1)
    want_h, y = float(-(want.exp() * want).sum()), torch.tensor([3])
    huge = torch.tensor([[-3e38, 1.0, 3e38, 2.0, 3e38, 0.5, -1.0, 1e30, 4.0, -3.0]])
    odd = torch.tensor([[-math.inf, 1.0, math.inf, 2.0, math.nan, 0.5, -1.0, 1e30, 4.0, -3.0]])
    odd_path = materialised_logps(odd[:, None], y[:, None], 1.0, with_entropy=True, support=pack_support(kept)[:, None])
    paths = {"materialised": _both_paths(huge, kept, y)[0], "chunked": _both_paths(huge, kept, y)[1]}
    paths["materialised, -inf/inf/NaN"] = (odd_path[0][:, 0], odd_path[1][:, 0])
    for name, (logps, entropy) in paths.items():
        if not (abs(float(logps) - float(want[1])) < 1e-5 and abs(float(entropy) - want_h) < 1e-5):
            return (
                f"{name}: log pi {logps.tolist()} (want {float(want[1])}), entropy {entropy.tolist()} (want {want_h})"
            )
    return None


def a_full_set_is_the_plain_softmax(tmp: Path) -> str | None:
    """Every token kept (top_p 1 at that position, or after EOS): the same numbers as no set at all."""
    import torch

    from ..engine.train.logprobs import materialised_logps

    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(5, 11, generator=g) * 10, torch.randint(0, 11, (5,), generator=g)
    plain = materialised_logps(logits[:, None], y[:, None], 0.7, with_entropy=True)
    for name, (logps, entropy) in zip(
        ("materialised", "chunked"), _both_paths(logits, torch.ones(5, 11, dtype=torch.bool), y, 0.7)
    ):
        if not (
            torch.allclose(logps, plain[0][:, 0], atol=1e-5) and torch.allclose(entropy, plain[1][:, 0], atol=1e-5)
        ):
            return f"{name}: {logps.tolist()} vs {plain[0][:, 0].tolist()}"
    return None


def a_near_greedy_run_with_correction_trains(tmp: Path) -> str | None:
    """top_p 0.05 (one kept token almost everywhere) with token-level rollout correction and a KL: finite loss,
    k3 at fp32 rounding on every step."""
    return _short_run(tmp, ["rollout.top_p=0.05", "algo.is_level=token", "algo.beta=0.1"])


def dynamic_sampling_joins_the_kept_sets(tmp: Path) -> str | None:
    """algo.dynamic_sampling's rounds (joined, then cut to their groups) keep each row's own kept sets."""
    return _short_run(tmp, ["rollout.top_k=3", "algo.dynamic_sampling=true", "model.logits_chunk=2"])


def _short_run(tmp: Path, sets: list[str]) -> str | None:
    rows = short_run_rows(tmp, sets)
    if isinstance(rows, str):
        return rows
    seen = [(row.get("loss"), row.get("mismatch/k3")) for row in rows]
    ok = len(rows) == 2 and all(loss is not None and math.isfinite(loss) and k3 is not None for loss, k3 in seen)
    return None if ok and all(k3 < 1e-9 for _, k3 in seen) else f"(loss, mismatch/k3) per step: {seen}"


def probes() -> list[Probe]:
    fast = [
        a_kept_set_of_one_token_is_certain,
        infinite_and_huge_logits_outside_the_set_do_not_leak,
        a_full_set_is_the_plain_softmax,
    ]
    runs = [a_near_greedy_run_with_correction_trains, dynamic_sampling_joins_the_kept_sets]
    return named_probes(CATEGORY, fast) + named_probes(CATEGORY, runs, timeout_s=300, slow=True)


def cases() -> list:
    return [*probes(), *commands()]
