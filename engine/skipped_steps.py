"""Steps skipped for non-finite numbers, and divergence: train.max_bad_steps skipped in a row ends the run with a
`diverged` event naming the cause and the last good checkpoint."""

from __future__ import annotations

from pathlib import Path

from grpo_studio.contract.config import TrainConfig
from grpo_studio.contract.errors import UserError
from grpo_studio.engine import checkpoint
from grpo_studio.engine.precision import LossScaler


def last_checkpoint(run_dir: Path, at_most: int) -> str | None:
    """The path of the newest checkpoint on disk saved at a step <= at_most (train.keep_checkpoints may
    have deleted older ones)."""
    path = checkpoint.newest(run_dir, at_most)
    return None if path is None else str(path)


class SkippedSteps:
    """The steps skipped so far: in all and in a row (precision/bad_steps, precision/bad_streak; a checkpoint's
    counters)."""

    def __init__(self, rundir, outlets, scaler: LossScaler):
        self.rundir, self.outlets, self.scaler = rundir, outlets, scaler
        self.bad_steps = self.bad_streak = 0

    def counters(self) -> dict[str, int]:
        return {"bad_steps": self.bad_steps, "bad_streak": self.bad_streak}

    def restore(self, counters: dict[str, int]) -> None:
        self.bad_steps, self.bad_streak = counters["bad_steps"], counters["bad_streak"]

    def judge(self, step: int, skipped: str | None, train: TrainConfig) -> None:
        """Count step `step`: taken (skipped None), or skipped for the reason given, with a `skipped_step`
        event. train.max_bad_steps skipped in a row means the run diverged: a `diverged` event naming the
        cause and the last good checkpoint (the newest whose weights then trained a step: saved before the
        step before the streak), then a UserError."""
        if skipped is None:
            self.bad_streak = 0
            return
        self.bad_steps += 1
        self.bad_streak += 1
        self.rundir.event("skipped_step", f"{skipped} at step {step}: step skipped, loss scale now "
                                          f"{self.scaler.get_scale():g}", step=step, cause=skipped)
        limit = train.max_bad_steps
        if not limit or self.bad_streak < limit:
            return
        first = step - self.bad_streak + 1
        last_good = last_checkpoint(self.rundir.dir, first - 2)  # its weights trained step first - 1 (or earlier)
        steps = f"step {step}" if first == step else f"steps {first}-{step}"
        why = (f"diverged: {steps} all skipped (train.max_bad_steps = {limit}), the last for {skipped}; "
               f"last good checkpoint: {last_good or 'none'}; try a lower train.lr (now {train.lr:g})")
        self.rundir.event("diverged", why, step=step, cause=skipped, bad_steps=self.bad_streak,
                          last_good_checkpoint=last_good)
        self.outlets.event("diverged", why, step)
        raise UserError(why, kind="run")
