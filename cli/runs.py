"""`grpo-studio runs [DIR]`: the runs under DIR (default runs/) and their state."""

from __future__ import annotations

import sys
from pathlib import Path

from grpo_studio.cli.parser import OneLineParser
from grpo_studio.engine.contract.metrics import fmt
from grpo_studio.engine.contract.rundir import run_summaries


def main(argv: list[str]) -> int:
    p = OneLineParser(prog="grpo-studio runs", description="List runs and their state.")
    p.add_argument("dir", nargs="?", type=Path, default=Path("runs"))
    args = p.parse_args(argv)
    if not args.dir.is_dir():
        print(f"runs error: {str(args.dir)!r} is not a folder", file=sys.stderr)
        return 2
    rows = run_summaries(args.dir)
    if not rows:
        print(f"no runs under {args.dir}")
        return 0
    header = ("run", "state", "step", "dtype", "reward", "k3")
    table = [header] + [(r["name"], r["state"], f"{r['step']}/{r['total'] or '?'}", r["dtype"], fmt(r["reward"]),
                         fmt(r["k3"])) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0
