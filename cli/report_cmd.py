"""Export a run's charts to PNG (matplotlib) and a one-page HTML summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..contract.errors import UserError
from ..contract.run_files import METRICS
from ..contract.run_reader import printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="run directory")
    parser.add_argument("--out", type=Path, help="output folder (default: RUN/report)")


def run(args: argparse.Namespace) -> int:
    metrics = args.run / METRICS
    if not args.run.is_dir() or not (metrics.exists() or metrics.is_symlink()):
        raise UserError(f"{str(args.run)!r} has no {METRICS} (not a run directory, or no step yet)", kind="report")
    from ..studio import report
    from ..studio.rundata import RunData

    data = RunData(args.run)  # what the report will show: what it cannot read is a warning, never a traceback
    data.drain()
    for line in data.warnings():
        print(f"warning: {printable(str(args.run))}/{line}", file=sys.stderr)
    out = Path(args.out or args.run / "report")
    try:
        out = report.export(args.run, out, data)
    except OSError as err:  # a full disk, a read-only or unwritable --out
        where = err.filename or out
        reason = err.strerror.lower() if err.strerror else str(err)
        raise UserError(f"cannot write {where}: {reason}; the report in {out} is not complete", kind="report") from None
    print(f"report: {printable(str(out / 'index.html'))} ({len(list(out.glob('*.png')))} charts)")
    return 0
