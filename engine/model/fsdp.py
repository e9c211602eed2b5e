"""FSDP2 (train.parallel = fsdp; docs/distributed.md): every rank holds 1/N of the policy's parameters,
gradients and AdamW state, and gathers a layer's full weights only while it computes with them.

`shard` applies torch's `fully_shard` to each decoder layer, then to the root (embeddings, final norm,
lm_head), with the mixed precision that model.dtype asks for. The gradient reduction is a plain sum
(gradient divide factor 1): each rank has already weighted its loss by its share of the global normaliser
(engine/run/distributed.py `Group.share`), so the reduce-scatter leaves every rank the shard of the
one-process gradient. The whole weights exist on a rank only where they must: `full_state` gathers them
(and the optimizer state) onto rank 0's CPU for a checkpoint, in the same format as one process;
`load_full_state` shards a checkpoint back; engine/model/weights.py unshards every unit while the sampler
takes the weights.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def shard(policy, plan):
    """fully_shard each decoder layer (the classes transformers never splits, `_no_split_modules`), then the root.
    Full fine-tune in bf16/fp16 keeps its fp32 master weights sharded and computes in model.dtype (the FSDP
    form of the autocast one process uses); LoRA keeps its stored dtypes (base in model.dtype, fp32 adapters).
    Gradients are reduced in fp32."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    layer_types = set(getattr(base, "_no_split_modules", None) or ())
    compute = getattr(torch, plan.autocast) if plan.autocast else None  # the precision plan's autocast dtype
    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    layers = [m for m in policy.modules() if type(m).__name__ in layer_types]
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(policy, mp_policy=mp)
    for unit in units(policy):
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no AVG; and the sum is what the weights expect
        unit.set_gradient_divide_factor(1.0)
    return policy


def units(policy) -> list:
    """The FSDP units of a sharded policy (none when it is not sharded)."""
    return [m for m in policy.modules() if isinstance(m, FSDPModule)]


def _options(policy, **kw) -> StateDictOptions:
    """Full (unsharded) state dicts; with LoRA only the trainable adapters, which are all a checkpoint holds."""
    frozen = any(not p.requires_grad for p in policy.parameters())
    return StateDictOptions(full_state_dict=True, ignore_frozen_params=frozen, **kw)


def full_state(policy, optimizer) -> tuple[dict, dict]:
    """(model, optimizer) state dicts gathered whole onto rank 0's CPU (empty on the other ranks); a collective
    that every rank calls. The optimizer's is keyed by parameter name."""
    opts = _options(policy, cpu_offload=True)
    return get_model_state_dict(policy, options=opts), get_optimizer_state_dict(policy, optimizer, options=opts)


def load_full_state(policy, optimizer, weights: dict, optim: dict) -> None:
    """A checkpoint read whole by every rank, sharded into the policy and optimizer (`weights` as
    checkpoint._weights_from reads them: peft's adapter names with LoRA, HF names otherwise)."""
    from peft import PeftModel
    from peft.utils.save_and_load import _insert_adapter_name_into_state_dict

    if isinstance(policy, PeftModel):  # the adapter file names its tensors without the adapter ("lora_A.weight")
        weights = _insert_adapter_name_into_state_dict(weights, policy.active_adapter, "lora_")
    set_model_state_dict(policy, weights, options=_options(policy, strict=False))
    set_optimizer_state_dict(policy, optimizer, optim, options=_options(policy))
