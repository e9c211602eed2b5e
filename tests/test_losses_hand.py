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

from grpo_studio.engine.contract import algorithms
from grpo_studio.engine.contract.config import AlgoConfig, load
from grpo_studio.engine.contract.errors import UserError
from grpo_studio.engine.losses import LossInputs, policy_loss

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
    inp = LossInputs(logps=logps, old_logps=old, advantages=torch.tensor([1.0, -0.5], dtype=dt),
                     mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=dt), rollout_logps=mu)
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
    assert m["mismatch/ess"] == pytest.approx(3.5 ** 2 / (2 * (1.5 ** 2 + 4)), abs=TOL)


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
    msg = _one_line_error(["algo.is_level=sequence", "algo.is_mode=mask"])
    assert "algo.is_cap" in msg and "mask" in msg


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
