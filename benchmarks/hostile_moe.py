"""The fault suite's hostile cases for mixture-of-experts routing replay (algo.router_replay; engine/model/moe.py;
benchmarks/fault_probes.py says how they run). A value that is not offered, and replay where no sampler's experts
can reach the trainer (vLLM, a rollout server, joined dynamic-sampling rounds, the shared-prefix pass), are
refused in one line before the model loads (contract/config_rules.py); replay on a model without hookable
routers (a dense model, an MoE family whose routers are not supported) in one line once its config is read; and
vLLM's adapter-only sync of an MoE (rollout.vllm_sync = adapter: vLLM's LoRA does not serve peft's fused-expert
adapter) in one line before the engine starts (engine/sampler/vllm_lora.py)."""

from __future__ import annotations

from pathlib import Path

from .fault_cases import Case, train

CATEGORY = "moe"
REPLAY = "algo.router_replay=replay"


def _qwen3_moe(tmp: Path) -> None:
    from .tiny_moe import build_tiny_moe

    build_tiny_moe(tmp / "moe")


def _mixtral(tmp: Path) -> None:
    """A tiny Mixtral (an MoE family whose router replay is not supported) with tiny-arith's tokenizer."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    from .tiny_moe import SHAPE, build_tiny_moe

    build_tiny_moe(tmp / "moe")  # its tokenizer files, then a Mixtral over them
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    torch.manual_seed(0)
    config = MixtralConfig(
        **{k: SHAPE[k] for k in keep}, head_dim=64, intermediate_size=64, num_local_experts=4, pad_token_id=0
    )
    MixtralForCausalLM(config).save_pretrained(tmp / "moe")


def cases() -> list[Case]:
    """`train` with replay where it cannot act, or a value not offered: one line, exit 2, no run directory."""
    sets = {
        "replay misspelt": ("algo.router_replay=replya",),
        "replay 'on' (not offered)": ("algo.router_replay=on",),
        "replay empty": ("algo.router_replay=",),
        "replay a number": ("algo.router_replay=1",),
        "replay on a dense model": (REPLAY,),
        "replay on a vLLM rollout": (REPLAY, "rollout.backend=vllm"),
        "replay through a rollout server": (
            REPLAY,
            "rollout.backend=vllm",
            "rollout.colocate=false",
            "rollout.server=http://127.0.0.1:9",
        ),
        "replay with dynamic sampling": (REPLAY, "algo.dynamic_sampling=true"),
        "replay with the shared-prefix pass on": (REPLAY, "train.shared_prefix=on"),
    }
    out = [Case(CATEGORY, name, train(*[a for s in values for a in ("--set", s)])) for name, values in sets.items()]
    out.append(
        Case(
            CATEGORY,
            "replay on an MoE family not supported (mixtral)",
            train("--set", "model.name={tmp}/moe", "--set", REPLAY, "--set", "train.steps=1"),
            prepare=_mixtral,
        )
    )
    out.append(
        Case(
            CATEGORY,
            "vLLM's adapter-only sync of an MoE's LoRA",
            train(
                *("--set", "model.name={tmp}/moe", "--set", "rollout.backend=vllm", "--set", "model.lora_rank=8"),
                *("--set", "rollout.vllm_sync=adapter", "--set", "train.steps=1"),
            ),
            prepare=_qwen3_moe,
        )
    )
    return out
