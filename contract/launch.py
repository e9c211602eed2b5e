"""The command lines that start a trainer, one home for both front ends: the studio's launcher
(studio/launcher.py: `grpo-studio train` detached, in its own session) and the supervisor
(cli/train_cmd.py: the trainer as its child, `train --no-supervisor`, or torchrun's ranks).

    FRONT_DOOR                       `python -m grpo_studio.cli.main`: every process starts through it
    train_args(target, run_dir, ...)  the arguments of `train` for a recipe (or `--resume RUN`) and its flags
    train_command(args, ...)          the whole command: the front door, or torchrun over it for nproc > 1

A trainer is always started as a process, never imported: the studio and the supervisor outlive a trainer that
crashes, and `grpo-studio runs` sees the same run directory whichever started it."""

from __future__ import annotations

import sys
from pathlib import Path

FRONT_DOOR = [sys.executable, "-m", "grpo_studio.cli.main"]
NO_SUPERVISOR = "--no-supervisor"  # the supervisor's child: train in this process


def train_args(
    recipe: str | None,
    run_dir: Path,
    sets: list[str] = (),
    *,
    resume: bool = False,
    force: bool = False,
    rehearse: bool = False,
    nproc: int = 1,
) -> list[str]:
    """`train`'s arguments: a recipe into `run_dir`, or `--resume run_dir`; then --set, --rehearse, --force, --nproc."""
    args = ["--resume", str(run_dir)] if resume else [str(recipe), "--run-dir", str(run_dir)]
    for setting in sets:
        args += ["--set", setting]
    args += [flag for flag, on in (("--rehearse", rehearse), ("--force", force)) if on]
    args += ["--nproc", str(nproc)] if nproc > 1 else []
    return args


def train_command(args: list[str], *, trainer: bool = False, ranks: int = 1) -> list[str]:
    """`grpo-studio train ARGS` (supervised); `trainer`: the supervisor's child, training in its own process; with
    `ranks` > 1 that child is torchrun, starting one trainer per rank (it stops them all when one fails)."""
    if not trainer:
        return [*FRONT_DOOR, "train", *args]
    if ranks > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
        return [*launcher, "-m", "grpo_studio.cli.main", "train", NO_SUPERVISOR, *args]
    return [*FRONT_DOOR, "train", NO_SUPERVISOR, *args]
