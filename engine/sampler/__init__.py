"""Rollout backends behind one small interface (see base.py): hf (transformers) and vllm."""

from __future__ import annotations

from grpo_studio.engine.sampler.base import Rollout, Sampler, Sampling


def make_sampler(cfg, model_path: str, tokenizer, emit_event=None) -> Sampler:
    """Build the backend named by rollout.backend; `auto` falls back to hf when vLLM is missing."""
    name = cfg.rollout.backend
    if name in ("vllm", "auto"):
        from grpo_studio.engine.sampler import vllm_backend

        problem = vllm_backend.unavailable_reason()
        if problem is None:
            return vllm_backend.VLLMBackend(cfg, model_path, tokenizer, emit_event=emit_event)
        if name == "vllm":
            from grpo_studio.engine.contract.config import ConfigError

            raise ConfigError(f"config error: rollout.backend = 'vllm': {problem}")
        if emit_event:
            emit_event("warning", f"rollout.backend = 'auto': vLLM unavailable ({problem}); using hf")
    from grpo_studio.engine.sampler.hf import HFBackend

    return HFBackend(cfg, model_path, tokenizer)


__all__ = ["Rollout", "Sampler", "Sampling", "make_sampler"]
