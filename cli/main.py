"""The `grpo-studio` command: one argparse tree for every command, and one error boundary.

Each command is a module in cli/ with `add_arguments(parser)` and `run(args) -> int`; its docstring is
its --help description. Importing this loads neither torch nor textual: a command imports its
implementation (engine/, studio/, benchmarks/) when it runs.
"""

from __future__ import annotations

import importlib
import os
import sys

from ..contract.errors import UserError
from ..contract.rundir import RunLock
from .bench_cmd import BENCHMARKS
from .parser import OneLineParser

COMMANDS = {  # name -> one line for `grpo-studio --help`; the module is grpo_studio.cli.<name, - as _>
    "train": "train headless, writing a run directory",
    "vram": "estimate GPU memory for a config",
    "runs": "list runs and their state",
    "attach": "open the studio on a run",
    "bench": f"run a benchmark ({', '.join(BENCHMARKS)})",
    "rewards": "list the built-in reward functions",
    "report": "export a run's charts to PNG and an HTML summary",
    "doctor": "why is my reward not increasing: a run's findings, most important first",
    "config": "list every config key: type, default, allowed values, help",
    "export": "export a checkpoint: merged folder, GGUF, or a Hub push",
    "rollout-serve": "serve rollouts from a vLLM engine in its own process (rollout.colocate = false)",
}
STUDIO = "studio"  # the bare form, `grpo-studio [RECIPE|FILE.toml] [--set KEY=VALUE]...`: no command word
USAGE = (
    "grpo-studio [RECIPE|FILE.toml] [--set KEY=VALUE]... [--runs-dir DIR]   open the studio\n"
    "       grpo-studio COMMAND [ARGS]..."
)


def build_parser() -> OneLineParser:
    from ..engine import __version__

    parser = OneLineParser(prog="grpo-studio", usage=USAGE)
    parser.add_argument("-V", "--version", action="version", version=f"grpo-studio {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in (STUDIO, *COMMANDS):
        module = importlib.import_module(
            f"grpo_studio.cli.{name.replace('-', '_')}_cmd"
        )  # rollout-serve: rollout_serve_cmd
        listed = {"help": COMMANDS[name]} if name in COMMANDS else {}  # the bare form is not a command word
        sub = commands.add_parser(
            name, prog="grpo-studio" if name == STUDIO else f"grpo-studio {name}", description=module.__doc__, **listed
        )
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    return parser


def route(argv: list[str]) -> list[str]:
    """Anything that does not start with a command word (or -h, -V) is the bare form that opens the studio."""
    if argv and (argv[0] in COMMANDS or argv[0] in ("-h", "--help", "-V", "--version")):
        return argv
    return [STUDIO, *argv]


def main(argv: list[str] | None = None) -> int:
    """Run one command. The one error boundary: a user mistake is one line on stderr and exit code 2;
    a closed pipe or Ctrl-C ends it quietly (no traceback)."""
    args = None
    try:
        args = build_parser().parse_args(route(sys.argv[1:] if argv is None else list(argv)))
        return args.handler(args)
    except SystemExit as done:  # --help, --version, or a usage mistake argparse has printed
        return int(done.code or 0)
    except UserError as err:
        print(err.line(getattr(args, "error_kind", None)), file=sys.stderr)
        return 2
    except RunLock as err:
        print(err, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # silence the flush at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
