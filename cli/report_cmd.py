"""Export a run's charts to PNG (matplotlib) and a one-page HTML summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from grpo_studio.contract.errors import UserError
from grpo_studio.contract.rundir import METRICS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="run directory")
    parser.add_argument("--out", type=Path, help="output folder (default: RUN/report)")


def run(args: argparse.Namespace) -> int:
    if not (args.run / METRICS).is_file():
        raise UserError(f"{str(args.run)!r} has no {METRICS} (not a run directory, or no step yet)", kind="report")
    from grpo_studio.studio import report

    out = report.export(args.run, args.out)
    print(f"report: {out / 'index.html'} ({len(list(out.glob('*.png')))} charts)")
    return 0
