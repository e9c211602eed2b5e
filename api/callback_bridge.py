"""TRL's TrainerCallback events from the engine's run: a progress object (the one `grpo-studio train` prints
with) that also keeps a transformers TrainerState and calls each callback as transformers.Trainer does.

    on_train_begin   before the first step (state.max_steps, global_step = the resumed step)
    on_step_end      after every optimizer step's metrics row
    on_log           every logging_steps steps (logging_first_step: also step 1), with the window's means
                     under TRL's names (reward, reward_std, learning_rate, ...); appended to state.log_history
    on_log, then     at each eval (train.eval_every steps; eval_on_start: before step 1), after that step's
      on_evaluate    on_step_end and on_log, as transformers' _maybe_log_save_evaluate: TRL's eval_reward and
                     eval_rewards/NAME/mean (no eval_loss: docs/python-api.md)
    on_save          after each checkpoint
    on_train_end     once the run has finished or stopped

`control.should_training_stop` set by a callback stops the run gracefully, with a checkpoint, as a SIGTERM does.
"""

from __future__ import annotations

import math

from .contract import metrics

# the engine's metric names -> TRL's (GRPOTrainer.log); rewards/<name>/mean and /std keep theirs
TRL_NAMES = {
    metrics.LOSS: "loss",
    "grad_norm": "grad_norm",
    "lr": "learning_rate",
    metrics.REWARD: "reward",
    "reward/std": "reward_std",
    "reward/frac_zero_std": "frac_reward_zero_std",
    "entropy": "entropy",
    "kl_ref": "kl",
    "clip/low": "clip_ratio/low_mean",
    "clip/high": "clip_ratio/high_mean",
    "clip/region": "clip_ratio/region_mean",
    "completion/len_mean": "completions/mean_length",
    "completion/len_max": "completions/max_length",
    "completion/truncated_frac": "completions/clipped_ratio",
}


def trl_eval_logs(values: dict) -> dict[str, float]:
    """One eval's eval/* values as TRL logs them: eval_reward, eval_rewards/NAME/mean (the held-out rows' only;
    the accuracies and the generalisation split's numbers are the studio's own, in metrics.jsonl)."""
    out = {}
    for key, value in values.items():
        if key == metrics.EVAL_REWARD or key.startswith(metrics.EVAL + "rewards/"):
            out["eval_" + key.removeprefix(metrics.EVAL)] = float(value)
    return out


def trl_logs(rows: list[dict]) -> dict[str, float]:
    """The window's rows as one TRL log: the mean of each metric over the rows that have it."""
    sums: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            name = TRL_NAMES.get(key) or (key if key.startswith("rewards/") or key.startswith("completions/") else None)
            if name is not None and isinstance(value, (int, float)) and math.isfinite(value):
                sums.setdefault(name, []).append(float(value))
    return {name: sum(values) / len(values) for name, values in sums.items()}


class CallbackProgress:
    """`progress` for engine Trainer.run: prints through `printer` (contract/launch.py's PlainProgress) and drives callbacks."""

    def __init__(self, printer, callbacks: list, args, engine_trainer, steps_per_epoch: float):
        from transformers import TrainerControl, TrainerState

        self.printer, self.callbacks, self.args, self.engine = printer, callbacks, args, engine_trainer
        self.steps_per_epoch = steps_per_epoch
        self.state = TrainerState(
            max_steps=engine_trainer.cfg.train.steps,
            logging_steps=args.logging_steps,
            save_steps=args.save_steps,
            train_batch_size=args.per_device_train_batch_size,
            num_train_epochs=math.ceil(engine_trainer.cfg.train.steps / max(steps_per_epoch, 1)),
        )
        self.control = TrainerControl()
        self.window: list[dict] = []
        self.saved_step = 0

    def event(self, name: str, **extra) -> None:
        for callback in self.callbacks:
            handler = getattr(callback, name, None)
            if handler is not None:
                handler(self.args, self.state, self.control, **extra)
        if self.control.should_training_stop:
            self.engine.stop_requested = True

    def begin(self) -> None:
        self.state.global_step = self.engine.step_no
        self.state.epoch = self.engine.step_no / max(self.steps_per_epoch, 1)
        self.saved_step = self.engine.step_no  # a resumed run's checkpoint was told before
        self.event("on_train_begin")

    def update(self, row: dict) -> None:
        self.printer.update(row)
        step = row[metrics.STEP]
        self.state.global_step = step
        self.state.epoch = step / max(self.steps_per_epoch, 1)
        self.window.append(row)
        self.event("on_step_end")
        every = self.args.logging_steps
        due = self.args.logging_strategy == "steps" and (
            (every and step % _every(every, self.state.max_steps) == 0) or (step == 1 and self.args.logging_first_step)
        )
        if due:
            self._log(trl_logs(self.window))
            self.window = []
        if metrics.EVAL_ACCURACY in row:  # this step evaluated
            self.evaluated(row)

    def evaluated(self, values: dict) -> None:
        """An eval's values (a step's row, or eval_on_start's before step 1): on_log and on_evaluate with TRL's
        eval_* names, as transformers' Trainer.evaluate logs them."""
        logs = self._log(trl_eval_logs(values))
        self.event("on_evaluate", metrics=logs)

    def _log(self, logs: dict) -> dict:
        """transformers' Trainer.log: the epoch added, the logs appended to state.log_history, on_log."""
        logs = {**logs, "epoch": self.state.epoch}
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.event("on_log", logs=logs)
        return logs

    def saved(self) -> None:
        """After a checkpoint: on_save once per step (the engine saves again at the end, the same step)."""
        if self.engine.step_no != self.saved_step:
            self.saved_step = self.engine.step_no
            self.event("on_save")

    def end(self) -> None:
        self.event("on_train_end")

    def warn(self, message: str) -> None:
        self.printer.warn(message)

    def note(self, message: str) -> None:
        self.printer.note(message)


def _every(logging_steps: float, max_steps: int) -> int:
    """transformers: a logging_steps below 1 is a fraction of the run's steps."""
    return max(1, math.ceil(max_steps * logging_steps)) if logging_steps < 1 else int(logging_steps)
