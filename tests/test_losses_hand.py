"""Precision-RL presets TRL lacks (arXiv 2510.26788), checked against hand computation, and the
one-line config errors of the loss knobs.

The shared 2-sequence example (loss_type dapo, as the presets set it: token sum / active tokens):

    seq 1: 2 tokens, π_θ = π_old = [0.5, 0.5]  μ = [1/3, 0.5]  → π(y)=1/4, μ(y)=1/6, ρ1 = 1.5,  A1 = +1
    seq 2: 1 token (2nd is padding), π = [0.8], μ = [0.05]      → ρ2 = 0.8/0.05 = 16,         A2 = -0.5
    active tokens N = 3;  log 0.5 = -0.693147, log 0.8 = -0.223144

pg objective, per-token loss  -w·A·log π_t, summed and divided by N:
    seq 1 contributes  -w1·1·(2·log 0.5)     = 1.386294·w1
    seq 2 contributes  -w2·(-0.5)·log 0.8    = -0.111572·w2
    d loss / d log π_t = -w·A/N:  seq 1 tokens -w1/3, seq 2 token +w2/6, padding 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_studio.contract import algorithms
from grpo_studio.contract.config import AlgoConfig, load
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.train.losses import LossInputs, policy_loss

TOL = 1e-6
L05, L08 = math.log(0.5), math.log(0.8)


def preset(name: str, **overrides) -> AlgoConfig:
    algo = AlgoConfig(name=name)
    for key, value in algorithms.defaults(name).items():
        setattr(algo, key.split(".", 1)[1], value)
    for key, value in overrides.items():
        setattr(algo, key, value)
    return algo


def example(theta_ratio=(1.0, 1.0, 1.0), old_shift=0.0):
    """Tensors of the docstring example; π_θ = π_old · theta_ratio per active token."""
    dt = torch.float64
    old = torch.tensor([[L05, L05], [L08, math.log(0.3)]], dtype=dt) + old_shift
    r = torch.tensor([[theta_ratio[0], theta_ratio[1]], [theta_ratio[2], 1.0]], dtype=dt)
    logps = (old - old_shift + r.log()).clone().requires_grad_(True)
    mu = torch.tensor([[math.log(1 / 3), L05], [math.log(0.05), math.log(0.9)]], dtype=dt)  # padding μ unused
    inp = LossInputs(
        logps=logps,
        old_logps=old,
        advantages=torch.tensor([1.0, -0.5], dtype=dt),
        mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=dt),
        rollout_logps=mu,
    )
    return inp


def run(algo, inp):
    loss, metrics = policy_loss(inp, algo, max_completion_len=2)
    loss.backward()
    return loss.item(), inp.logps.grad, metrics


def test_pg_seq_is():
    """w = sg(π_θ(y)/μ(y)) = [1.5, 16], uncapped.
    loss = (1.386294·1.5 - 0.111572·16)/3 = (2.079442 - 1.785148)/3 = 0.098098
    grad = [[-1.5/3, -1.5/3], [16/6, 0]] = [[-0.5, -0.5], [2.666667, 0]]
    ESS = (1.5+16)² / (2·(1.5²+16²)) = 306.25/516.5 = 0.592933."""
    loss, grad, m = run(preset("pg_seq_is"), example())
    assert loss == pytest.approx(0.098098, abs=TOL)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -0.5], [8 / 3, 0.0]], dtype=grad.dtype), atol=TOL, rtol=0)
    assert (m["mismatch/is_min"], m["mismatch/is_max"]) == (pytest.approx(1.5), pytest.approx(16.0))
    assert m["mismatch/is_mean"] == pytest.approx(8.75) and m["mismatch/masked_frac"] == 0.0
    assert m["mismatch/ess"] == pytest.approx(306.25 / 516.5, abs=TOL)


def test_pg_weight_is_pi_theta_over_mu_not_pi_old():
    """The pg objective has no π_old term: shifting π_old changes nothing (w = sg(π_θ/μ))."""
    base, _, _ = run(preset("pg_seq_is"), example())
    shifted, _, _ = run(preset("pg_seq_is"), example(old_shift=0.3))
    assert shifted == pytest.approx(base, abs=TOL)


def test_pg_seq_tis():
    """w = min(ρ, 2) = [1.5, 2].
    loss = (2.079442 - 0.111572·2)/3 = 1.856298/3 = 0.618766;  grad = [[-0.5, -0.5], [2/6, 0]]."""
    loss, grad, m = run(preset("pg_seq_tis"), example())
    assert loss == pytest.approx(0.618766, abs=TOL)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -0.5], [1 / 3, 0.0]], dtype=grad.dtype), atol=TOL, rtol=0)
    assert m["mismatch/masked_frac"] == 0.5  # seq 2 truncated
    assert m["mismatch/ess"] == pytest.approx(3.5**2 / (2 * (1.5**2 + 4)), abs=TOL)


def test_pg_seq_mis():
    """w = ρ·1[ρ ≤ 10] = [1.5, 0]: seq 2 is dropped.
    loss = 2.079442/3 = 0.693147 (= ln 2);  grad = [[-0.5, -0.5], [0, 0]];  ESS = 1.5²/(2·1.5²) = 0.5."""
    loss, grad, m = run(preset("pg_seq_mis"), example())
    assert loss == pytest.approx(math.log(2), abs=TOL)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -0.5], [0.0, 0.0]], dtype=grad.dtype), atol=TOL, rtol=0)
    assert m["mismatch/masked_frac"] == 0.5 and m["mismatch/ess"] == pytest.approx(0.5)


def test_ppo_seq_mis():
    """PPO against π_old with r = π_θ/π_old = [1.1, 1.3] (seq 1), [0.7] (seq 2); ε = 0.2;
    ρ = π_old(y)/μ(y) = [1.5, 16], C = 10 → weights [1.5, 0].
    seq 1, A=+1: t1 -min(1.1, 1.1) = -1.1; t2 -min(1.3, clip 1.2) = -1.2 (clipped)
    seq 2, A=-0.5: -min(-0.35, -0.4) = 0.4, times weight 0.
    loss = 1.5·(-1.1 - 1.2)/3 = -1.15
    grad: t1 -1.5·A·r/3 = -1.5·1.1/3 = -0.55; t2 clipped → 0; seq 2 masked → 0."""
    algo = preset("ppo_seq_mis")
    loss, grad, m = run(algo, example(theta_ratio=(1.1, 1.3, 0.7)))
    assert loss == pytest.approx(-1.15, abs=TOL)
    torch.testing.assert_close(grad, torch.tensor([[-0.55, 0.0], [0.0, 0.0]], dtype=grad.dtype), atol=TOL, rtol=0)
    # clip metrics over the 3 active tokens: t2 of seq 1 (high), seq 2 (low)
    assert m["clip/high"] == pytest.approx(1 / 3) and m["clip/low"] == pytest.approx(1 / 3)
    assert m["clip/region"] == pytest.approx(2 / 3)


def test_ppo_ignores_mu():
    """The ppo preset has is_level none: μ does not enter the loss, and no mismatch/is_* metrics.
    Same per-token PPO terms as test_ppo_seq_mis without weights: (-1.1 - 1.2 + 0.4)/3 = -0.633333."""
    loss, _, m = run(preset("ppo"), example(theta_ratio=(1.1, 1.3, 0.7)))
    assert loss == pytest.approx((-1.1 - 1.2 + 0.4) / 3, abs=TOL)
    assert not any(k.startswith("mismatch/") for k in m)


# --- config resolution and one-line errors -------------------------------------------------------------------


def _one_line_error(overrides) -> str:
    with pytest.raises(UserError) as err:
        load(None, overrides)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_mask_without_cap_is_a_config_error():
    msg = _one_line_error(["algo.is_level=sequence", "algo.is_mode=mask", "algo.is_cap=0"])
    assert msg == "config error: algo.is_cap = 0: algo.is_mode = 'mask' needs a cap > 0 (e.g. 10.0)"


def test_dr_grpo_without_max_completion_len_is_a_config_error():
    msg = _one_line_error(["algo.name=dr_grpo", "rollout.max_completion_len=0"])
    assert "rollout.max_completion_len" in msg
    inp = example()
    with pytest.raises(UserError, match="dr_grpo.*max_completion_len"):
        policy_loss(inp, AlgoConfig(loss_type="dr_grpo"), max_completion_len=0)


def test_unknown_algo_name_is_a_config_error():
    msg = _one_line_error(["algo.name=ppo_seq_tiss"])
    assert "algo.name" in msg and "did you mean 'ppo_seq_tis'" in msg


def test_delta_below_clip_range_is_a_config_error():
    msg = _one_line_error(["algo.delta=1.1"])
    assert "algo.delta" in msg and "epsilon_high" in msg


def test_preset_fills_defaults_and_explicit_keys_win():
    cfg = load(None, ["algo.name=ppo_seq_mis", "algo.is_cap=5"])
    assert (cfg.algo.is_level, cfg.algo.is_mode, cfg.algo.is_cap) == ("sequence", "mask", 5.0)
    assert load(None, ["algo.name=pg_seq_is"]).algo.objective == "pg"
    assert load(None, ["algo.name=dapo"]).algo.epsilon_high == 0.28
    assert load(None, ["algo.name=gspo"]).algo.importance_sampling_level == "sequence"


def test_every_preset_resolves_to_a_valid_config():
    for name in algorithms.PRESETS:
        cfg = load(None, [f"algo.name={name}"])
        assert cfg.algo.name == name


# ---- edges the parity data does not reach, by hand ------------------------------------------------


def flat(logps, old, adv, mask, mu=None, ref=None):
    dt = torch.float64
    return LossInputs(
        logps=torch.tensor(logps, dtype=dt, requires_grad=True),
        old_logps=torch.tensor(old, dtype=dt),
        advantages=torch.tensor(adv, dtype=dt),
        mask=torch.tensor(mask, dtype=dt),
        rollout_logps=None if mu is None else torch.tensor(mu, dtype=dt),
        ref_logps=None if ref is None else torch.tensor(ref, dtype=dt),
    )


def test_clip_metrics_count_strictly_outside_the_range_and_by_the_sign_of_the_advantage():
    """ratios exp(±log 1.25) = 1.25 / 0.8 and exactly 1 ± ε (ε = 0.25: 0.75 and 1.25 are exact in
    binary), advantages -1, 0, +0.5, +2: low = r < 1-ε with A < 0, high = r > 1+ε with A > 0 (TRL)."""
    up, down = math.log(1.5), math.log(0.5)
    edge_hi, edge_lo = math.log(1.25), math.log(0.75)
    assert math.exp(edge_hi) == 1.25 and math.exp(edge_lo) == 0.75  # the boundaries are hit exactly
    inp = flat(
        logps=[[down, edge_lo, 0.0], [down, up, 0.0], [up, edge_hi, down], [up, down, 0.0]],
        old=[[0.0] * 3] * 4,
        adv=[-1.0, 0.0, 0.5, 2.0],
        mask=[[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 0]],
    )
    _, m = policy_loss(inp, AlgoConfig(loss_type="bnpo", epsilon=0.25, epsilon_high=0.25), max_completion_len=3)
    # 9 active tokens; low: row 0 token 0 (0.5 < 0.75, A < 0); 0.75 itself is not below. Row 1 has A = 0.
    # high: row 2 token 0 (1.5, A = 0.5 > 0) and row 3 token 0 (1.5, A = 2); 1.25 itself is not above.
    assert m["clip/low"] == pytest.approx(1 / 9, abs=1e-12)
    assert m["clip/high"] == pytest.approx(2 / 9, abs=1e-12)
    assert m["clip/region"] == pytest.approx(3 / 9, abs=1e-12)


@pytest.mark.parametrize("name", ["pg_seq_is", "pg_seq_tis", "pg_seq_mis"])
def test_pg_objective_reports_no_clipping(name):
    _, _, m = run(preset(name), example(theta_ratio=(2.0, 0.1, 3.0)))
    assert (m["clip/low"], m["clip/high"], m["clip/region"]) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("loss_type, want", [("bnpo", 3.0), ("dapo", 3.0), ("grpo", 3.0), ("dr_grpo", 3.0 / 2)])
def test_one_active_token_is_not_averaged_away(loss_type, want):
    """A batch whose only active token has loss 3 (A = -3, log π = 1 with π_old = π): bnpo/dapo divide by
    the 1 active token, grpo by that row's 1 token, dr_grpo by B·L_max = 1·2; masked means likewise."""
    inp = flat(logps=[[1.0, 0.5]], old=[[1.0, 0.5]], adv=[-3.0], mask=[[1, 0]])
    inp.entropy = torch.tensor([[0.7, 9.0]], dtype=torch.float64)
    loss, m = policy_loss(inp, AlgoConfig(loss_type=loss_type, objective="pg"), max_completion_len=2)
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert m["entropy"] == pytest.approx(0.7, abs=1e-12)


def test_dapo_divides_by_the_generation_batch_tokens_even_when_it_is_one():
    inp = flat(logps=[[1.0, 0.5]], old=[[1.0, 0.5]], adv=[-3.0], mask=[[1, 1]])
    loss, _ = policy_loss(inp, AlgoConfig(loss_type="dapo", objective="pg"), max_completion_len=2, num_items_in_batch=1)
    assert loss.item() == pytest.approx(3.0 * 1.5, abs=1e-12)


@pytest.mark.parametrize("length", [0, None])
def test_dr_grpo_needs_a_positive_max_completion_len(length):
    inp = flat(logps=[[1.0]], old=[[1.0]], adv=[1.0], mask=[[1]])
    with pytest.raises(UserError) as err:
        policy_loss(inp, AlgoConfig(loss_type="dr_grpo"), max_completion_len=length)
    assert str(err.value) == "config error: algo.loss_type = 'dr_grpo' needs rollout.max_completion_len > 0"
    loss, _ = policy_loss(
        flat(logps=[[2.0]], old=[[2.0]], adv=[-1.0], mask=[[1]]),
        AlgoConfig(loss_type="dr_grpo", objective="pg"),
        max_completion_len=1,
    )
    assert loss.item() == pytest.approx(2.0, abs=1e-12)  # L_max = 1 is fine: 2 / (1·1)


def test_unknown_loss_type_and_objective_are_one_line_config_errors():
    inp = flat(logps=[[1.0]], old=[[1.0]], adv=[1.0], mask=[[1]])
    with pytest.raises(UserError) as err:
        policy_loss(inp, AlgoConfig(loss_type="dapa"), max_completion_len=1)
    assert (
        str(err.value)
        == "config error: algo.loss_type = 'dapa': allowed: grpo, bnpo, dr_grpo, dapo (did you mean 'dapo'?)"
    )
    with pytest.raises(UserError) as err:
        policy_loss(inp, AlgoConfig(objective="pgg"), max_completion_len=1)
    assert str(err.value) == "config error: algo.objective = 'pgg': allowed: ppo, pg (did you mean 'pg'?)"


def test_missing_inputs_say_what_is_missing():
    inp = flat(logps=[[1.0]], old=[[1.0]], adv=[1.0], mask=[[1]])
    with pytest.raises(ValueError) as err:
        policy_loss(inp, AlgoConfig(is_level="token", is_cap=2.0), max_completion_len=1)
    assert str(err.value) == "algo.is_level = 'token' needs rollout_logps (μ) from the sampler"
    with pytest.raises(ValueError) as err:
        policy_loss(inp, AlgoConfig(beta=0.1), max_completion_len=1)
    assert str(err.value) == "algo.beta > 0 needs ref_logps from the reference policy"
    with pytest.raises(ValueError) as err:
        rollout_correction(inp.old_logps, inp.old_logps, inp.mask, "token", "clip", 2.0)
    assert str(err.value) == "algo.is_mode = 'clip': allowed: truncate, mask"


def test_the_loss_is_computed_in_the_log_prob_dtype():
    """float32 log-probs with float64 mask and advantages (as a caller may hold them): the loss is float32
    and equal to the all-float32 computation."""
    g = torch.Generator().manual_seed(3)
    logps = -torch.rand(3, 4, generator=g)
    old = logps + 0.3 * torch.randn(3, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    algo = AlgoConfig(loss_type="bnpo")
    mixed, _ = policy_loss(LossInputs(logps, old, adv, mask), algo, 4)
    pure, _ = policy_loss(LossInputs(logps, old, adv.float(), mask.float()), algo, 4)
    assert mixed.dtype == torch.float32 and torch.equal(mixed, pure)


# ---- rollout correction (IS against μ): weights and metrics by hand ---------------------------------

from grpo_studio.engine.train.losses import rollout_correction  # noqa: E402


def rho_example():
    """Token ratios π_b/μ: row 0 = [2, 0.5, (pad)], row 1 = [4, (pad), (pad)], row 2 all padding.
    ln 2 and ln 0.5 make ρ exactly 2 and 0.5."""
    dt = torch.float64
    l2 = math.log(2.0)
    behaviour = torch.tensor([[l2, -l2, 5.0], [2 * l2, 5.0, 5.0], [1.0, 1.0, 1.0]], dtype=dt)
    mu = torch.zeros(3, 3, dtype=dt)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=dt)
    assert math.exp(l2) == 2.0 and math.exp(2 * l2) == 4.0
    return behaviour, mu, mask


def ess(w):
    return sum(w) ** 2 / (len(w) * sum(x * x for x in w))


@pytest.mark.parametrize(
    "mode, cap, weights, masked",
    [
        ("truncate", 2.0, [2.0, 0.5, 2.0], 1 / 3),  # ρ = C (2) is not above the cap; only 4 is
        ("mask", 2.0, [2.0, 0.5, 0.0], 1 / 3),  # ρ = C is kept; 4 is masked
        ("truncate", 0.5, [0.5, 0.5, 0.5], 2 / 3),  # a cap below 1 truncates too (TRL clamps at any C_max)
        ("truncate", 0.0, [2.0, 0.5, 4.0], 0.0),  # cap 0: plain IS
    ],
)
def test_token_level_weights_and_metrics(mode, cap, weights, masked):
    behaviour, mu, mask = rho_example()
    w, m = rollout_correction(behaviour, mu, mask, "token", mode, cap)
    active = mask.bool()
    assert w[active].tolist() == weights
    assert m == pytest.approx(
        {
            "mismatch/is_min": 0.5,
            "mismatch/is_mean": 6.5 / 3,
            "mismatch/is_max": 4.0,
            "mismatch/masked_frac": masked,
            "mismatch/ess": ess(weights),
        },
        abs=1e-7,
    )


def test_sequence_level_weights_and_metrics_count_non_empty_rows_only():
    """Sequence ρ = Π_t ρ_t: row 0 → 2·0.5 = 1, row 1 → 4; the all-padding row 2 is no sequence."""
    behaviour, mu, mask = rho_example()
    w, m = rollout_correction(behaviour, mu, mask, "sequence", "mask", 2.0)
    assert w.shape == (3, 1) and w[:2, 0].tolist() == [1.0, 0.0]
    assert m == pytest.approx(
        {
            "mismatch/is_min": 1.0,
            "mismatch/is_mean": 2.5,
            "mismatch/is_max": 4.0,
            "mismatch/masked_frac": 0.5,
            "mismatch/ess": 0.5,
        },
        abs=1e-7,
    )


def test_one_unit_still_has_metrics_and_all_masked_has_ess_zero():
    dt = torch.float64
    one = torch.tensor([[math.log(0.25)]], dtype=dt)
    w, m = rollout_correction(one, torch.zeros(1, 1, dtype=dt), torch.ones(1, 1, dtype=dt), "token", "truncate", 2.0)
    assert w.item() == 0.25 and m["mismatch/ess"] == 1.0 and m["mismatch/is_mean"] == 0.25  # Σw² < 1
    behaviour, mu, mask = rho_example()
    w, m = rollout_correction(behaviour + 3.0, mu, mask, "token", "mask", 2.0)  # every ρ > 2
    assert w[mask.bool()].tolist() == [0.0, 0.0, 0.0]
    assert m["mismatch/masked_frac"] == 1.0 and m["mismatch/ess"] == 0.0
    w, m = rollout_correction(behaviour, mu, torch.zeros_like(mask), "token", "mask", 2.0)
    assert m == {}  # nothing active: no metrics


def test_tokens_the_sampler_did_not_score_get_weight_one():
    """μ = NaN on an active token (not scored by the sampler): ρ_t = 1, as in TRL."""
    behaviour, mu, mask = rho_example()
    mu[0, 1] = float("nan")
    w, m = rollout_correction(behaviour, mu, mask, "token", "truncate", 0.0)
    assert w[mask.bool()].tolist() == [2.0, 1.0, 4.0]
    assert m["mismatch/is_min"] == 1.0


def test_ratio_metrics_by_hand():
    """policy/ratio_mean and _max over active tokens (token level), or over sequences (GSPO's one ratio
    per row); a batch with no active token has max 0.0."""
    up, down = math.log(1.5), math.log(0.5)
    inp = flat(
        logps=[[up, down, 5.0], [0.0, 0.0, 0.0]], old=[[0.0] * 3] * 2, adv=[1.0, -1.0], mask=[[1, 1, 0], [1, 0, 0]]
    )
    _, m = policy_loss(inp, AlgoConfig(loss_type="bnpo"), max_completion_len=3)
    assert m["policy/ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.0) / 3, abs=1e-12)
    assert m["policy/ratio_max"] == pytest.approx(1.5, abs=1e-12)  # not e^5: that token is padding
    _, m = policy_loss(
        inp,
        AlgoConfig(loss_type="bnpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
        max_completion_len=3,
    )
    row0 = math.exp((up + down) / 2)  # exp of the mean token log-ratio
    assert m["policy/ratio_mean"] == pytest.approx((row0 + 1.0) / 2, abs=1e-7)  # one value per row, in fp32
    assert m["policy/ratio_max"] == pytest.approx(1.0, abs=1e-7)  # row0 = √0.75 < 1
    empty = flat(logps=[[up, down]], old=[[0.0, 0.0]], adv=[1.0], mask=[[0, 0]])
    _, m = policy_loss(empty, AlgoConfig(loss_type="bnpo"), max_completion_len=2)
    assert (m["policy/ratio_mean"], m["policy/ratio_max"]) == (0.0, 0.0)


def test_auto_rollout_correction_follows_the_rollout_backend():
    """algo.is_level = 'auto': none for the hf rollout (the default backend), sequence level for vLLM (TRL's
    default correction of vLLM rollouts)."""
    behaviour, mu, mask = rho_example()
    inp = LossInputs(
        logps=behaviour.clone().requires_grad_(True),
        old_logps=behaviour,
        mask=mask,
        advantages=torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64),
        rollout_logps=mu,
    )
    algo = AlgoConfig(is_level="auto", is_mode="truncate", is_cap=3.0)
    _, m = policy_loss(inp, algo, max_completion_len=3)
    assert not any(k.startswith("mismatch/") for k in m)
    _, m = policy_loss(inp, algo, max_completion_len=3, rollout_backend="vllm")
    assert m["mismatch/is_max"] == 4.0 and m["mismatch/is_min"] == 1.0  # sequence ρ: [1, 4]


def test_mask_mode_without_a_cap_keeps_every_weight():
    """cap 0 means no cap in either mode (the config refuses mask with cap 0; the function stays total)."""
    behaviour, mu, mask = rho_example()
    w, m = rollout_correction(behaviour, mu, mask, "token", "mask", 0.0)
    assert w[mask.bool()].tolist() == [2.0, 0.5, 4.0] and m["mismatch/masked_frac"] == 0.0
