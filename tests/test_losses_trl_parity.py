"""Parity of grpo_studio.engine.train.losses.policy_loss with TRL 1.16's GRPOTrainer on identical tensors.

The oracle is TRL's own code, driven offline on constructed inputs:
- the loss is `GRPOTrainer._compute_loss`, called on an instance made with `__new__` that carries
  only the attributes the method reads, and whose `_get_per_token_logps_and_entropies` returns
  our log-prob tensor (so the gradient is taken w.r.t. the same leaf tensor on both sides);
- the vLLM importance-sampling ratio is computed inside `_generate_and_score_completions`, which
  needs a model, a tokenizer and a generator. The test extracts that method's IS block verbatim
  with `inspect.getsource` (from "# Compute the importance sampling ratio when using vLLM" to
  "# Compute the per-token log probabilities for the reference model") and executes it on our
  tensors, so the ratio is TRL's code too, not a copy of it.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

# TRL is the oracle, not an option: it is in the dev extra (`make test` installs it), and without it
# these tests must fail, not skip.
import trl.trainer.grpo_trainer as trl_grpo  # noqa: E402

from grpo_studio.contract.config import AlgoConfig
from grpo_studio.engine.train.losses import LossInputs, policy_loss

GRPOTrainer = trl_grpo.GRPOTrainer

TOL = 1e-6
B, T, MAX_LEN = 6, 7, 9


def _trl_block(method, start: str, end: str) -> str:
    src = inspect.getsource(method)
    i, j = src.index(start), src.index(end)  # ValueError here means TRL changed: re-read it
    i, j = src.rindex("\n", 0, i) + 1, src.rindex("\n", 0, j) + 1  # whole lines, for dedent
    return textwrap.dedent(src[i:j])


IS_BLOCK = _trl_block(
    GRPOTrainer._generate_and_score_completions,
    "# Compute the importance sampling ratio when using vLLM",
    "# Compute the per-token log probabilities for the reference model",
)


def trl_is_ratio(mode: str, cap: float, old_logps, sampling_logps, mask, floor: float | None = None):
    """TRL's vllm_importance_sampling_ratio for `mode`, C_max = cap, C_min = floor (None: its default)."""
    trainer = SimpleNamespace(
        use_vllm=True,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=floor,
        vllm_importance_sampling_clip_max=cap,
    )
    scope = {
        "self": trainer,
        "torch": torch,
        "math": math,
        "old_per_token_logps": old_logps,
        "sampling_per_token_logps": sampling_logps,
        "completion_mask": mask,
        "tool_mask": None,
    }
    exec(IS_BLOCK, scope)
    return scope["vllm_importance_sampling_ratio"]


class _Accelerator:
    num_processes = 1

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x


def trl_trainer(
    *,
    loss_type="grpo",
    epsilon=0.2,
    epsilon_high=0.2,
    delta=None,
    beta=0.0,
    use_bias_correction_kl=True,
    importance_sampling_level="token",
    vllm_is=False,
    max_completion_length=MAX_LEN,
    steps_per_generation=1,
    num_iterations=1,
):
    """A GRPOTrainer made with `__new__`, carrying only the attributes `_compute_loss` and `_prepare_inputs`
    read: one process, one micro-batch per optimizer step; vllm_is = TRL's vLLM IS correction applied."""
    t = GRPOTrainer.__new__(GRPOTrainer)
    t.args = SimpleNamespace(
        delta=delta, use_bias_correction_kl=use_bias_correction_kl, steps_per_generation=steps_per_generation
    )
    t.model = SimpleNamespace(training=True)
    t.accelerator = _Accelerator()
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t.loss_type, t.beta, t.importance_sampling_level = loss_type, beta, importance_sampling_level
    t.epsilon_low, t.epsilon_high = epsilon, epsilon_high
    t.max_completion_length = max_completion_length
    t.current_gradient_accumulation_steps = 1
    t.top_entropy_quantile, t.off_policy_mask_threshold = 1.0, None
    t.aux_loss_enabled, t._entropy_bonus_enabled = False, False
    t.use_vllm = t.vllm_importance_sampling_correction = vllm_is
    t.num_iterations, t._step, t._buffered_inputs = num_iterations, 0, None
    return t


def trl_loss(
    data: dict, logps: torch.Tensor, *, is_mode=None, is_cap=None, is_floor=None, num_items_in_batch=None, **knobs
):
    """Loss from TRL's `_compute_loss` and the metrics it logged."""
    t = trl_trainer(vllm_is=is_mode is not None, **knobs)
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logps, data["entropy"], None)

    mask = data["mask"]
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": data["advantages"],
        "old_per_token_logps": data["old_logps"],
        "ref_per_token_logps": data["ref_logps"],
        "num_items_in_batch": torch.tensor(float(mask.sum() if num_items_in_batch is None else num_items_in_batch)),
    }
    if is_mode is not None:
        inputs["importance_sampling_ratio"] = trl_is_ratio(
            is_mode, is_cap, data["old_logps"], data["rollout_logps"], mask, is_floor
        )
    loss = t._compute_loss(None, inputs)
    return loss, {k: v[-1] for k, v in t._metrics["train"].items()}


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(1234)
    dt = torch.float64
    lengths = torch.tensor([7, 5, 1, 6, 0, 3])  # includes a fully masked (truncated) completion
    mask = (torch.arange(T)[None] < lengths[:, None]).to(dt)
    logps = -3.0 * torch.rand(B, T, generator=g, dtype=dt)
    # π_old differs enough from π_θ that both clip sides and delta are active somewhere
    old = logps + 0.5 * torch.randn(B, T, generator=g, dtype=dt)
    rollout = old + 0.35 * torch.randn(B, T, generator=g, dtype=dt)
    ref = logps + 0.3 * torch.randn(B, T, generator=g, dtype=dt)
    return {
        "logps": logps,
        "old_logps": old,
        "rollout_logps": rollout,
        "ref_logps": ref,
        "mask": mask,
        "advantages": torch.tensor([1.2, -0.7, 0.4, -1.5, 0.9, -0.3], dtype=dt),
        "entropy": 2.0 * torch.rand(B, T, generator=g, dtype=dt),
    }


def ours(data, algo: AlgoConfig, num_items_in_batch=None):
    logps = data["logps"].clone().requires_grad_(True)
    inp = LossInputs(
        logps=logps,
        old_logps=data["old_logps"],
        advantages=data["advantages"],
        mask=data["mask"],
        rollout_logps=data["rollout_logps"],
        ref_logps=data["ref_logps"],
        entropy=data["entropy"],
    )
    loss, metrics = policy_loss(inp, algo, MAX_LEN, num_items_in_batch)
    loss.backward()
    return loss.detach(), logps.grad, metrics


def theirs(data, **kw):
    logps = data["logps"].clone().requires_grad_(True)
    loss, metrics = trl_loss(data, logps, **kw)
    loss.backward()
    return loss.detach(), logps.grad, metrics


def assert_parity(data, algo: AlgoConfig, trl_kw: dict, num_items_in_batch=None):
    loss, grad, metrics = ours(data, algo, num_items_in_batch)
    ref_loss, ref_grad, ref_metrics = theirs(data, num_items_in_batch=num_items_in_batch, **trl_kw)
    assert torch.isfinite(loss) and grad.abs().sum() > 0
    assert loss.item() == pytest.approx(ref_loss.item(), abs=TOL, rel=0)
    torch.testing.assert_close(grad, ref_grad, atol=TOL, rtol=0)
    assert metrics["entropy"] == pytest.approx(ref_metrics["entropy"], abs=TOL)
    if algo.objective == "ppo":
        for ours_key, trl_key in [
            ("clip/low", "clip_ratio/low_mean"),
            ("clip/high", "clip_ratio/high_mean"),
            ("clip/region", "clip_ratio/region_mean"),
        ]:
            assert metrics[ours_key] == pytest.approx(ref_metrics[trl_key], abs=TOL), ours_key
    if algo.beta > 0:
        assert metrics["kl_ref"] == pytest.approx(ref_metrics["kl"], abs=TOL)
    return metrics


LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_types_and_is_level(data, loss_type, level):
    algo = AlgoConfig(loss_type=loss_type, importance_sampling_level=level)
    metrics = assert_parity(data, algo, dict(loss_type=loss_type, importance_sampling_level=level))
    if level == "token":  # the fixture must actually exercise the clip on both sides
        assert metrics["clip/low"] > 0 and metrics["clip/high"] > 0


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_epsilon_high_clip_higher(data, loss_type):
    algo = AlgoConfig(loss_type=loss_type, epsilon=0.2, epsilon_high=0.28)
    assert_parity(data, algo, dict(loss_type=loss_type, epsilon=0.2, epsilon_high=0.28))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_delta_two_sided(data, loss_type):
    ratio = torch.exp(data["logps"] - data["old_logps"])
    assert ((ratio > 1.5) & (data["mask"] > 0) & (data["advantages"][:, None] < 0)).any()  # delta binds
    algo = AlgoConfig(loss_type=loss_type, epsilon_high=0.28, delta=1.5)
    assert_parity(data, algo, dict(loss_type=loss_type, epsilon_high=0.28, delta=1.5))


@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_beta_k3(data, loss_type, level, bias_correction):
    algo = AlgoConfig(
        loss_type=loss_type, beta=0.04, importance_sampling_level=level, use_bias_correction_kl=bias_correction
    )
    assert_parity(
        data,
        algo,
        dict(loss_type=loss_type, beta=0.04, importance_sampling_level=level, use_bias_correction_kl=bias_correction),
    )


@pytest.mark.parametrize("trl_mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_rollout_correction_modes(data, loss_type, trl_mode):
    level, mode = trl_mode.split("_")
    cap = 1.6
    algo = AlgoConfig(loss_type=loss_type, is_level=level, is_mode=mode, is_cap=cap, beta=0.04)
    metrics = assert_parity(data, algo, dict(loss_type=loss_type, is_mode=trl_mode, is_cap=cap, beta=0.04))
    # the cap must bind for some units and not for others, or the test would not tell modes apart
    assert 0 < metrics["mismatch/masked_frac"] < 1


def test_dapo_num_items_in_batch_spans_the_generation_batch(data):
    """dapo divides by the active tokens of the whole generation batch, not just this micro-batch."""
    algo = AlgoConfig(loss_type="dapo", epsilon_high=0.28)
    n = int(data["mask"].sum()) * 3
    assert_parity(data, algo, dict(loss_type="dapo", epsilon_high=0.28), num_items_in_batch=n)


def test_gspo_preset_matches_trl_sequence_level(data):
    from grpo_studio.contract.algorithms import PRESETS

    algo = AlgoConfig()
    for key, value in PRESETS["gspo"].items():
        setattr(algo, key.split(".", 1)[1], value)
    assert_parity(
        data, algo, dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4)
    )


def test_precision_rl_ppo_token_tis_is_trl_token_truncate(data):
    """ppo_token_tis (C=2) is TRL's token_truncate with C_max=2 on the dapo loss."""
    from grpo_studio.contract.algorithms import PRESETS

    algo = AlgoConfig()
    for key, value in PRESETS["ppo_token_tis"].items():
        setattr(algo, key.split(".", 1)[1], value)
    assert_parity(data, algo, dict(loss_type="dapo", is_mode="token_truncate", is_cap=2.0))


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_float32_as_the_trainer_runs_it(data, loss_type):
    """The trainer works in float32: same numbers as TRL there too (beta, token TIS, clip-higher on)."""
    data32 = {k: v.float() for k, v in data.items()}
    algo = AlgoConfig(
        loss_type=loss_type, epsilon_high=0.28, beta=0.04, is_level="token", is_mode="truncate", is_cap=1.6
    )
    assert_parity(
        data32, algo, dict(loss_type=loss_type, epsilon_high=0.28, beta=0.04, is_mode="token_truncate", is_cap=1.6)
    )


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_a_batch_with_one_active_token(data, loss_type):
    """Normalisers clamp at one token, not more: a batch whose only active token is (0, 0)."""
    one = dict(data)
    one["mask"] = torch.zeros_like(data["mask"])
    one["mask"][0, 0] = 1.0
    assert_parity(one, AlgoConfig(loss_type=loss_type, beta=0.04), dict(loss_type=loss_type, beta=0.04))


def test_delta_below_one_caps_like_trl(data):
    """Loss and gradient cap the ratio at any delta > 0 as TRL does. (The clip metrics differ there: TRL
    counts clipping on the capped ratio; the config only allows delta > 1 + epsilon_high, where the two agree.)"""
    loss, grad, _ = ours(data, AlgoConfig(loss_type="bnpo", delta=0.9))
    ref_loss, ref_grad, _ = theirs(data, loss_type="bnpo", delta=0.9)
    assert loss.item() == pytest.approx(ref_loss.item(), abs=TOL, rel=0)
    torch.testing.assert_close(grad, ref_grad, atol=TOL, rtol=0)
    uncapped, _, _ = ours(data, AlgoConfig(loss_type="bnpo"))
    assert abs(uncapped.item() - loss.item()) > 1e-3  # the cap binds on this data


@pytest.mark.parametrize("trl_mode", ["token_truncate", "sequence_truncate"])
def test_rollout_correction_cap_below_one(data, trl_mode):
    level, mode = trl_mode.split("_")
    algo = AlgoConfig(loss_type="dapo", is_level=level, is_mode=mode, is_cap=0.5)
    assert_parity(data, algo, dict(loss_type="dapo", is_mode=trl_mode, is_cap=0.5))
