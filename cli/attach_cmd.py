"""Open the studio on a run: its dashboard, with the whole history replayed."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..contract.run_files import RUNS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory, or a run name under --runs-dir")
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help=f"where a run name is looked up (default: {RUNS}) and the runs list's folder (default: the run's own"
        " folder, where its forks land)",
    )


def run(args: argparse.Namespace) -> int:
    from ..studio import app

    return app.attach(args.run, args.runs_dir)
