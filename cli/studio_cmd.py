"""Open the grpo-studio terminal studio on a recipe (preset name or FILE.toml) with `--set` overrides."""

from __future__ import annotations

import argparse

from .parser import add_recipe, add_runs_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_recipe(parser)
    add_runs_dir(parser)


def run(args: argparse.Namespace) -> int:
    from ..studio import app

    return app.open_studio(args.recipe, args.sets, args.runs_dir)
