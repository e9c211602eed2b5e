"""The Device tab's memory rows: one planned number for the memory the run trains in, the rehearsal's peak and
the run's peak next to it, and a line on why they differ.

planned    the pre-flight's plan (contract/planner/preflight.check) for the device the run trains on: the
           number the pre-flight and the rehearsal print ("0.13 GiB planned (host RAM)"). The rehearsal's event
           carries it; without one it is planned here for this machine's device, as `train` would.
rehearsal  the one rehearsal step's peak (engine/run/rehearsal.py): torch.cuda.max_memory_allocated on a GPU,
           the growth of peak RSS over the process's RSS before the step on a CPU.
run peak   the largest mem/peak_gib of the run's steps: torch.cuda.max_memory_allocated on a GPU, the trainer's
           whole peak RSS on a CPU (Python, torch and the tokenizer included, which a plan does not count).

Files and the planner only: no torch here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..contract import metrics
from ..contract.errors import UserError
from ..contract.metrics import fmt
from ..contract.planner import preflight
from ..contract.planner.breakdown import CUDA_CONTEXT_GIB
from .launcher import load_run_config
from .rundata import RunData


@dataclass
class Plan:
    gib: float
    where: str  # "host RAM" or a GPU's name: the memory kind
    source: str  # "the run's pre-flight" or "planned here"


def plan_here(run_dir: Path) -> Plan | None:
    """The pre-flight's planned total for this machine's device (None when the run's config does not load or
    its model cannot be planned)."""
    try:
        cfg = load_run_config(Path(run_dir))
        devs = preflight.devices()
        verdict = preflight.check(cfg, devs)
    except (UserError, OSError, ValueError):  # a config the studio cannot plan: the row says "–"
        return None
    return Plan(verdict.need_gib, devs[0].where(), "planned here") if verdict.need_gib else None


def planned(run: RunData, here: Plan | None) -> Plan | None:
    """The rehearsal's planned number when the run has one (what its pre-flight planned), else `here`."""
    event = run.rehearsal or {}
    gib, where = event.get("planned_gib"), event.get("where")
    if isinstance(gib, (int, float)) and gib > 0 and isinstance(where, str):
        return Plan(float(gib), where, "the run's pre-flight")
    return here


def rows(run: RunData, plan: Plan | None) -> tuple[list[tuple[str, str]], str]:
    """(label, value) rows for the memory the run trains in, and the note that says how they differ."""
    where = plan.where if plan else (run.rehearsal or {}).get("where", "")
    gpu = bool(where) and where != "host RAM"
    kind = "GPU memory" if gpu else "host RAM"
    out = [(f"planned {kind}", f"{plan.gib:.2f} GiB  ({plan.source}, {plan.where})" if plan else "–")]
    event = run.rehearsal or {}
    if event.get("phase") == "running":
        out.append(("rehearsal peak", "rehearsing …"))
    elif isinstance(event.get("measured_gib"), (int, float)):
        out.append(("rehearsal peak", f"{event['measured_gib']:.2f} GiB  ({event.get('how', 'measured')})"))
    peak = max((v for v in run.columns.get(metrics.PEAK_GIB, []) if v is not None), default=None)
    how = "torch.cuda.max_memory_allocated" if gpu else "the trainer's peak RSS"
    out.append(("run peak", f"{fmt(peak)} GiB  (mem/peak_gib, {how})" if peak is not None else "– (no step yet)"))
    if gpu:
        note = (
            f"planned counts {CUDA_CONTEXT_GIB:.2f} GiB of CUDA context and cuBLAS workspace, which "
            "torch.cuda.max_memory_allocated (rehearsal, run peak) does not"
        )
    else:
        note = (
            "planned: the step's tensors; rehearsal: the step's growth of peak RSS; run peak: the trainer's whole "
            "peak RSS, Python and torch included"
        )
    return out, note
