"""Rollout/train mismatch telemetry from (μ, π, mask).

μ = the rollout engine's per-token log-probs of the sampled tokens, π = the trainer's
log-probs of the same tokens under the same weights. In exact arithmetic μ == π; in practice
the two engines' numerics differ (arXiv 2510.26788: BF16 makes it much worse than FP16;
Jet-RL: BF16-train + FP8-rollout diverges), so "on-policy" GRPO is silently off-policy.

Conventions (one place, used everywhere below):
    Δ = log π − log μ      per completion token (train minus rollout)
    r = exp(Δ) = π/μ       the token importance ratio

All metrics are computed in float64 from detached inputs over the tokens where mask is true,
so a step costs a few elementwise ops over B×T: cheap enough to leave on every step.

Empty input: when no token is selected (all rows masked, or B·T == 0) every metric is 0.0,
never NaN; mismatch/tokens = 0 tells the reader the zeros mean "no data". Rows with no tokens
do not count as sequences in the sequence-level metrics. Tokens whose μ or π is not finite
are counted in mismatch/nonfinite_tokens: an infinite one (a token one side gave zero
probability) is left out; a NaN one means that side's numbers are broken (a diverged policy),
so every estimate is NaN (null in metrics.jsonl), never a reassuring 0.0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...contract.metrics import (
    HIST_EDGES,  # the histogram's fixed bin edges
    ROUTER_DISAGREE_LAG0,
    ROUTER_DISAGREE_LAGGED,
)

# log r is clamped to ±20 before exp() in the ratio-based metrics (k3, IS), as verl does, so
# one pathological token cannot overflow the step's numbers. |Δ| < 20 is unaffected.
LOG_RATIO_CLAMP = 20.0

METRIC_NAMES = (
    "mismatch/k1",
    "mismatch/k2",
    "mismatch/k3",
    "mismatch/abs_dlogp_mean",
    "mismatch/abs_dlogp_max",
    "mismatch/abs_dp_mean",
    "mismatch/abs_dp_max",
    "mismatch/seq_logratio_mean",
    "mismatch/seq_logratio_std",
    "mismatch/seq_logratio_slope_per_1k",
    "mismatch/prob_pearson",
    "mismatch/is_min",
    "mismatch/is_mean",
    "mismatch/is_max",
    "mismatch/ess",
    "mismatch/tokens",
    "mismatch/nonfinite_tokens",
)


def _prepare(rollout_logps: Tensor, train_logps: Tensor, mask: Tensor | None):
    """(μ, π, m) as float64 with non-finite or masked positions zeroed, plus the counts of selected
    non-finite and NaN tokens."""
    mu = rollout_logps.detach().to(torch.float64)
    pi = train_logps.detach().to(device=mu.device, dtype=torch.float64)
    if mu.shape != pi.shape:
        raise ValueError(f"rollout_logps {tuple(mu.shape)} and train_logps {tuple(pi.shape)} differ in shape")
    if mask is None:
        m = torch.ones_like(mu, dtype=torch.bool)
    else:
        m = mask.detach().to(device=mu.device).bool()
        if m.shape != mu.shape:
            raise ValueError(f"mask {tuple(m.shape)} does not match log-probs {tuple(mu.shape)}")
    finite = torch.isfinite(mu) & torch.isfinite(pi)
    nonfinite = int((m & ~finite).sum())
    nan = int((m & (torch.isnan(mu) | torch.isnan(pi))).sum())
    m = m & finite
    zero = torch.zeros((), dtype=torch.float64, device=mu.device)
    mu = torch.where(m, mu, zero)
    pi = torch.where(m, pi, zero)
    if mu.dim() == 1:  # a single sequence
        mu, pi, m = mu[None], pi[None], m[None]
    return mu, pi, m, nonfinite, nan


def mismatch_metrics(rollout_logps: Tensor, train_logps: Tensor, mask: Tensor | None) -> dict[str, float]:
    """All mismatch/* metrics for one step. Shapes [B, T] (or [T]); mask true = completion token.

    With Δ = log π − log μ, r = π/μ = exp(Δ), p = exp(log π), q = exp(log μ), N masked tokens:

      k1   = mean(log μ − log π) = mean(−Δ)      KL(μ‖π) "k1" estimator (samples come from μ)
      k2   = ½ · mean(Δ²)                        low-variance, biased
      k3   = mean(r − 1 − log r)                 unbiased, ≥ 0: verl's "vllm-kl"
             (Schulman's k1/k2/k3 estimators, written for KL(μ‖π) with tokens sampled from μ)
      abs_dlogp_mean|max = mean|max of |Δ|
      abs_dp_mean|max    = mean|max of |p − q|   (probability space)
      seq_logratio_mean|std: per sequence s = Σ_t Δ_t = log π(y)/μ(y); mean and population std
             (ddof = 0) over rows with ≥ 1 token
      seq_logratio_slope_per_1k: least-squares slope of s against the row's token count L,
             ×1000: how much sequence log-ratio accumulates per 1k completion tokens
             (arXiv 2510.26788, Fig. 5: mismatch grows with response length). 0.0 when fewer
             than two distinct lengths.
      prob_pearson: Pearson correlation of p and q over tokens. When a side has zero variance
             (e.g. a single token): 1.0 if p == q exactly, else 0.0.
      is_min|mean|max: token ratio r;  ess = (Σr)² / (N Σr²) ∈ (0, 1]  (verl's normalised ESS)
      tokens = N,  nonfinite_tokens = masked tokens left out because μ or π was not finite;
      any NaN among them makes every other value NaN

    Worked example (the unit test's): μ = [[−1, −2, pad], [−0.5, pad, pad]],
    π = [[−1.1, −2, pad], [−0.3, pad, pad]] → Δ = [−0.1, 0, 0.2], N = 3:
      k1 = −(−0.1 + 0 + 0.2)/3 = −1/30;  k2 = ½(0.01 + 0 + 0.04)/3 = 1/120
      k3 = ((e^−0.1 + 0.1 − 1) + 0 + (e^0.2 − 0.2 − 1))/3
      seq s = [−0.1, 0.2] with lengths [2, 1] → mean 0.05, std 0.15, slope = −0.3 per token = −300 per 1k.

    Every value is a Python float, NaN only where a μ or π is NaN; with N = 0 every value is 0.0.
    """
    mu, pi, m, nonfinite, nan = _prepare(rollout_logps, train_logps, mask)
    out = dict.fromkeys(METRIC_NAMES, math.nan if nan else 0.0)
    n = int(m.sum())
    out.update({"mismatch/tokens": float(n), "mismatch/nonfinite_tokens": float(nonfinite)})
    if n == 0 or nan:
        return out
    mf = m.to(torch.float64)
    delta = pi - mu  # Δ = log π − log μ, zero at unselected positions
    d = delta[m]  # [N]
    dc = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    r = torch.exp(dc)
    p = torch.exp(pi[m])
    q = torch.exp(mu[m])

    out["mismatch/k1"] = float((-d).mean())
    out["mismatch/k2"] = float(0.5 * (d * d).mean())
    # expm1(Δ) − Δ is r − 1 − log r without the cancellation of exp(Δ) − 1 for tiny Δ.
    out["mismatch/k3"] = float((torch.expm1(dc) - dc).mean())
    ad = d.abs()
    out["mismatch/abs_dlogp_mean"] = float(ad.mean())
    out["mismatch/abs_dlogp_max"] = float(ad.max())
    adp = (p - q).abs()
    out["mismatch/abs_dp_mean"] = float(adp.mean())
    out["mismatch/abs_dp_max"] = float(adp.max())
    out["mismatch/is_min"] = float(r.min())
    out["mismatch/is_mean"] = float(r.mean())
    out["mismatch/is_max"] = float(r.max())
    out["mismatch/ess"] = float(r.sum() ** 2 / (n * (r * r).sum()))

    # Sequence level: s_i = log π(y_i)/μ(y_i) = Σ_t Δ_it over the row's tokens.
    lengths = mf.sum(dim=-1)
    rows = lengths > 0
    s = (delta * mf).sum(dim=-1)[rows]
    L = lengths[rows]
    out["mismatch/seq_logratio_mean"] = float(s.mean())
    out["mismatch/seq_logratio_std"] = float(s.std(correction=0)) if s.numel() > 1 else 0.0
    Lc = L - L.mean()
    var_L = (Lc * Lc).sum()
    if var_L > 0:  # ordinary least squares: slope = cov(L, s) / var(L)
        out["mismatch/seq_logratio_slope_per_1k"] = float(1000.0 * (Lc * (s - s.mean())).sum() / var_L)

    out["mismatch/prob_pearson"] = _pearson(p, q)
    return out


def _pearson(p: Tensor, q: Tensor) -> float:
    pc, qc = p - p.mean(), q - q.mean()
    vp, vq = (pc * pc).sum(), (qc * qc).sum()
    if vp <= 0 or vq <= 0:
        return 1.0 if torch.equal(p, q) else 0.0
    rho = float((pc * qc).sum() / torch.sqrt(vp * vq))
    return max(-1.0, min(1.0, rho))


def dlogp_histogram(rollout_logps: Tensor, train_logps: Tensor, mask: Tensor | None) -> dict:
    """Histogram of token |Δlogp| = |log π − log μ| over masked tokens, on the fixed HIST_EDGES.

    Returns a JSON-serialisable dict (plain ints/floats/lists):
      edges       37 floats: bin i holds edges[i] ≤ |Δ| < edges[i+1]
      counts      36 ints, all tokens;  counts_pos / counts_neg split by the sign of Δ
                  (Δ > 0: the trainer gives the token more probability than the rollout did)
      zero        tokens with Δ == 0 exactly (common when both sides share numerics)
      under       0 < |Δ| < edges[0];  over: |Δ| ≥ edges[-1]
      n           selected tokens = zero + under + sum(counts) + over
    The trainer adds "step" and appends it to histograms.jsonl.
    """
    mu, pi, m, _, _ = _prepare(rollout_logps, train_logps, mask)
    d = (pi - mu)[m]
    nb = len(HIST_EDGES) - 1
    edges = torch.tensor(HIST_EDGES, dtype=torch.float64, device=d.device)
    ad = d.abs()
    inside = (ad >= edges[0]) & (ad < edges[-1])
    # bucketize(right=True) gives i such that edges[i-1] <= x < edges[i]; shift to bin index.
    idx = torch.bucketize(ad[inside], edges, right=True) - 1
    pos = d[inside] > 0
    counts_pos = torch.bincount(idx[pos], minlength=nb)[:nb]
    counts_neg = torch.bincount(idx[~pos], minlength=nb)[:nb]
    return {
        "edges": list(HIST_EDGES),
        "counts": (counts_pos + counts_neg).tolist(),
        "counts_pos": counts_pos.tolist(),
        "counts_neg": counts_neg.tolist(),
        "zero": int((ad == 0).sum()),
        "under": int(((ad > 0) & (ad < edges[0])).sum()),
        "over": int((ad >= edges[-1]).sum()),
        "n": int(d.numel()),
    }


LAG_NAMES = (
    "policy/token_lag_mean",
    "policy/token_lag_max",
    "mismatch/lagged_frac",
    "mismatch/lag0/k3",
    "mismatch/lag0/abs_dlogp_mean",
    "mismatch/lagged/k3",
    "mismatch/lagged/abs_dlogp_mean",
)


def lag_metrics(rollout_logps: Tensor, train_logps: Tensor, mask: Tensor, lags: Tensor) -> dict[str, float]:
    """The mismatch split by policy lag. lags[b, t] = the trainer's policy version − the version that
    sampled token t (0: the weights being trained sampled it). Over the tokens where mask is true:

      policy/token_lag_mean|max  mean|max of lags
      mismatch/lagged_frac       share of tokens with lag > 0
      mismatch/lag0/k3, mismatch/lag0/abs_dlogp_mean      k3 and mean |Δ| (mismatch_metrics) over lag-0
                                 tokens only: the precision/kernel gap alone
      mismatch/lagged/k3, mismatch/lagged/abs_dlogp_mean  the same over lag > 0 tokens: that gap plus the
                                 policy change since they were sampled
    A part with no tokens is left out of the row (as kl_ref is with beta = 0), so a synchronous run writes no
    mismatch/lagged/*; with no tokens at all the row gets none of these.

    Worked example (the unit test's): μ = [[−1, −2, −0.5]], π = [[−1.1, −2, −0.3]], lags = [[0, 1, 2]]
      → token lag mean 1, max 2, lagged_frac 2/3; lag 0: |Δ| = 0.1, k3 = e^−0.1 + 0.1 − 1;
      lagged: |Δ| = (0 + 0.2)/2 = 0.1, k3 = (0 + e^0.2 − 0.2 − 1)/2.
    """
    m = mask.detach().bool()
    lags = lags.detach().to(m.device)
    n = int(m.sum())
    if n == 0:
        return {}
    token_lags = lags[m].to(torch.float64)
    out = {
        "policy/token_lag_mean": float(token_lags.mean()),
        "policy/token_lag_max": float(token_lags.max()),
        "mismatch/lagged_frac": float((token_lags > 0).sum()) / n,
    }
    for part, where in (("lag0", lags == 0), ("lagged", lags > 0)):
        selected = m & where
        if selected.any():
            sub = mismatch_metrics(rollout_logps, train_logps, selected)
            out[f"mismatch/{part}/k3"] = sub["mismatch/k3"]
            out[f"mismatch/{part}/abs_dlogp_mean"] = sub["mismatch/abs_dlogp_mean"]
    return out


def router_lag_counts(compared: Tensor, differ: Tensor, lags: Tensor) -> Tensor:
    """One router call's tokens by policy lag: [[compared, differing] at lag 0, [compared, differing] at
    lag > 0] (long). compared[n]: token n was routed by both the sampler and the trainer; differ[n]: its
    expert sets differ (engine/model/moe.py differs); lags[n]: its policy lag."""
    parts = torch.stack([lags == 0, lags > 0]) & compared.bool()  # [2, N]
    return torch.stack([parts.sum(-1), (parts & differ.bool()).sum(-1)], -1)


def router_lag_metrics(counts: Tensor) -> dict[str, float]:
    """The router disagreement split by policy lag, as lag_metrics splits k3: counts [2, 2] are
    router_lag_counts summed over every router call (each MoE layer of each forward) of the step.

      mismatch/lag0/router_disagree    share of the compared lag-0 tokens (× layers) whose experts differ:
                                       the sampler's precision/kernel alone
      mismatch/lagged/router_disagree  the same over lag > 0 tokens: that plus the routers' change since
    A part with no tokens is left out of the row (a synchronous run writes no mismatch/lagged/router_disagree).

    Worked example (tests/test_moe.py's): 5 tokens, 2 layers, lags 0 0 0 1 2, one lag-0 token unrouted in
    one layer: lag-0 tokens compared 5 times, 2 differing; lagged ones 4 times, 2 differing → 2/5 and 1/2."""
    names = (ROUTER_DISAGREE_LAG0, ROUTER_DISAGREE_LAGGED)
    return {name: differ / compared for name, (compared, differ) in zip(names, counts.tolist()) if compared}


def lag_counts(mask: Tensor, lags: Tensor) -> dict[str, int]:
    """Tokens per policy lag over the tokens where mask is true: {"0": n0, "1": n1, ...} (histograms.jsonl's
    "lag"; string keys, as JSON has them)."""
    values, counts = torch.unique(lags.detach()[mask.detach().bool()], return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values.tolist(), counts.tolist())}


def merge_lag_counts(parts: list[dict[str, int]]) -> dict[str, int]:
    """Data-parallel ranks' lag_counts summed, lags in order."""
    total: dict[int, int] = {}
    for part in parts:
        for lag, n in part.items():
            total[int(lag)] = total.get(int(lag), 0) + n
    return {str(lag): total[lag] for lag in sorted(total)}


def _self_check() -> None:  # pragma: no cover - handy from a shell: python -m grpo_studio.engine.precision.mismatch
    mu = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    pi = torch.tensor([[-1.1, -2.0, 0.0], [-0.3, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    for k, v in mismatch_metrics(mu, pi, mask).items():
        print(f"{k:40s} {v: .6g}")
    assert not any(math.isnan(v) for v in mismatch_metrics(mu, pi, torch.zeros_like(mask)).values())


if __name__ == "__main__":  # pragma: no cover
    _self_check()
