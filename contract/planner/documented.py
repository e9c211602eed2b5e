"""The VRAM planner's documented mode: Unsloth's GRPO memory arithmetic (unsloth.ai/blog/grpo, "Long-context
GRPO"), as published (docs/vram.md). Pure python, like contract/planner/vram.py."""

from __future__ import annotations

from .. import backend
from ..config import Config
from ..model_card import Card
from .breakdown import Row, _g

# Unsloth's published "Training Memory Cost" for Llama 3.1 8B, 20K context, 8 generations.
# No derivation is published; the planner takes them as the doc's inputs.
DOC_TRAINING_GB = {"standard": 414.0, "efficient": 42.0}
DOC_SETUP = ("llama-3.1-8b", 20480, 8)


def documented(card: Card, cfg: Config, variant: str = "efficient", training: Row | None = None) -> list[Row]:
    """Unsloth's GRPO table: training + GRPO logits + inference weights copy + KV cache.

    `training` pins the training row (inverse solving keeps the starting config's row: the doc's
    figure belongs to one setup and must not switch on and off while a key is searched)."""
    r, m = cfg.rollout, cfg.model
    G, T, V = r.num_generations, r.max_prompt_len + r.max_completion_len, card.vocab
    size_b = card.nominal_b or card.total_params() / 1e9
    if (card.name, T, G) == DOC_SETUP:
        train = DOC_TRAINING_GB[variant]
        train_f = (
            f"doc's published training memory for this setup ({variant}: {train:g} GB); "
            f"Unsloth publishes no derivation, taken as the doc's input"
        )
    elif m.lora_rank == 0:
        train = 16 * size_b
        train_f = f"full fine-tune: 16 B/param × {size_b:g}B (mixed-precision AdamW rule; not in Unsloth's doc)"
    elif m.load_in_4bit:
        train = size_b
        train_f = f"QLoRA rule of thumb: params in B ≈ GB → {size_b:g}"
    else:
        train = 4 * size_b
        train_f = f"LoRA 16-bit ≈ 4 × QLoRA rule of thumb: 4 × {size_b:g}"
    logits = 2 * 2 * G * T * V / (8 if variant == "efficient" else 1)
    logits_f = f"2 · 2 B · {G} gen · {T} ctx · {V} vocab" + (
        " ÷ 8 (Unsloth memory-efficient GRPO loss)" if variant == "efficient" else " (standard)"
    )
    if variant == "efficient":
        engine = backend.resolve(r.backend, load_in_4bit=m.load_in_4bit)[0]
        infer, infer_f = 0.0, "0: weights shared with vLLM (Unsloth)"
        if engine != "vllm":  # the doc's assumption, not this run's: the hf sampler keeps its own copy
            infer_f = f"0: Unsloth's doc shares the weights with vLLM; this run samples with {engine} (accurate mode counts its copy)"
    else:
        infer = 2 * size_b
        infer_f = f"2 B · {size_b:g}B params (separate vLLM copy; the doc counts 1B params ≈ 1 GB)"
    kv = 2 * 2 * card.layers * T * card.kv_dim
    kv_f = f"2 · 2 B · {card.layers} layers · {T} ctx · ({card.kv_heads} kv heads · {card.head_dim} head_dim) per batch"
    if training is not None:
        train, train_f = training.gib, training.formula
    return [
        Row("training", train, train_f, "persistent"),
        Row("GRPO logits", _g(logits), logits_f, "train"),
        Row("inference weights copy", infer, infer_f, "persistent"),
        Row("KV cache", _g(kv), kv_f, "rollout"),
    ]
