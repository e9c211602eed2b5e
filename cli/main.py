"""The `grpo-studio` command. Imports no torch: heavy subcommands import their engine module lazily."""

from __future__ import annotations

import os
import sys

SUBCOMMANDS = {
    "train": ("grpo_studio.cli.train", "train headless, writing a run directory"),
    "vram": ("grpo_studio.cli.vram", "estimate GPU memory for a config"),
    "runs": ("grpo_studio.cli.runs", "list runs and their state"),
    "attach": ("grpo_studio.studio.app", "open the studio on a run"),
    "bench": ("benchmarks", "run a benchmark (mismatch, rollout, vram-accuracy, ui)"),
    "rewards": ("grpo_studio.cli.rewards", "list the built-in reward functions"),
    "report": ("grpo_studio.studio.report", "export a run's charts to PNG and an HTML summary"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: grpo-studio [RECIPE|FILE.toml] [--set KEY=VALUE]...   open the studio",
             "       grpo-studio COMMAND [ARGS]...", "", "commands:"]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run a command; a closed pipe or Ctrl-C ends it quietly (no traceback)."""
    try:
        return dispatch(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # silence the flush at exit
        return 0


def dispatch(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv and argv[0] in ("-V", "--version"):
        from grpo_studio.engine import __version__

        print(f"grpo-studio {__version__}")
        return 0
    if argv and argv[0] in SUBCOMMANDS:
        import importlib

        module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
        entry = getattr(module, "attach_main" if argv[0] == "attach" else "main")
        return entry(argv[1:])
    from grpo_studio.studio import app

    return app.main(argv)


if __name__ == "__main__":
    sys.exit(main())
