"""Train headless, writing a run directory: a rich progress bar on a terminal, one plain line per step
when piped."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from grpo_studio.cli.parser import add_recipe
from grpo_studio.engine.contract import config, metrics
from grpo_studio.engine.contract.errors import UserError
from grpo_studio.engine.contract.rundir import CONFIG, RUNS


class PlainProgress:
    """One line per step, for pipes and log files."""

    def __init__(self, total: int, stream=sys.stdout):
        self.total, self.stream, self.start = total, stream, time.time()

    def warn(self, message: str) -> None:
        print(f"warning: {message}", file=self.stream, flush=True)

    def update(self, row: dict) -> None:
        step = row[metrics.STEP]
        eta = (time.time() - self.start) / max(step, 1) * (self.total - step)
        parts = [f"step {step}/{self.total}", f"reward {row.get(metrics.REWARD, float('nan')):.3f}",
                 f"loss {row.get(metrics.LOSS, float('nan')):.4f}", f"k3 {row.get(metrics.K3, float('nan')):.2e}"]
        if metrics.EVAL_ACCURACY in row:
            parts.append(f"eval_acc {row[metrics.EVAL_ACCURACY]:.3f}")
        print("  ".join(parts) + f"  eta {eta:.0f}s", file=self.stream, flush=True)

    def close(self) -> None:
        pass


class RichProgress(PlainProgress):
    """A rich progress bar with step, reward and ETA, for terminals."""

    def __init__(self, total: int):
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        super().__init__(total)
        self.bar = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                            TextColumn("reward {task.fields[reward]}  k3 {task.fields[k3]}"), TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=total, reward="-", k3="-")
        self.bar.start()

    def warn(self, message: str) -> None:
        self.bar.console.print(f"[yellow]warning:[/] {message}")

    def update(self, row: dict) -> None:
        self.bar.update(self.task, completed=row[metrics.STEP], reward=f"{row.get(metrics.REWARD, float('nan')):.3f}",
                        k3=f"{row.get(metrics.K3, float('nan')):.1e}")

    def close(self) -> None:
        self.bar.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_recipe(parser)
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--resume", type=Path, metavar="DIR", help="continue the run in DIR from its last checkpoint")


def default_run_dir(recipe: str) -> Path:
    return RUNS / f"{Path(recipe).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(args: argparse.Namespace) -> int:
    if args.resume:
        if not (args.resume / CONFIG).is_file():
            raise UserError(f"--resume {str(args.resume)!r}: no {CONFIG} there (not a run directory)")
        cfg = config.load(str(args.resume / CONFIG), args.sets)
        run_dir = args.resume
    else:
        cfg = config.load(args.recipe, args.sets)
        run_dir = args.run_dir or default_run_dir(args.recipe)
    from grpo_studio.engine.trainer import Trainer  # torch loads only once the config is known to be good

    trainer = Trainer(cfg, run_dir, resume=bool(args.resume))
    progress = RichProgress(cfg.train.steps) if sys.stdout.isatty() else PlainProgress(cfg.train.steps)
    print(f"run directory: {run_dir}", flush=True)
    try:
        state = trainer.run(progress)
    finally:
        progress.close()  # before an error line (the error boundary in cli/main.py prints it)
        trainer.close()
    print(f"{state} at step {trainer.step_no}: {run_dir}", flush=True)
    return 0
