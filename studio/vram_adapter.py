"""The studio's one door to the VRAM planner (contract/planner/vram.py, pure python): `plan(cfg, mode,
gpu_gib)` returns what the VRAM panel shows, including the inverse-solved suggestion."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ..contract import model_card
from ..contract.config import Config
from ..contract.errors import UserError
from ..contract.planner import vram


@dataclass
class Plan:
    rows: list[vram.Row] = field(default_factory=list)
    total: float = 0.0
    mode: str = "documented"
    gpu_gib: float | None = None
    fits: bool | None = None
    suggestion: str = ""
    error: str = ""
    peak_rule: str = ""
    devices: list = field(default_factory=list)  # vram.Device per device when the planner splits the run
    params: str = ""  # the model's weights in words; an MoE's active ones too (Breakdown.params_line)


# What the panel solves for, in order: the first one the planner can answer is shown.
SOLVE = [("max_completion_len", "max completion length that fits"), ("num_generations", "max generations that fit")]


@functools.lru_cache(maxsize=64)
def _card(name: str):
    """Model cards by name; cached because the form recomputes on every keystroke."""
    return model_card.load(name)


def plan(
    cfg: Config, mode: str = "documented", gpu_gib: float | None = None, solve: bool = True, world_size: int = 1
) -> Plan:
    try:
        card = _card(cfg.model.name)
        result = vram.estimate(card, cfg, mode=mode, gpu_gib=gpu_gib, **_ranks(mode, world_size))
    except UserError as err:
        return Plan(mode=mode, gpu_gib=gpu_gib, error=str(err))
    except Exception as err:  # the panel must never take the studio down
        return Plan(mode=mode, gpu_gib=gpu_gib, error=f"vram error: {type(err).__name__}: {err}")
    out = Plan(
        result.rows,
        result.total_gib,
        mode,
        gpu_gib,
        result.fits,
        peak_rule=result.peak_rule,
        devices=list(getattr(result, "devices", None) or []),
        params=result.params_line,
    )
    if gpu_gib and solve:
        out.suggestion = suggest(card, cfg, mode, gpu_gib, world_size)
    return out


def _ranks(mode: str, world_size: int) -> dict:
    """The planner's world_size: accurate mode plans each device of a data-parallel run; Unsloth's documented
    arithmetic is the whole run on one GPU (an upper bound for each rank)."""
    return {"world_size": world_size} if mode == "accurate" and world_size > 1 else {}


def suggest(card, cfg: Config, mode: str, gpu_gib: float, world_size: int = 1) -> str:
    largest, unbounded = "", False
    for key, label in SOLVE:
        try:
            sol = vram.solve(card, cfg, key, gpu_gib, mode=mode, **_ranks(mode, world_size))
        except Exception:  # the panel must never take the studio down
            continue
        if sol.status == "fits":
            return f"{label}: {sol.value:,}"
        if sol.status == "never_outgrows":
            unbounded = True
        else:
            largest = sol.limiting_row
    if unbounded:
        return "completion length and generations are not what limits this run on this GPU"
    why = f" (largest row: {largest})" if largest else ""
    return f"no length or generation count fits{why}: try LoRA, a 4-bit base, a smaller model or a bigger GPU"
