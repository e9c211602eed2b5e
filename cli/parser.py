"""What every grpo-studio command's parser shares: a usage mistake is one line on stderr and exit code 2,
a value outside a flag's choices is a UserError, and the RECIPE / --set / --runs-dir arguments."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..contract.bundled import DEFAULT_RECIPE
from ..contract.errors import UserError
from ..contract.rundir import RUNS


def add_recipe(parser: argparse.ArgumentParser) -> None:
    """RECIPE and repeatable --set KEY=VALUE, as `grpo-studio` and `grpo-studio train` take them."""
    parser.add_argument("recipe", nargs="?", default=DEFAULT_RECIPE, help="preset name or FILE.toml")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")


def add_runs_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-dir", type=Path, default=RUNS, help=f"where runs live (default: {RUNS})")


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)

    def parse_known_args(self, args=None, namespace=None):
        """Strict, so a command's own parser reports what it does not know (`grpo-studio train: error:
        unrecognized arguments: ...`), not the parser of the whole tree."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def _check_value(self, action: argparse.Action, value) -> None:
        """A value outside a flag's choices is a UserError of the command (`vram error: --mode = 'fast':
        allowed: documented, accurate`), with a "did you mean" for a near miss."""
        if action.choices is not None and value not in action.choices:
            command = self.prog.split()[1:2] or [self.prog]  # "grpo-studio bench mismatch" -> bench
            key = action.option_strings[0] if action.option_strings else action.metavar or action.dest
            raise UserError(kind=command[0], key=key, value=value, allowed=list(action.choices))
