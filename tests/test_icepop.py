"""IcePop (Ring-1T, "Every Step Evolves", arXiv 2510.18855): rollout correction with a floor, algo.is_floor.

The paper's objective, with ρ_t = π_old(y_t)/μ(y_t) and M(ρ) = ρ·1[α ≤ ρ ≤ β]:
    J = (1/G) Σ_i (1/|y_i|) Σ_t M(ρ_t) · min(r_t·Â_i, clip(r_t, 1−ε, 1+ε)·Â_i)
Masked tokens stay in the normaliser |y_i|. The `icepop` preset is that: token level, mask mode,
[α, β] = [is_floor, is_cap] = [0.5, 5], loss_type grpo (each completion's token mean, then the mean).

Hand example (π_θ = π_old, so r = 1 and d loss / d log π_t = −M(ρ_t)·Â_i / (|y_i|·G)):
    seq 1: 5 tokens, π_old = [0.1, 0.3, 0.5, 0.4, 0.6], μ = [0.4, 0.5, 0.5, 0.1, 0.1]
           ρ = [0.25, 0.6, 1, 4, 6]  → M = [0, 0.6, 1, 4, 0],  Â = +1.5
    seq 2: 2 tokens (3 padding), π_old = [0.2, 0.8], μ = [0.5, 0.4]
           ρ = [0.4, 2]              → M = [0, 2],              Â = −1
    loss = ½ (−1.5·5.6/5 + 1·2/2) = ½ (−1.68 + 1) = −0.34
    grad seq 1 = −1.5·M/10 = [0, −0.09, −0.15, −0.6, 0];  seq 2 = +M/4 = [0, 0.5]
    mismatch/masked_frac = 3 of 7 completion tokens (0.25, 6 and 0.4).
"""

from __future__ import annotations

import math

import pytest
import torch

# the TRL-oracle harness of the loss parity tests (TRL 1.16's own code, executed on our tensors)
from test_losses_trl_parity import LOSS_TYPES, assert_parity, data  # noqa: F401

from grpo_studio.contract import algorithms, config
from grpo_studio.contract.config import AlgoConfig
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.train.losses import LossInputs, policy_loss, rollout_correction

TOL = 1e-12
FRAC = 1e-7  # mismatch/masked_frac is a float32 mean


def icepop(**overrides) -> AlgoConfig:
    algo = AlgoConfig(name="icepop")
    for key, value in {**algorithms.defaults("icepop"), **{f"algo.{k}": v for k, v in overrides.items()}}.items():
        setattr(algo, key.split(".", 1)[1], value)
    return algo


def example() -> LossInputs:
    dt = torch.float64
    old = torch.tensor([[0.1, 0.3, 0.5, 0.4, 0.6], [0.2, 0.8, 0.5, 0.5, 0.5]], dtype=dt).log()
    mu = torch.tensor([[0.4, 0.5, 0.5, 0.1, 0.1], [0.5, 0.4, 0.9, 0.9, 0.9]], dtype=dt).log()  # padding μ unused
    return LossInputs(
        logps=old.clone().requires_grad_(True),
        old_logps=old,
        advantages=torch.tensor([1.5, -1.0], dtype=dt),
        mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=dt),
        rollout_logps=mu,
    )


def test_the_preset_is_the_papers_band_at_token_level():
    algo = icepop()
    assert (algo.is_level, algo.is_mode, algo.is_floor, algo.is_cap, algo.loss_type) == (
        "token",
        "mask",
        0.5,
        5.0,
        "grpo",
    )
    assert config.load("tiny-arith", ["algo.name=icepop"]).algo.is_floor == 0.5


def test_loss_gradient_and_masked_frac_by_hand():
    inp = example()
    loss, metrics = policy_loss(inp, icepop(), max_completion_len=5)
    loss.backward()
    assert loss.item() == pytest.approx(-0.34, abs=TOL)
    expected = torch.tensor([[0, -0.09, -0.15, -0.6, 0], [0, 0.5, 0, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(inp.logps.grad, expected, atol=TOL, rtol=0)
    assert metrics["mismatch/masked_frac"] == pytest.approx(3 / 7, abs=FRAC)
    assert (metrics["mismatch/is_min"], metrics["mismatch/is_max"]) == pytest.approx((0.25, 6.0), abs=TOL)


def test_without_the_floor_it_is_mis_and_the_low_tokens_train():
    """is_floor = 0 is the one-sided MIS mask: the tokens at ρ = 0.25 and 0.4 are weighted, not masked."""
    inp = example()
    loss, metrics = policy_loss(inp, icepop(is_floor=0.0), max_completion_len=5)
    assert loss.item() == pytest.approx(0.5 * (-1.5 * 5.85 / 5 + 2.4 / 2), abs=TOL)
    assert metrics["mismatch/masked_frac"] == pytest.approx(1 / 7, abs=FRAC)


def test_truncate_with_a_floor_clamps_into_the_band():
    """TRL's *_truncate with clip_min: w = clamp(ρ, floor, cap); outside the band counts as truncated."""
    inp = example()
    w, metrics = rollout_correction(inp.old_logps, inp.rollout_logps, inp.mask, "token", "truncate", 5.0, 0.5)
    assert w[0].tolist() == pytest.approx([0.5, 0.6, 1.0, 4.0, 5.0], abs=TOL)
    assert w[1, :2].tolist() == pytest.approx([0.5, 2.0], abs=TOL)
    assert metrics["mismatch/masked_frac"] == pytest.approx(3 / 7, abs=FRAC)


def test_sequence_level_band_masks_whole_sequences():
    """ρ = Π_t ρ_t: seq 1 = 0.25·0.6·1·4·6 = 3.6, seq 2 = 0.4·2 = 0.8; a floor of 0.9 masks seq 2 only."""
    inp = example()
    w, metrics = rollout_correction(inp.old_logps, inp.rollout_logps, inp.mask, "sequence", "mask", 5.0, 0.9)
    assert w.flatten().tolist() == pytest.approx([3.6, 0.0], abs=TOL)
    assert metrics["mismatch/masked_frac"] == 0.5


# ---- parity ------------------------------------------------------------------------------------------


def verl_clip_mode(old_log_prob, rollout_log_prob, response_mask, lower, upper):
    """verl PR #3694 (commit 21271aab), rollout_is_mode = "clip" at token level, written out:
        rollout_is_weights = exp(old_log_prob − rollout_log_prob)
        clip_mask = (rollout_is_weights >= lower_threshold) & (rollout_is_weights <= upper_threshold)
        rollout_is_weights = rollout_is_weights * clip_mask
    AReaL's action = "mask" (areal/utils/functional/functional.py) is the same weight:
        behave_imp_weight = where((ρ >= lower) & (ρ <= upper), ρ, 0), the normaliser the original token count."""
    rollout_is_weights = torch.exp(old_log_prob - rollout_log_prob)
    clip_mask = (rollout_is_weights >= lower) & (rollout_is_weights <= upper)
    return rollout_is_weights * clip_mask * response_mask


def test_weights_are_verls_clip_mode_and_areals_mask(data):  # noqa: F811
    ours, _ = rollout_correction(data["old_logps"], data["rollout_logps"], data["mask"], "token", "mask", 1.25, 0.8)
    theirs = verl_clip_mode(data["old_logps"], data["rollout_logps"], data["mask"], 0.8, 1.25)
    torch.testing.assert_close(ours * data["mask"], theirs, atol=TOL, rtol=0)


BANDS = {"token": (0.8, 1.25), "sequence": (0.5, 2.0)}  # each binds on both sides of the fixture's ratios


@pytest.mark.parametrize("mode", ["mask", "truncate"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_and_gradient_are_trls_with_clip_min(data, loss_type, level, mode):  # noqa: F811
    """TRL 1.16's vllm_importance_sampling_clip_min / clip_max are is_floor / is_cap, for both modes."""
    floor, cap = BANDS[level]
    log_rho = ((data["old_logps"] - data["rollout_logps"]) * data["mask"]).sum(-1) if level == "sequence" else None
    if log_rho is not None:  # the band must bind on both sides, or the test could not tell the floor from none
        assert (log_rho < math.log(floor)).any() and (log_rho > math.log(cap)).any()
    algo = AlgoConfig(loss_type=loss_type, is_level=level, is_mode=mode, is_floor=floor, is_cap=cap)
    metrics = assert_parity(
        data, algo, dict(loss_type=loss_type, is_mode=f"{level}_{mode}", is_cap=cap, is_floor=floor)
    )
    assert 0 < metrics["mismatch/masked_frac"] < 1


# ---- config: one line each ---------------------------------------------------------------------------


def refused(*sets: str) -> str:
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", list(sets))
    return str(err.value)


def test_a_floor_at_or_above_the_cap_is_refused():
    assert refused("algo.name=icepop", "algo.is_cap=0.5") == (
        "config error: algo.is_floor = 0.5: must be below algo.is_cap = 0.5: the band [algo.is_floor, "
        "algo.is_cap] a ratio is kept in would be empty"
    )
    assert refused("algo.is_level=token", "algo.is_floor=1.5") == "config error: algo.is_floor = 1.5: must be <= 1"
    assert refused("algo.is_level=token", "algo.is_floor=-0.1") == "config error: algo.is_floor = -0.1: must be >= 0"


def test_a_floor_without_rollout_correction_is_refused():
    assert refused("algo.is_floor=0.5") == (
        "config error: algo.is_floor = 0.5: has no effect with algo.is_level = 'auto' (none for the hf rollout): "
        "no rollout correction runs; set algo.is_level = 'token' (IcePop) or 'sequence', or leave this at 0"
    )
    assert "algo.is_level = 'none': no rollout correction" in refused("algo.name=icepop", "algo.is_level=none")


def test_icepop_is_a_preset_not_a_mode():
    """IcePop is the mask mode with a floor (as TRL 1.16's token_mask with clip_min), named by algo.name."""
    assert refused("algo.is_mode=icepop") == "config error: algo.is_mode = 'icepop': allowed: truncate, mask"
