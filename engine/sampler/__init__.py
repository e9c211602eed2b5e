"""Rollout backends behind one small interface: hf (transformers) and vllm.

base           the interface: G completions per prompt, and the log-probs the sampler used
hf             transformers `generate` on its own copy of the policy
vllm_backend   vLLM's offline engine, in-process, colocated with the trainer
vllm_sync      weight sync into a live vLLM engine; the simulated FP8 rollout
vllm_lora      the adapter-only weight sync: vLLM's LoRA serves the trainer's adapter (rollout.vllm_sync)
remote         the client of a rollout server (rollout.colocate = false)
auth           the rollout server's guard, shared by client and server: the secret, the body limit
transport      the weight transport between trainer and rollout server (a torch.distributed group)

May import: contract, engine.prompts, engine.precision, engine.model.
"""

from __future__ import annotations

from ...contract import backend
from ...contract.errors import UserError
from .base import Rollout, Sampler, Sampling


def make_sampler(cfg, model_path: str, tokenizer, plan, emit_event=None, local: bool = False, log_dir=None) -> Sampler:
    """Build the backend named by rollout.backend (contract.backend.resolve: `auto` falls back to hf
    when vLLM cannot run here); `plan` is the run's PrecisionPlan. rollout.colocate = false gives the client
    of a rollout server (remote.py; an auto-started one logs into log_dir) unless `local` (the server's own
    engine)."""
    if not cfg.rollout.colocate and not local:
        from .remote import RemoteSampler

        return RemoteSampler(cfg, plan, log_dir=log_dir, emit_event=emit_event)
    if cfg.rollout.backend == "vllm":  # an MoE's adapter sync refused before vLLM's import prints its notes
        from .vllm_lora import moe_checkpoint, refuse_moe_adapter

        refuse_moe_adapter(cfg, moe_checkpoint(model_path))
    name, problem = backend.resolve(cfg.rollout.backend, _vllm_problem, cfg.model.load_in_4bit)
    if name == "vllm" and problem:
        raise UserError(problem, key="rollout.backend", value="vllm")
    if problem and emit_event:
        emit_event("warning", f"rollout.backend = 'auto': vLLM unavailable ({problem}); using hf")
    if name == "vllm":
        from .vllm_backend import VLLMBackend

        backend.refuse_vllm_dtype(model_type(model_path), cfg)

        return VLLMBackend(cfg, model_path, tokenizer, plan, emit_event=emit_event, run_dir=log_dir)
    from .hf import HFBackend

    return HFBackend(model_path, tokenizer, plan, cfg.model, keep_support=cfg.algo.logprob_support == "sampler")


def model_type(model_path: str) -> str:
    """config.json's model_type of a local model folder ("" when it has none)."""
    import json
    from pathlib import Path

    return json.loads((Path(model_path) / "config.json").read_text()).get("model_type", "")


def _vllm_problem() -> str | None:
    from . import vllm_backend  # sets vLLM's environment before it loads

    return vllm_backend.unavailable_reason()


__all__ = ["Rollout", "Sampler", "Sampling", "make_sampler"]
