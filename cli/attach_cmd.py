"""Open the studio on a run: its dashboard, with the whole history replayed."""

from __future__ import annotations

import argparse
import sys

from grpo_studio.cli.parser import add_runs_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory, or a run name under --runs-dir")
    add_runs_dir(parser)


def run(args: argparse.Namespace) -> int:
    """What the run directory cannot give (an unreadable file, a config.toml that does not load) is a
    `warning:` line on stderr, and the dashboard opens on what is left; the dashboard says the rest."""
    from grpo_studio.contract import config as cfgmod
    from grpo_studio.contract.bundled import DEFAULT_RECIPE
    from grpo_studio.contract.errors import UserError
    from grpo_studio.contract.run_files import CONFIG
    from grpo_studio.contract.run_reader import Warnings, read_config
    from grpo_studio.contract.run_state import run_state
    from grpo_studio.studio import app, launcher

    run_dir = app.resolve_run(args.run, args.runs_dir)
    warn = Warnings()
    state = run_state(run_dir)
    warn.extend(state.warnings)
    read_config(run_dir, warn)
    try:
        cfg = launcher.load_run_config(run_dir)
    except UserError as err:  # the setup screen (F2) starts from the default recipe instead
        warn(f"{CONFIG}: does not load ({err.line()}); the setup screen starts from {DEFAULT_RECIPE}")
        cfg = cfgmod.load(DEFAULT_RECIPE)
    for line in warn:
        print(f"warning: {run_dir}/{line}", file=sys.stderr)
    if state.skipped_rows:  # as `grpo-studio runs` says it
        print(
            f"warning: {run_dir}: skipped {state.skipped_rows} malformed lines (not a JSON object with the fields "
            f"its file needs)",
            file=sys.stderr,
        )
    return app._run(app.StudioApp(cfg, str(run_dir), args.runs_dir, attach=run_dir, watch_tty=app._watch_tty()))
