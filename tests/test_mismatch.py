"""mismatch_metrics / dlogp_histogram against hand computations on small tensors."""

import json
import math

import pytest
import torch

from grpo_studio.engine.precision.mismatch import HIST_EDGES, METRIC_NAMES, dlogp_histogram, mismatch_metrics

# The docstring's worked example: Δ = π − μ = [−0.1, 0, 0.2]; the padded positions hold junk
# (including −inf and NaN) that the mask must hide.
MU = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -float("inf"), 3.0]])
PI = torch.tensor([[-1.1, -2.0, 7.0], [-0.3, 5.0, float("nan")]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)

DESIGN_NAMES = [
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
]


def approx(x):
    # inputs are float32, so compare at float32 resolution of the inputs (~1e-7 relative)
    return pytest.approx(x, rel=1e-6, abs=1e-7)


def test_names_and_types():
    out = mismatch_metrics(MU, PI, MASK)
    # the docstring's names plus the two counts, in the order METRIC_NAMES lists them
    assert list(out) == list(METRIC_NAMES) == DESIGN_NAMES + ["mismatch/tokens", "mismatch/nonfinite_tokens"]
    assert all(type(v) is float for v in out.values())


def test_hand_computed_values():
    out = mismatch_metrics(MU, PI, MASK)
    # Δ = log π − log μ on the three completion tokens, as float32 arithmetic gives them
    d = [float(torch.tensor(-1.1) - torch.tensor(-1.0)), 0.0, float(torch.tensor(-0.3) - torch.tensor(-0.5))]
    assert d == pytest.approx([-0.1, 0.0, 0.2], abs=1e-6)
    assert out["mismatch/tokens"] == 3.0
    assert out["mismatch/k1"] == approx(-sum(d) / 3)  # ≈ −1/30
    assert out["mismatch/k1"] == pytest.approx(-1 / 30, abs=1e-6)
    assert out["mismatch/k2"] == pytest.approx(1 / 120, abs=1e-6)  # ½ (0.01 + 0 + 0.04) / 3
    k3 = sum(math.exp(x) - x - 1 for x in d) / 3
    assert out["mismatch/k3"] == approx(k3)
    assert out["mismatch/k3"] == pytest.approx((math.exp(-0.1) + 0.1 - 1 + math.exp(0.2) - 0.2 - 1) / 3, abs=1e-6)
    assert out["mismatch/abs_dlogp_mean"] == pytest.approx(0.1, abs=1e-6)
    assert out["mismatch/abs_dlogp_max"] == pytest.approx(0.2, abs=1e-6)
    dps = [abs(math.exp(-1.1) - math.exp(-1.0)), 0.0, abs(math.exp(-0.3) - math.exp(-0.5))]
    assert out["mismatch/abs_dp_mean"] == pytest.approx(sum(dps) / 3, abs=1e-6)
    assert out["mismatch/abs_dp_max"] == pytest.approx(max(dps), abs=1e-6)  # 0.1343, the 2nd row
    # sequences: s = [−0.1 + 0, 0.2] with lengths [2, 1]
    assert out["mismatch/seq_logratio_mean"] == pytest.approx(0.05, abs=1e-6)
    assert out["mismatch/seq_logratio_std"] == pytest.approx(0.15, abs=1e-6)  # population std
    # OLS slope: cov(L, s)/var(L) = (0.5·−0.15 + −0.5·0.15)/(0.25 + 0.25) = −0.3 per token
    assert out["mismatch/seq_logratio_slope_per_1k"] == pytest.approx(-300.0, abs=1e-3)
    r = [math.exp(x) for x in d]
    assert out["mismatch/is_min"] == approx(min(r))
    assert out["mismatch/is_max"] == approx(max(r))
    assert out["mismatch/is_mean"] == approx(sum(r) / 3)
    assert out["mismatch/ess"] == approx(sum(r) ** 2 / (3 * sum(x * x for x in r)))
    p = [math.exp(-1.1), math.exp(-2.0), math.exp(-0.3)]
    q = [math.exp(-1.0), math.exp(-2.0), math.exp(-0.5)]
    pm, qm = sum(p) / 3, sum(q) / 3
    cov = sum((a - pm) * (b - qm) for a, b in zip(p, q))
    rho = cov / math.sqrt(sum((a - pm) ** 2 for a in p) * sum((b - qm) ** 2 for b in q))
    assert out["mismatch/prob_pearson"] == pytest.approx(rho, abs=1e-6)
    assert 0.9 < rho < 1.0


def test_identical_logps_are_a_perfect_match():
    mu = torch.log(torch.rand(3, 5, generator=torch.Generator().manual_seed(0)))
    out = mismatch_metrics(mu, mu.clone(), torch.ones(3, 5, dtype=torch.bool))
    for name in [
        "k1",
        "k2",
        "k3",
        "abs_dlogp_mean",
        "abs_dlogp_max",
        "abs_dp_mean",
        "abs_dp_max",
        "seq_logratio_mean",
        "seq_logratio_std",
        "seq_logratio_slope_per_1k",
    ]:
        assert out[f"mismatch/{name}"] == 0.0, name
    assert out["mismatch/prob_pearson"] == pytest.approx(1.0)
    assert out["mismatch/is_mean"] == out["mismatch/ess"] == 1.0


def test_slope_recovers_a_linear_drift():
    # every token drifts by +0.002, rows of length 1..4 → s = 0.002·L → slope 2 per 1k tokens
    T = 4
    mask = torch.tensor([[t < L for t in range(T)] for L in (1, 2, 3, 4)])
    mu = torch.full((4, T), -1.0, dtype=torch.float64)
    out = mismatch_metrics(mu, mu + 0.002, mask)
    assert out["mismatch/seq_logratio_slope_per_1k"] == pytest.approx(2.0, rel=1e-9)
    assert out["mismatch/k1"] == pytest.approx(-0.002, rel=1e-9)


@pytest.mark.parametrize("mask", [torch.zeros(2, 3, dtype=torch.bool), None])
def test_all_masked_or_empty_is_zero_not_nan(mask):
    if mask is None:  # B·T == 0
        out = mismatch_metrics(torch.zeros(0, 0), torch.zeros(0, 0), torch.zeros(0, 0, dtype=torch.bool))
    else:
        out = mismatch_metrics(MU, PI, mask)
    assert all(v == 0.0 for v in out.values()), out
    h = dlogp_histogram(MU, PI, torch.zeros(2, 3, dtype=torch.bool))
    assert h["n"] == 0 and sum(h["counts"]) == 0


def test_empty_row_does_not_count_as_a_sequence():
    mask = MASK.clone()
    mu = torch.cat([MU, torch.zeros(1, 3)])
    pi = torch.cat([PI, torch.ones(1, 3)])
    out = mismatch_metrics(mu, pi, torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)]))
    assert out == mismatch_metrics(MU, PI, MASK)


def test_single_token_and_single_row_never_nan():
    out = mismatch_metrics(torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), torch.tensor([[True]]))
    assert not any(math.isnan(v) for v in out.values())
    assert out["mismatch/seq_logratio_std"] == 0.0
    assert out["mismatch/seq_logratio_slope_per_1k"] == 0.0  # one length: slope undefined → 0
    assert out["mismatch/prob_pearson"] == 0.0  # zero variance and p ≠ q
    assert out["mismatch/k1"] == pytest.approx(0.5)
    out = mismatch_metrics(torch.tensor([[-1.0]]), torch.tensor([[-1.0]]), torch.tensor([[True]]))
    assert out["mismatch/prob_pearson"] == 1.0  # zero variance and p == q


def test_nonfinite_unmasked_tokens_are_counted_and_excluded():
    mu = MU.clone()
    mu[0, 1] = -float("inf")  # a completion token the rollout gave zero probability
    out = mismatch_metrics(mu, PI, MASK)
    assert out["mismatch/nonfinite_tokens"] == 1.0
    assert out["mismatch/tokens"] == 2.0
    assert out["mismatch/k1"] == pytest.approx(-(-0.1 + 0.2) / 2, abs=1e-6)
    assert not any(math.isnan(v) for v in out.values())


def test_huge_log_ratio_does_not_overflow():
    out = mismatch_metrics(
        torch.tensor([[-1000.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2, dtype=torch.bool)
    )
    assert all(math.isfinite(v) for v in out.values())
    assert out["mismatch/k1"] == pytest.approx(-999.0 / 2)
    assert out["mismatch/k3"] == pytest.approx((math.exp(20) - 21) / 2)  # clamped at |Δ| = 20


def test_inputs_with_grad_and_bf16_are_accepted():
    mu = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    pi = torch.tensor([[-1.0, -2.5]], requires_grad=True)
    out = mismatch_metrics(mu, pi, torch.ones(1, 2))
    assert out["mismatch/k1"] == pytest.approx(0.25)
    assert pi.grad is None


def test_histogram_hand_counts():
    mu = torch.zeros(1, 8, dtype=torch.float64)
    delta = torch.tensor([[0.0, 1e-9, 1e-8, -1e-8, 2e-3, -2e-3, 10.0, -0.5]], dtype=torch.float64)
    mask = torch.ones(1, 8, dtype=torch.bool)
    mask[0, 7] = False
    h = dlogp_histogram(mu, mu + delta, mask)
    json.dumps(h)  # JSON-serialisable
    assert h["edges"] == HIST_EDGES and len(h["edges"]) == 37 and len(h["counts"]) == 36
    assert h["edges"][0] == 1e-8 and h["edges"][-1] == pytest.approx(10.0)
    assert h["n"] == 7 and h["zero"] == 1 and h["under"] == 1 and h["over"] == 1
    assert h["counts"][0] == 2 and h["counts_pos"][0] == 1 and h["counts_neg"][0] == 1  # ±1e-8
    # 2e-3: log10 = −2.70 → bin floor((−2.70 + 8)·4) = 21, i.e. [10^−2.75, 10^−2.5)
    assert h["counts"][21] == 2 and h["counts_pos"][21] == 1 and h["counts_neg"][21] == 1
    assert sum(h["counts"]) == 4
    assert h["zero"] + h["under"] + sum(h["counts"]) + h["over"] == h["n"]


# ---- edges: correlation bounds, shapes, NaN, the far side of the clamp, histogram boundaries ---------


def _seeded_mu(seed):
    return -3 * torch.rand(1, 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_pearson_stays_within_minus_one_and_one():
    """p = e^0.5·q is perfectly correlated and p = 1 − q perfectly anti-correlated; for these seeds the
    float64 quotient lands one ulp outside [−1, 1] and must be clamped back."""
    mu = _seeded_mu(0)
    assert mismatch_metrics(mu, mu + 0.5, None)["mismatch/prob_pearson"] == 1.0
    mu = _seeded_mu(8)
    assert mismatch_metrics(mu, torch.log1p(-torch.exp(mu)), None)["mismatch/prob_pearson"] == -1.0


def test_pearson_when_one_side_is_constant():
    """Zero variance on either side (but not both): no correlation to speak of, 0.0 (p ≠ q)."""
    varied = torch.log(torch.tensor([[0.2, 0.4, 0.6]], dtype=torch.float64))
    flat = torch.log(torch.full((1, 3), 0.5, dtype=torch.float64))
    assert mismatch_metrics(flat, varied, None)["mismatch/prob_pearson"] == 0.0  # μ constant
    assert mismatch_metrics(varied, flat, None)["mismatch/prob_pearson"] == 0.0  # π constant


def test_no_mask_means_every_token_and_a_single_row_may_be_1d():
    out = mismatch_metrics(MU[:1, :2], PI[:1, :2], None)
    assert out["mismatch/tokens"] == 2.0 and out["mismatch/k1"] == pytest.approx(0.05, abs=1e-6)
    assert mismatch_metrics(MU[0, :2], PI[0, :2], None) == out  # [T] is one sequence
    assert mismatch_metrics(MU[0], PI[0], MASK[0]) == mismatch_metrics(MU[:1], PI[:1], MASK[:1])


def test_shape_mistakes_are_named():
    with pytest.raises(ValueError) as err:
        mismatch_metrics(torch.zeros(2, 3), torch.zeros(2, 4), None)
    assert str(err.value) == "rollout_logps (2, 3) and train_logps (2, 4) differ in shape"
    with pytest.raises(ValueError) as err:
        mismatch_metrics(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3, 2))
    assert str(err.value) == "mask (3, 2) does not match log-probs (2, 3)"


@pytest.mark.parametrize("side", ["mu", "pi"])
def test_a_nan_on_either_side_makes_every_estimate_nan(side):
    """A NaN log-prob is a broken side, not a missing token: the estimates are NaN (never a calm 0.0)
    and the token is counted as non-finite."""
    mu, pi = MU.clone(), PI.clone()
    (mu if side == "mu" else pi)[0, 1] = float("nan")
    out = mismatch_metrics(mu, pi, MASK)
    assert out["mismatch/nonfinite_tokens"] == 1.0
    assert math.isnan(out["mismatch/k1"]) and math.isnan(out["mismatch/k3"])


def test_large_negative_log_ratio_is_clamped_too():
    """Δ = −999 (π gives the token e^−999 of μ's probability): k3 uses Δ clamped at −20."""
    out = mismatch_metrics(
        torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1000.0, -1.0]]), torch.ones(1, 2, dtype=torch.bool)
    )
    assert out["mismatch/k1"] == pytest.approx(999.0 / 2)
    assert out["mismatch/k3"] == pytest.approx((math.expm1(-20.0) + 20.0) / 2, rel=1e-12)
    assert out["mismatch/is_min"] == pytest.approx(math.exp(-20.0), rel=1e-12)


def test_histogram_edges_are_exact_and_sides_are_counted_apart():
    """Δ = π − μ exactly on several edges (μ = 0 there) falls in the bin the edge opens; with μ = −0.75:
    Δ = 10 (the last edge) is over, 7 is in the last bin, and 1.5e-3 twice positive, once negative."""
    picks = [0, 5, 11, 22, 30, 35]
    rest = [10.0, 7.0, 1.5e-3, 1.5e-3, -1.5e-3]
    mu = torch.tensor([[0.0] * len(picks) + [-0.75] * len(rest)], dtype=torch.float64)
    pi = mu + torch.tensor([[HIST_EDGES[i] for i in picks] + rest], dtype=torch.float64)
    d = (pi - mu)[0].tolist()
    assert d[: len(picks)] == [HIST_EDGES[i] for i in picks] and d[-5:-3] == [10.0, 7.0]
    h = dlogp_histogram(mu, pi, None)
    want = [0] * 36
    for i in picks + [35, 20, 20, 20]:  # 7 → bin 35; 1.5e-3 → bin 20 = [1e-3, 10^-2.75)
        want[i] += 1
    assert h["counts"] == want and h["over"] == 1 and h["n"] == 11 and h["zero"] == h["under"] == 0
    assert h["counts_pos"][20] == 2 and h["counts_neg"][20] == 1
    assert sum(h["counts_pos"]) == 9 and sum(h["counts_neg"]) == 1


# ---- the split by policy lag (rollout.async_mode = one_step / in_flight) --------------------------------
def test_lag_split_hand_computed():
    """lag_metrics' docstring example, with one padded position (junk lag and log-probs) the mask hides."""
    from grpo_studio.engine.precision.mismatch import LAG_NAMES, lag_metrics

    mu, pi = torch.tensor([[-1.0, -2.0, -0.5, 9.0]]), torch.tensor([[-1.1, -2.0, -0.3, -9.0]])
    lags, mask = torch.tensor([[0, 1, 2, 7]]), torch.tensor([[1, 1, 1, 0]])
    out = lag_metrics(mu, pi, mask, lags)
    d0, d2 = float(torch.tensor(-1.1) - torch.tensor(-1.0)), float(torch.tensor(-0.3) - torch.tensor(-0.5))
    assert list(out) == list(LAG_NAMES)
    assert (out["policy/token_lag_mean"], out["policy/token_lag_max"]) == (1.0, 2.0)
    assert out["mismatch/lagged_frac"] == approx(2 / 3)
    assert out["mismatch/lag0/abs_dlogp_mean"] == approx(abs(d0))
    assert out["mismatch/lag0/k3"] == approx(math.expm1(d0) - d0)
    assert out["mismatch/lagged/abs_dlogp_mean"] == approx(abs(d2) / 2)
    assert out["mismatch/lagged/k3"] == approx((math.expm1(d2) - d2) / 2)


def test_lag_split_without_lagged_tokens_leaves_that_part_out_and_the_whole_k3_at_lag_0():
    from grpo_studio.engine.precision.mismatch import LAG_NAMES, lag_metrics

    out = lag_metrics(MU, PI, MASK, torch.zeros(2, 3, dtype=torch.long))
    whole = mismatch_metrics(MU, PI, MASK)
    assert out["mismatch/lag0/k3"] == whole["mismatch/k3"] and out["mismatch/lagged_frac"] == 0.0
    assert set(LAG_NAMES) - set(out) == {"mismatch/lagged/k3", "mismatch/lagged/abs_dlogp_mean"}
    assert (
        lag_metrics(MU, PI, MASK, torch.ones(2, 3, dtype=torch.long))
        .keys()
        .isdisjoint({"mismatch/lag0/k3", "mismatch/lag0/abs_dlogp_mean"})
    )
    assert lag_metrics(MU, PI, torch.zeros_like(MASK), torch.zeros(2, 3)) == {}


def test_lag_counts_and_their_merge_across_ranks():
    from grpo_studio.engine.precision.mismatch import lag_counts, merge_lag_counts

    counts = lag_counts(torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]), torch.tensor([[0, 1, 1, 5], [2, 9, 9, 9]]))
    assert counts == {"0": 1, "1": 2, "2": 1}
    assert merge_lag_counts([counts, {"0": 3, "10": 1}]) == {"0": 4, "1": 2, "2": 1, "10": 1}
    assert json.loads(json.dumps(counts)) == counts
