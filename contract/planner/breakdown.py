"""What a VRAM plan is made of: the byte sizes per dtype and the planner's constants, a Row (GiB, the formula
that produced it, the phase in which it is live), a Device (one device's rows and total), a Breakdown (every
device of the run), and phase_peak, the rule that adds a device's rows into its peak.

Pure python, like contract/planner/vram.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from ..dtypes import DTYPES

GIB = 2**30
# When a row's memory is live: the whole run, while sampling, during the forward/backward, after the backward
# (the ddp gradient all-reduce: activations are freed by then), or not tensor memory at all (CUDA context,
# allocator margin). The accurate total is picked by phase (phase_peak).
PHASES = ("persistent", "rollout", "train", "reduce", "overhead")
BYTES = {name: d.train_bytes for name, d in DTYPES.items()}  # trainer storage per weight
ROLLOUT_BYTES = {name: d.rollout_bytes for name, d in DTYPES.items()}  # rollout weight / KV element
NF4_BLOCK = 64  # bitsandbytes 4-bit: one absmax scale per 64 weights
NF4_NESTED_BLOCK = 256  # double quantisation: the absmax scales in uint8, one fp32 scale per 256 of them
LOGPROB_CHUNK_ROWS = 8  # engine/train/logprobs.py token_logprobs(chunk_rows=8)
CUDA_CONTEXT_GIB = 0.5  # CUDA context + cuBLAS workspace, typical for torch on recent GPUs
ALLOCATOR_MARGIN = 0.05  # caching-allocator fragmentation, share of the tensor total
VLLM_HEADROOM = 1.2  # rollout.gpu_memory_utilization = auto: the need for one rollout, plus 20% ...
VLLM_OVERHEAD_GIB = 1.0  # ... plus vLLM's own non-KV memory (profiling activations, sampler buffers, graphs)


@dataclass
class Row:
    name: str
    gib: float
    formula: str
    phase: str  # one of PHASES
    in_total: bool = True


@dataclass
class Device:
    """One device of the run: a training rank (kind "train") or a rollout server's (kind "rollout"), its
    rows and its total; `fits` is None without a device size."""

    name: str
    kind: Literal["train", "rollout"]
    rows: list[Row] = field(default_factory=list)
    total_gib: float = 0.0
    fits: bool | None = None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "rows": [asdict(r) for r in self.rows],
            "total_gib": round(self.total_gib, 4),
            "fits": self.fits,
        }


@dataclass
class Breakdown:
    """`devices`: every device of the run; `rows` are the first training device's (all training ranks hold
    the same rows); `total_gib` is the largest device's total and `fits` whether every device fits, so a
    caller that reads one total and one verdict stays right with more than one device."""

    mode: str
    model: str
    rows: list[Row] = field(default_factory=list)
    total_gib: float = 0.0
    gpu_gib: float | None = None
    fits: bool | None = None
    peak_rule: str = ""
    devices: list[Device] = field(default_factory=list)
    params: int = 0  # the model's weights (model_card.Card.total_params)
    active_params: int = 0  # of them, what one token multiplies by (less than params for an MoE)
    params_line: str = ""  # an MoE's total and active weights in words (Card.params_line); "" for a dense model

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)

    def device(self, name: str) -> Device:
        return next(d for d in self.devices if d.name == name)

    def largest(self) -> Device:
        return max(self.devices, key=lambda d: d.total_gib)

    def to_json(self) -> dict:
        return {
            "mode": self.mode,
            "model": self.model,
            "rows": [{k: v for k, v in asdict(r).items()} for r in self.rows],
            "total_gib": round(self.total_gib, 4),
            "gpu_gib": self.gpu_gib,
            "fits": self.fits,
            "peak_rule": self.peak_rule,
            "devices": [d.to_json() for d in self.devices],
            "params": self.params,
            "active_params": self.active_params,
        }


def _g(nbytes: float) -> float:
    return nbytes / GIB


def _n(x: float) -> str:
    """A compact number for formula text: 20480 -> 20480, 8.03e9 -> 8.03e9."""
    return f"{x:.3g}" if abs(x) >= 1e6 else f"{x:g}"


def phase_peak(rows: list[Row], overlap: bool) -> float:
    """Tensor memory at the peak: the persistent rows plus the rollout and training phases, summed when the
    rollout's memory stays live during training (`overlap`), else the larger of the two; training is the
    larger of the forward/backward and the gradient all-reduce after it."""
    by = {phase: sum(r.gib for r in rows if r.in_total and r.phase == phase) for phase in PHASES}
    train = max(by["train"], by["reduce"])
    return by["persistent"] + (by["rollout"] + train if overlap else max(by["rollout"], train))
