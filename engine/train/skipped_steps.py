"""Bad steps, and when they end the run. A step is bad when it was skipped (for non-finite numbers, or because the
environment failed every episode of its rollout: engine/rollout/episodes.py), or when it collapsed: taken, yet its reward and
its gradient are both exactly 0 after earlier steps had a signal (a model that a huge learning rate has broken samples
nothing that scores, and nothing is left to learn from, all finite). train.max_bad_steps bad steps in a row end the
run: a `diverged`, `environment_failed` or `collapsed` event names the cause and the last good checkpoint, which a
resume starts from (engine/run/trainer.py); the step that ends it still writes its row.
"""

from __future__ import annotations

import math
from pathlib import Path

from ...contract.config import TrainConfig
from ...contract.errors import UserError
from ..out import checkpoint
from ..precision.numerics import LossScaler


def last_checkpoint(run_dir: Path, at_most: int) -> str | None:
    """The path of the newest checkpoint on disk saved at a step <= at_most (train.keep_checkpoints may
    have deleted older ones)."""
    path = checkpoint.newest(run_dir, at_most)
    return None if path is None else str(path)


class SkippedSteps:
    """The bad steps so far: skipped in all and in a row (precision/bad_steps, precision/bad_streak), collapsed in a
    row, and whether any step had a signal (all of them a checkpoint's counters). `stop` is the error that ends the
    run once a streak reaches train.max_bad_steps: the trainer raises it after writing the step's row."""

    def __init__(self, rundir, outlets, scaler: LossScaler):
        self.rundir, self.outlets, self.scaler = rundir, outlets, scaler
        self.bad_steps = self.bad_streak = self.collapse_streak = 0
        self.signal_seen = False
        self.stop: UserError | None = None

    def counters(self) -> dict[str, int]:
        return {
            "bad_steps": self.bad_steps,
            "bad_streak": self.bad_streak,
            "collapse_streak": self.collapse_streak,
            "signal_seen": int(self.signal_seen),
        }

    def restore(self, counters: dict[str, int]) -> None:
        self.bad_steps, self.bad_streak = counters["bad_steps"], counters["bad_streak"]
        self.collapse_streak = counters.get("collapse_streak", 0)  # checkpoints written before collapse detection
        self.signal_seen = bool(counters.get("signal_seen", 0))

    def judge(self, step: int, skipped: str | None, train: TrainConfig, environment: str = "") -> None:
        """Count step `step`: taken (skipped None), or skipped for the reason given, with a `skipped_step`
        event. train.max_bad_steps skipped in a row means the run diverged, or, when the last was skipped because
        the environment (env.environment = `environment`) failed every episode, that the environment failed."""
        if skipped is None:
            self.bad_streak = 0
            return
        self.bad_steps += 1
        self.bad_streak += 1
        message = f"{skipped} at step {step}: step skipped, loss scale now {self.scaler.get_scale():g}"
        if environment:
            message = f"step {step} skipped: {skipped}"
        self.rundir.event("skipped_step", message, step=step, cause=skipped)
        if not (train.max_bad_steps and self.bad_streak >= train.max_bad_steps):
            return
        last = f"because {skipped}" if environment else f"for {skipped}"
        what = f"all skipped (train.max_bad_steps = {train.max_bad_steps}), the last {last}"
        if environment:
            advice = f"fix env.environment = {environment!r} (docs/environments.md), then --resume"
            self._end("environment_failed", step, self.bad_streak, what, train, advice, cause=skipped)
        else:
            self._end("diverged", step, self.bad_streak, what, train, cause=skipped)

    def judge_collapse(self, step: int, reward: float | None, grad_norm: float, train: TrainConfig) -> None:
        """Count taken step `step` as collapsed when its mean reward and its gradient norm are both exactly 0 after
        an earlier step had either; train.max_bad_steps of them in a row means the run collapsed."""
        if reward != 0.0 or grad_norm != 0.0:
            self.signal_seen = self.signal_seen or (reward is not None and math.isfinite(reward))
            self.collapse_streak = 0
            return
        if not self.signal_seen:  # nothing learnt yet is not a collapse
            return
        self.collapse_streak += 1
        if train.max_bad_steps and self.collapse_streak >= train.max_bad_steps:
            self._end(
                "collapsed",
                step,
                self.collapse_streak,
                f"reward and gradient exactly 0 after earlier steps "
                f"had a signal (train.max_bad_steps = "
                f"{train.max_bad_steps})",
                train,
            )

    def _end(self, kind: str, step: int, streak: int, what: str, train: TrainConfig, advice: str = "", **extra) -> None:
        """The `diverged` / `collapsed` / `environment_failed` event and the error that ends the run. The last good
        checkpoint is the newest whose weights then trained a good step: saved before the step before the streak."""
        first = step - streak + 1
        last_good = last_checkpoint(self.rundir.dir, first - 2)
        steps = f"step {step}" if first == step else f"steps {first}-{step}"
        advice = advice or f"try a lower train.lr (now {train.lr:g}); --resume starts from the last good checkpoint"
        why = f"{kind}: {steps} {what}; last good checkpoint: {last_good or 'none'}; {advice}"
        self.rundir.event(
            kind,
            why,
            step=step,
            bad_steps=streak,
            last_good_checkpoint=last_good,
            last_good_step=checkpoint.step_of(last_good) if last_good else 0,
            **extra,
        )
        self.outlets.event(kind, why, step)
        self.stop = UserError(why, kind="run")
