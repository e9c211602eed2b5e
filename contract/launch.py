"""Starting a trainer, one home for every front end: the supervisor (cli/train_cmd.py: the trainer as its child,
`train --no-supervisor`, or torchrun's ranks), the studio's launcher (studio/launcher.py: `grpo-studio train`
detached, in its own session) and the Python API (api/grpo_trainer.py: the trainer in the script's process).

    check_free(run_dir, resume)       a run directory a live trainer holds, or a new run into a used one: refused
    usable_run_dir(run_dir, flag)     the run directory created now; a file, a bad path, read-only: one line
    given_dir(value, flag, allowed)   a directory flag's value as a path (empty refused)
    preflight_check(cfg, force)       the planner's total against the free memory, before anything loads
    PlainProgress                     the trainer's progress, one line per step (pipes, log files, scripts)
    FRONT_DOOR                        `python -m grpo_studio.cli.main`: every trainer process starts through it
    train_args(target, run_dir, ...)  the arguments of `train` for a recipe (or `--resume RUN`) and its flags
    train_command(args, ...)          the whole command: the front door, or torchrun over it for nproc > 1

The studio and the supervisor start a trainer as a process, never import it: they outlive a trainer that
crashes, and `grpo-studio runs` sees the same run directory whichever started it. Torch-free, as the contract is."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from . import metrics, rundir
from .config import Config
from .errors import UserError, user_path


def usable_run_dir(run_dir: Path, flag: str) -> None:
    """Create the run directory now, before torch loads or a trainer process starts: a path through a file,
    a name too long, a read-only place is one line naming the flag."""
    doing = "cannot use it as the run directory"
    with user_path(flag, str(run_dir), doing):
        is_file = run_dir.is_file()
        if not is_file:
            run_dir.mkdir(parents=True, exist_ok=True)
    if is_file or not os.access(run_dir, os.W_OK):
        raise UserError(f"{doing}: {'it is a file' if is_file else 'not writable'}", key=flag, value=str(run_dir))


def given_dir(value: str, flag: str, allowed: str) -> Path:
    """A directory flag's value as a path; empty or blank is refused (Path("") would be the current directory)."""
    if not value.strip():
        raise UserError(f"empty; allowed: {allowed}", key=flag, value=value)
    return Path(value)


def check_free(run_dir: Path, resume: bool) -> None:
    """Before anything loads: a run directory a live trainer holds is refused (RunLock), so is a new run
    (no --resume) into one that already holds a run, and so is an entry the trainer could not write into
    (rundir.refuse_odd_entries: a FIFO as metrics.jsonl). The trainer checks again as it takes the lock."""
    flag = "--resume" if resume else "--run-dir"
    with user_path(flag, str(run_dir), "cannot use it as the run directory"):
        holder = rundir.lock_holder(run_dir)
        if holder is None and not resume:
            rundir.refuse_held_run(run_dir)
        if holder is None and run_dir.is_dir():
            rundir.refuse_odd_entries(run_dir)
    if holder is not None:
        raise rundir.in_use(run_dir, holder)


def preflight_check(cfg: Config, force: bool, nproc: int = 1) -> None:
    """The planner's total against the device's free memory, before anything loads (contract/planner/preflight.py):
    every rank and the rollout servers the run starts; a run that will not fit is refused in one line unless --force."""
    from .planner import preflight

    verdict = preflight.check(cfg, preflight.devices(), world_size=nproc)
    if verdict.fits or force:
        note = verdict.message if verdict.fits else f"pre-flight (--force): {verdict.message}"
        print(note, flush=True)  # stdout, with the progress: stderr stays the one line of an error
        return
    raise UserError(f"{verdict.message}; or launch anyway with --force", kind="pre-flight")


class PlainProgress:
    """The trainer's progress, one line per step: for pipes, log files and the Python API's scripts."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream, self.start = total, stream, time.time()  # None: sys.stdout as it is at each line

    def warn(self, message: str) -> None:
        print(f"warning: {message}", file=self.stream, flush=True)

    def note(self, message: str) -> None:
        print(message, file=self.stream, flush=True)

    def update(self, row: dict) -> None:
        step = row[metrics.STEP]
        eta = (time.time() - self.start) / max(step, 1) * (self.total - step)
        parts = [
            f"step {step}/{self.total}",
            f"reward {row.get(metrics.REWARD, float('nan')):.3f}",
            f"loss {row.get(metrics.LOSS, float('nan')):.4f}",
            f"k3 {row.get(metrics.K3, float('nan')):.2e}",
        ]
        for key, label in (
            (metrics.EVAL_ACCURACY, "eval_acc"),
            (metrics.EVAL_PASS_AT_K, "pass@k"),
            (metrics.EVAL_MAJ_AT_K, "maj@k"),
        ):
            if key in row:
                parts.append(f"{label} {row[key]:.3f}")
        print("  ".join(parts) + f"  eta {eta:.0f}s", file=self.stream, flush=True)

    def close(self) -> None:
        pass


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
