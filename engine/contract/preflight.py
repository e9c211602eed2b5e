"""The pre-flight check: before a run loads anything, does the VRAM planner's total fit the memory that is
free on the device it will use? Refused in one line naming the largest row and the planner's suggestion;
`grpo-studio train --force` (or "launch anyway" in the studio) goes ahead regardless.

Pure python (pynvml, psutil): the headless supervisor and the studio run it before a trainer starts.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

from grpo_studio.engine.contract import model_card, vram
from grpo_studio.engine.contract.config import Config
from grpo_studio.engine.contract.errors import UserError

GIB = 2 ** 30
SUGGEST_KEYS = ("num_generations", "max_completion_len")  # what the planner may shrink, in this order


@dataclass
class Device:
    """Memory of the device a run will use: the first visible GPU (pynvml), else host RAM (psutil)."""
    kind: str                       # "cuda" | "cpu"
    name: str
    total_gib: float
    free_gib: float
    others: list[str] = field(default_factory=list)  # other processes on the GPU: "pid 123 (python) 9.1 GiB"

    def where(self) -> str:
        return f"{self.name}" if self.kind == "cuda" else "host RAM"


def _first_visible_gpu() -> int:
    """The NVML index of the first GPU in CUDA_VISIBLE_DEVICES (an index; UUIDs and MIG ids are read as 0)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def gpu() -> Device | None:
    """The first visible NVIDIA GPU through pynvml, or None when there is none (no driver, no pynvml)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU, no pynvml: all mean "no GPU"
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(_first_visible_gpu())
        name = pynvml.nvmlDeviceGetName(handle)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        others = []
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid():
                continue
            try:
                import psutil

                pname = psutil.Process(proc.pid).name()
            except Exception:  # another container's pid, or gone
                pname = "?"
            used = (proc.usedGpuMemory or 0) / GIB
            others.append(f"pid {proc.pid} ({pname}) {used:.1f} GiB")
        return Device("cuda", name.decode() if isinstance(name, bytes) else str(name), info.total / GIB,
                      info.free / GIB, others)
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def host() -> Device:
    import psutil

    mem = psutil.virtual_memory()
    return Device("cpu", "host RAM", mem.total / GIB, mem.available / GIB)


def device() -> Device:
    """Where a run started here trains: the first visible GPU, else the CPU and its RAM."""
    return gpu() or host()


@dataclass
class Verdict:
    fits: bool
    need_gib: float
    free_gib: float
    message: str    # one line: why it does not fit (a UserError's text), or what was checked


def estimate(cfg: Config, card: model_card.Card, dev: Device) -> vram.Breakdown:
    """The planner's accurate total for this device (on CPU the need itself: vLLM-cpu sizes its KV cache
    from VLLM_CPU_KVCACHE_SPACE, not from gpu_memory_utilization)."""
    return vram.estimate(card, cfg, "accurate", dev.total_gib if dev.kind == "cuda" else None, device=dev.kind)


def check(cfg: Config, dev: Device, card: model_card.Card | None = None) -> Verdict:
    """Compare the planner's total with the device's free memory. A model without a card or a readable
    config.json (a hub id not downloaded yet) cannot be planned: the verdict then fits, saying so."""
    if card is None:
        try:
            card = model_card.load(cfg.model.name)
        except UserError as err:
            return Verdict(True, 0.0, dev.free_gib, f"pre-flight skipped: {str(err).split(' error: ', 1)[-1]}")
    est = estimate(cfg, card, dev)
    need = est.total_gib
    if need <= dev.free_gib:
        return Verdict(True, need, dev.free_gib, f"pre-flight: {need:.2f} GiB planned, {dev.free_gib:.2f} GiB free "
                                                 f"on {dev.where()}")
    largest = max((r for r in est.rows if r.in_total), key=lambda r: r.gib)
    others = f"; other processes: {', '.join(dev.others)}" if dev.others else ""
    message = (f"the run needs {need:.2f} GiB and {dev.where()} has {dev.free_gib:.2f} GiB free "
               f"(of {dev.total_gib:.2f}){others}; largest row: {largest.name} {largest.gib:.2f} GiB; "
               f"{suggestion(cfg, card, dev)}")
    return Verdict(False, need, dev.free_gib, message)


def suggestion(cfg: Config, card: model_card.Card, dev: Device) -> str:
    """The planner's way out: gradient checkpointing when it alone makes the run fit, else the largest
    num_generations or max_completion_len that fits the free memory (vram.solve), else a 4-bit base or a
    smaller model."""
    if not cfg.model.gradient_checkpointing:
        recompute = copy.deepcopy(cfg)
        recompute.model.gradient_checkpointing = True
        total = estimate(recompute, card, dev).total_gib
        if total <= dev.free_gib:
            return f"the planner suggests --set model.gradient_checkpointing=true ({total:.2f} GiB)"
    for key in SUGGEST_KEYS:
        sol = vram.solve(card, cfg, key, dev.free_gib, device=dev.kind)
        if sol.status == "fits" and sol.value >= (2 if key == "num_generations" else 1):
            return f"the planner suggests --set rollout.{key}={sol.value} ({sol.total_gib:.2f} GiB)"
    if not cfg.model.load_in_4bit and cfg.model.lora_rank > 0:
        return "no generation setting fits: try model.load_in_4bit = true or a smaller model"
    return "no generation setting fits: try a smaller model"
