"""The VRAM planner's accurate mode, device by device (docs/vram.md, "Devices").

  training ranks   `world_size` processes of `train --nproc N` (engine/run/distributed.py), each on its own device
                   and its share of the step's prompts: activations, logits and the hf rollout's KV cache are
                   those of its rows. train.parallel = ddp: every rank holds the whole model and its full
                   trainable state, and after the backward the gradient all-reduce's fp32 buffers. fsdp
                   (FSDP2 fully_shard, engine/model/fsdp.py): weights and trainable state are divided among the
                   ranks; the root unit is gathered whole for the forward and backward, each layer in turn.
  rollout devices  rollout.colocate = false: vLLM runs in `grpo-studio rollout-serve` on a device of its own
                   (one shared server with rollout.server, else one started by each rank), holding
                   gpu_memory_utilization × the device's size, or without a size its need.

Pure python, like contract/planner/vram.py.
"""

from __future__ import annotations

from .. import backend
from ..config import Config, check_processes
from ..dtypes import DTYPES
from ..model_card import Card
from .breakdown import ALLOCATOR_MARGIN, BYTES, GIB, Device, Row, _g, _n, phase_peak
from .vram import accurate, vllm_need, vllm_row


def plan(card: Card, cfg: Config, gpu_gib: float | None, device: str, world_size: int) -> tuple[list[Device], str]:
    """Every device of the run and the rule of the training devices' peak."""
    check_processes(cfg, world_size, "--nproc", kind="vram")
    rows, rule, overlap = accurate(card, cfg, gpu_gib, device, world_size)
    if world_size > 1 and cfg.train.parallel == "fsdp":
        at = next(i for i, r in enumerate(rows) if r.phase != "persistent")
        rows.insert(at, Row("FSDP gathered weights", *gathered_weights(card, cfg), "train"))
    if world_size > 1 and cfg.train.parallel == "ddp":
        at = next((i for i, r in enumerate(rows) if r.phase not in ("persistent", "train")), len(rows))
        rows.insert(at, Row("ddp gradient all-reduce", *allreduce_bytes(card, cfg), "reduce"))
    total = device_total(rows, overlap, device)
    names = ["train"] if world_size == 1 else [f"train rank {i}" for i in range(world_size)]
    devices = [Device(name, "train", list(rows), total) for name in names]
    vllm = backend.resolve(cfg.rollout.backend, load_in_4bit=cfg.model.load_in_4bit)[0] == "vllm"
    if vllm and not cfg.rollout.colocate:
        servers = 1 if cfg.rollout.server or world_size == 1 else world_size
        devices += rollout_devices(card, cfg, gpu_gib, servers)
    return devices, rule


def gathered_weights(card: Card, cfg: Config) -> tuple[float, str]:
    """What FSDP2 holds unsharded during the forward and backward (engine/model/fsdp.py: fully_shard on each decoder
    layer, then the root): the root's parameters (embeddings, lm_head, final norm), which FSDP2 does not
    reshard after the forward, and one decoder layer's at a time; in the dtype they compute in (LoRA: as
    stored; full FT: model.dtype through the mixed-precision policy). A full fine-tune also holds their
    unsharded fp32 gradients until each unit's reduce-scatter (the root's from the lm_head's backward on)."""
    m = cfg.model
    layer = card.layer_linear_params() + card.expert_params() + card.layer_small_params()
    root = card.total_params() - card.layers * layer
    per = BYTES[m.dtype] if (m.lora_rank > 0 or DTYPES[m.dtype].autocast) else 4
    text = f"root (embeddings, lm_head, norm) {_n(root)} + one decoder layer {_n(layer)} params · {per} B"
    if m.lora_rank == 0:
        per += 4
        text += " + their unsharded fp32 gradients before the reduce-scatter (4 B)"
    return _g((root + layer) * per), text


def allreduce_bytes(card: Card, cfg: Config) -> tuple[float, str]:
    """engine/run/distributed.py reduce_gradients: every grad times its rank's weight in fp32, then one flat fp32
    bucket of them all for the all-reduce: 8 B per trainable parameter at once, after the backward."""
    m = cfg.model
    n = card.lora_params(m.lora_rank, m.lora_target_modules) if m.lora_rank > 0 else card.total_params()
    return _g(
        8.0 * n
    ), f"{_n(n)} trainable params · 8 B (weighted fp32 grads + the flat fp32 bucket, engine/run/distributed.py)"


def device_total(rows: list[Row], overlap: bool, device: str) -> float:
    """A training device's total: the phase peak, plus on CUDA an allocator-margin row (appended to `rows`)
    and the overhead rows."""
    tensors = phase_peak(rows, overlap)
    if device == "cuda":
        rows.append(
            Row(
                "allocator margin",
                ALLOCATOR_MARGIN * tensors,
                f"{ALLOCATOR_MARGIN:.0%} of {tensors:.2f} GiB tensor memory (caching-allocator fragmentation)",
                "overhead",
            )
        )
    return tensors + sum(r.gib for r in rows if r.phase == "overhead")


def rollout_devices(card: Card, cfg: Config, gpu_gib: float | None, servers: int) -> list[Device]:
    """The rollout server's device(s): vLLM's one row; it fits when its memory holds the need."""
    row = vllm_row(card, cfg, gpu_gib)
    fits = vllm_need(card, cfg)[0] <= row.gib * GIB if gpu_gib else None
    names = ["rollout"] if servers == 1 else [f"rollout server {i}" for i in range(servers)]
    return [Device(name, "rollout", [row], row.gib, fits) for name in names]
