"""Rollout backends behind one small interface (see base.py): hf (transformers) and vllm."""

from __future__ import annotations

from engine.rollout.base import Rollout, RolloutBackend, Sampling


def make_backend(cfg, model_path: str, tokenizer, emit_event=None) -> RolloutBackend:
    """Build the backend named by rollout.backend; `auto` falls back to hf when vLLM is missing."""
    name = cfg.rollout.backend
    if name in ("vllm", "auto"):
        from engine.rollout import vllm_backend

        problem = vllm_backend.unavailable_reason()
        if problem is None:
            return vllm_backend.VLLMBackend(cfg, model_path, tokenizer, emit_event=emit_event)
        if name == "vllm":
            from engine.config import ConfigError

            raise ConfigError(f"config error: rollout.backend = 'vllm': {problem}")
        if emit_event:
            emit_event("warning", f"rollout.backend = 'auto': vLLM unavailable ({problem}); using hf")
    from engine.rollout.hf import HFBackend

    return HFBackend(cfg, model_path, tokenizer)


__all__ = ["Rollout", "RolloutBackend", "Sampling", "make_backend"]
