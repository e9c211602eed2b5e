"""Which cause dominates the rollout/train mismatch: the precision/kernel gap or policy lag.

Tokens sampled by the weights being trained (lag 0) carry only the precision/kernel gap; lagged
tokens carry that gap plus the policy change since they were sampled (docs/mismatch.md). So the
lag-0 k3 measures the first cause alone, and a lagged k3 far above it measures the second.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contract.dtypes import DTYPES
from ..contract.metrics import fmt
from .widgets.perf_tables import whole_percents

LAG0_K3, LAGGED_K3, LAGGED_FRAC = "mismatch/lag0/k3", "mismatch/lagged/k3", "mismatch/lagged_frac"
LAG_KEYS = (LAG0_K3, LAGGED_K3, LAGGED_FRAC, "policy/token_lag_mean", "policy/token_lag_max")
LAG_DOMINATES = 4.0  # lagged k3 this many times the lag-0 k3: policy lag is the larger cause
NEGLIGIBLE_K3 = 1e-8  # below this (fp32 vs fp32 sits near 1e-14) neither cause matters

LAG_FIX = "set rollout.async_mode = off or lower train.max_staleness"


@dataclass(frozen=True)
class Verdict:
    cause: str  # "lag", "precision", "none"
    line: str


def precision_fix(dtype: str) -> str:
    """The studio's one-click precision fix (d on the dashboard: duplicate with another dtype) when the A/B
    partner has more mantissa bits; a dtype already above its partner (fp16, fp32) has only fp32 left."""
    here, partner = DTYPES.get(dtype), DTYPES.get(DTYPES[dtype].ab_partner) if dtype in DTYPES else None
    if here is None or partner is None or partner.mantissa_bits > here.mantissa_bits:
        name = DTYPES[dtype].ab_partner if here else "another dtype"
        return f"press d: duplicate with model.dtype = {name} (one-click precision A/B)"
    return f"{dtype} already drifts less than {DTYPES[dtype].ab_partner}; model.dtype = fp32 narrows it further"


def verdict(
    lag0_k3: float | None, lagged_k3: float | None, lagged_frac: float | None, dtype: str = ""
) -> Verdict | None:
    """The dominant cause from a step's lag-split k3; None when the run has no lag split."""
    if lag0_k3 is None and lagged_k3 is None:
        return None
    lag0 = lag0_k3 or 0.0
    if not lagged_frac or lagged_k3 is None:
        if lag0 < NEGLIGIBLE_K3:
            return Verdict("none", f"no lagged tokens; lag-0 k3 {fmt(lag0)}: mismatch negligible")
        return Verdict(
            "precision", f"precision/kernel gap (no lagged tokens, lag-0 k3 {fmt(lag0)}): {precision_fix(dtype)}"
        )
    if max(lag0, lagged_k3) < NEGLIGIBLE_K3:
        return Verdict("none", f"lag-0 k3 {fmt(lag0)}, lagged k3 {fmt(lagged_k3)}: mismatch negligible")
    if lagged_k3 > LAG_DOMINATES * lag0:
        return Verdict(
            "lag",
            f"policy lag dominates (lagged k3 {fmt(lagged_k3)} ≫ lag-0 k3 {fmt(lag0)}, "
            f"{lagged_frac:.0%} of tokens lagged): {LAG_FIX}",
        )
    return Verdict(
        "precision",
        f"precision/kernel gap dominates (lag-0 k3 {fmt(lag0)}, lagged k3 {fmt(lagged_k3)}): {precision_fix(dtype)}",
    )


def lag_shares(hist: dict | None) -> str:
    """The latest histogram row's token counts per lag as shares that add up to 100%: "tokens by lag 0: 70% ·
    1: 30%"; "" without them or when no token lags."""
    counts = {int(k): float(v) for k, v in ((hist or {}).get("lag") or {}).items()}
    total = sum(counts.values())
    if not total or total == counts.get(0):
        return ""
    lags = sorted(counts)
    shares = whole_percents([counts[lag] / total for lag in lags])
    return "tokens by lag " + " · ".join(f"{lag}: {share}%" for lag, share in zip(lags, shares))
