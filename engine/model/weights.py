"""Export the trainer's current weights for the rollout engine (HF names, LoRA merged).

With LoRA only the adapted linears change, so only their merged weights W + (α/r)·B·A are sent;
with full fine-tuning every parameter is sent. The trainer's own modules are never modified.
A 4-bit base (model.load_in_4bit) is not merged: W is NF4 codes, and W + (α/r)·B·A re-quantised
would be another base than the trainer's. The hf sampler holds the same 4-bit base with the same
adapter modules (engine/sampler/hf.py), so the adapter tensors themselves are sent, under peft's names.
A policy sharded by FSDP2 (train.parallel = fsdp) is unsharded unit by unit while the weights are taken
(every rank calls this at the same point: each rank's sampler needs the whole weights), then resharded.
A sampler that serves the LoRA adapter itself (vLLM's adapter-only sync, engine/sampler/vllm_lora.py) does
not iterate: it calls save_adapter, which writes the adapter in peft's format and merges nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

PEFT_PREFIX = "base_model.model."


class PolicyWeights:
    """The policy's weights for the rollout engine: iterating gives (HF name, tensor) pairs (LoRA merged);
    save_adapter writes the LoRA adapter alone."""

    def __init__(self, policy):
        from peft import PeftModel

        self.policy = policy
        self.has_adapter = isinstance(policy, PeftModel)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return _exported(self.policy)

    @torch.no_grad()
    def save_adapter(self, path) -> None:
        """The active LoRA adapter into the folder `path` (adapter_model.safetensors + adapter_config.json,
        what peft's save_pretrained writes and vLLM's LoRARequest loads), from the whole (unsharded) tensors."""
        from peft.utils import get_peft_model_state_dict
        from safetensors.torch import save_file

        name = self.policy.active_adapter
        with _whole(self.policy):
            state = get_peft_model_state_dict(self.policy, adapter_name=name)
            save_file(
                {k: v.detach().to("cpu").contiguous() for k, v in state.items()}, f"{path}/adapter_model.safetensors"
            )
        self.policy.peft_config[name].save_pretrained(str(path))


def export_weights(policy) -> PolicyWeights:
    return PolicyWeights(policy)


@torch.no_grad()
def _exported(policy) -> Iterator[tuple[str, torch.Tensor]]:
    with _whole(policy):
        yield from _export(policy)


@contextlib.contextmanager
def _whole(policy):
    from .fsdp import units

    sharded = units(policy)
    for unit in sharded:  # all-gathers: the module's parameters are the whole tensors until reshard
        unit.unshard()
    try:
        yield
    finally:
        for unit in sharded:
            unit.reshard()


def _export(policy) -> Iterator[tuple[str, torch.Tensor]]:
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(policy, PeftModel):
        yield from ((name, p.detach()) for name, p in policy.named_parameters())
        return
    if getattr(policy, "is_loaded_in_4bit", False):
        yield from ((name, p.detach()) for name, p in policy.named_parameters() if p.requires_grad)
        return
    adapter = policy.active_adapter
    for name, module in policy.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.lora_A:
            # peft's ParamWrapper adapts one parameter of a module (an MoE's fused experts), nested once per
            # parameter: the HF name is the module's path without the wrappers' .base_layer
            param = getattr(module, "parameter_name", "weight")
            base = getattr(module.get_base_layer(), param)
            merged = base.float() + module.get_delta_weight(adapter).float()
            yield name.removeprefix(PEFT_PREFIX).replace(".base_layer", "") + "." + param, merged
