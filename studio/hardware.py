"""Hardware readings for the studio: GPUs through pynvml ("no GPU" is a normal answer), CPU/RAM through psutil."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass
class Gpu:
    index: int
    name: str
    total_gib: float
    used_gib: float
    util: float  # percent


_nvml_state: bool | None = None


def _nvml():
    """The pynvml module once initialised, or None when there is no NVIDIA driver/GPU."""
    global _nvml_state
    if _nvml_state is False:
        return None
    try:
        import pynvml

        if _nvml_state is None:
            pynvml.nvmlInit()
            _nvml_state = True
        return pynvml
    except Exception:  # no library, no driver, no device: all mean "no GPU"
        _nvml_state = False
        return None


def gpus() -> list[Gpu]:
    nv = _nvml()
    if nv is None:
        return []
    found = []
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            name = nv.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            try:
                util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                util = 0.0
            found.append(Gpu(i, name, mem.total / GIB, mem.used / GIB, util))
    except Exception:
        return []
    return found


def gpu_summary() -> str:
    found = gpus()
    if not found:
        return "no GPU detected"
    g = found[0]
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return f"{g.name}, {g.total_gib:.0f} GiB{more}"


def host() -> dict:
    import psutil

    vm = psutil.virtual_memory()
    return {
        "cpu_percent": psutil.cpu_percent(interval=None),
        "cpus": psutil.cpu_count() or 1,
        "ram_used_gib": (vm.total - vm.available) / GIB,
        "ram_total_gib": vm.total / GIB,
    }
