"""The configurations `grpo-studio bench vram-accuracy` (vram_accuracy_bench.py) measures, and their models: tiny
Llama, Qwen3, Gemma3 and Qwen3-MoE built from a transformers config, or the real packaged SmolLM2-135M-Instruct."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass


@dataclass
class Case:
    name: str
    family: str
    dtype: str = "fp32"
    lora_rank: int = 8
    completion: int = 32
    generations: int = 4
    checkpointing: bool = False
    load_in_4bit: bool = False
    world: int = 1  # data-parallel processes
    parallel: str = "ddp"  # with world > 1: ddp | fsdp


CASES = [
    Case("qwen3 lora r8", "qwen3"),
    Case("qwen3 lora r64", "qwen3", lora_rank=64),
    Case("qwen3 full FT", "qwen3", lora_rank=0),
    Case("qwen3 lora bf16", "qwen3", dtype="bf16"),
    Case("llama lora c96", "llama", completion=96),
    Case("llama lora G8", "llama", generations=8),
    Case("qwen3 lora grad-ckpt", "qwen3", checkpointing=True),
    Case("llama full grad-ckpt", "llama", lora_rank=0, checkpointing=True),
    Case("gemma3 full bf16", "gemma3", dtype="bf16", lora_rank=0),
    Case("qwen3 qlora r8", "qwen3", load_in_4bit=True),
    Case("qwen3 qlora bf16", "qwen3", dtype="bf16", load_in_4bit=True),
    Case("llama qlora grad-ckpt", "llama", load_in_4bit=True, checkpointing=True),
    Case("gemma3 qlora bf16", "gemma3", dtype="bf16", load_in_4bit=True),
    Case("qwen3 lora ddp x2", "qwen3", world=2),
    Case("llama full ddp x2", "llama", lora_rank=0, world=2),
    Case("qwen3 lora fsdp x2", "qwen3", world=2, parallel="fsdp"),
    Case("llama full fsdp x2", "llama", lora_rank=0, world=2, parallel="fsdp"),
    Case("smollm2-135m lora r16", "smollm2-135m-instruct", lora_rank=16),  # the real packaged model
    Case("smollm2-135m full FT", "smollm2-135m-instruct", lora_rank=0),
    Case("qwen3-moe lora r8", "qwen3_moe"),  # the tiny MoE's shape at ARCH's size (benchmarks/tiny_moe.py)
    Case("qwen3-moe full FT", "qwen3_moe", lora_rank=0),
]
PROMPT, PROMPTS_PER_STEP = 29, 2  # odd lengths keep activation shapes apart from weight shapes
ARCH = dict(
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=4096,
)


def model_folder(family: str) -> str:
    """A real packaged model by name (contract/packaged.py), or a tiny model of `family` built from
    a transformers config."""
    from ..contract.packaged import PACKAGED
    from ..engine.model.policy_loader import resolve_model_path

    if family in PACKAGED:
        return resolve_model_path(family)
    folder = tempfile.mkdtemp(prefix=f"vram-{family}-")
    build_tiny(family, folder)
    return folder


def build_tiny(family: str, folder: str) -> None:
    import torch

    if family == "qwen3_moe":
        from .tiny_moe import build_tiny_moe

        build_tiny_moe(folder, **ARCH, moe_intermediate_size=ARCH["intermediate_size"] // 4)
        return
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM),
    }[family]
    torch.manual_seed(0)
    extra = {"tie_word_embeddings": family == "gemma3"}
    cls[1](cls[0](**ARCH, **extra)).save_pretrained(folder)
