"""Why is my reward not increasing? Read a live or finished run's metrics, samples and events and list what
looks wrong, most important first: the evidence (steps, values), a one-line cause, and a config change to try
(--set KEY=VALUE). A healthy run is one line, "no findings: ...". The rules and thresholds: docs/doctor.md."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..contract.errors import UserError
from ..contract.run_files import CONFIG, EVENTS, METRICS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", type=Path, help="run directory")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON (only JSON on stdout)")


def _refuse(run: Path) -> None:
    """A missing folder, or a folder no trainer has written to, is one line (exit code 2)."""
    try:
        if not run.is_dir():
            why = "not found" if not (run.exists() or run.is_symlink()) else "not a folder"
        elif not any((run / name).exists() for name in (CONFIG, EVENTS, METRICS)):
            why = f"not a run directory (no {CONFIG}, {EVENTS} or {METRICS})"
        else:
            return
    except OSError as err:  # a path the process may not look into
        why = err.strerror.lower() if err.strerror else str(err)
    raise UserError(why, kind="doctor", key="RUN", value=str(run))


def run(args: argparse.Namespace) -> int:
    from ..contract.diagnosis import read_run
    from ..contract.diagnosis_rules import findings, healthy_line
    from ..contract.run_reader import Warnings, printable
    from ..contract.run_state import run_state

    _refuse(args.run)
    warn = Warnings()
    view = read_run(args.run, warn)
    found = findings(view)
    shown = printable(str(args.run))
    for line in warn:  # what could not be read: "FILE: why; what was read instead"
        print(f"warning: {shown}/{line}", file=sys.stderr)
    state = run_state(args.run).state
    if args.json:
        print(
            json.dumps(
                {
                    "run": str(args.run),
                    "state": state,
                    "steps": len(view.rows),
                    "findings": [f.as_dict() for f in found],
                    "summary": None if found else healthy_line(view),
                },
                indent=2,
            )
        )
        return 0
    if not found:
        print(healthy_line(view))
        return 0
    print(
        f"{shown}: {state}, {len(view.rows)} steps; {len(found)} finding{'s' * (len(found) > 1)}, most important first"
    )
    for i, f in enumerate(found, 1):
        print(
            f"{i}. [{f.severity}] {f.title}\n   evidence: {f.evidence}\n   cause:    {f.cause}\n"
            f"   try:      {f.suggestion}"
        )
    return 0
