"""Open the studio on a run: its dashboard, with the whole history replayed."""

from __future__ import annotations

import argparse

from .parser import add_runs_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory, or a run name under --runs-dir")
    add_runs_dir(parser)


def run(args: argparse.Namespace) -> int:
    from ..studio import app

    return app.attach(args.run, args.runs_dir)
