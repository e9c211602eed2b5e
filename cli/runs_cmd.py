"""List the runs under DIR (default runs/) and their state."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..contract.errors import UserError
from ..contract.metrics import fmt
from ..contract.run_files import RUNS
from ..contract.run_reader import printable
from ..contract.run_state import run_summaries


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", nargs="?", type=Path, default=RUNS, help=f"where runs live (default: {RUNS})")


def run(args: argparse.Namespace) -> int:
    if not args.dir.is_dir():
        raise UserError(f"{str(args.dir)!r} is not a folder", kind="runs")
    rows = run_summaries(args.dir)
    if not rows:
        print(f"no runs under {printable(str(args.dir))}")
        return 0
    header = ("run", "state", "step", "dtype", "reward", "k3")
    table = [header] + [  # a name or a config value may hold anything: one printable line each
        (
            printable(r["name"]),
            r["state"],
            f"{r['step']}/{r['total'] or '?'}",
            printable(r["dtype"]),
            fmt(r["reward"]),
            fmt(r["k3"]),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for r in rows:
        name = printable(r["name"])
        for line in r["warnings"]:  # what could not be read or was skipped: "FILE: why; what was read instead"
            print(f"warning: {name}/{line}", file=sys.stderr)
    return 0
