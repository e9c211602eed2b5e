"""A GRPO step's metrics row (engine/train/grpo_step.py), from the typed record the step hands over: where the run
is (RunState, every step), and for a taken step what its phases returned (TakenStep: the rollout, the loss pass,
the update, the FLOPs) with their wall time (StepTimes). Keys are contract/metrics.py's names: the part every
step has, a taken step's loss, gradient and perf/* (wall time, model FLOPs, MFU, idle), mem/* and the
micro-batches' loss metrics merged into one."""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from ..rollout.rollouts import GenerationBatch
from .flops import Peak


@dataclasses.dataclass
class LossPass:
    """Phase 4's forward and backward over the step's rows, one micro-batch at a time."""

    logps: torch.Tensor  # π of the rows [B, T], detached; 0 past a micro-batch's cut (no completion token there)
    loss: float  # the rows' loss value (micro-batches weighted as their gradients)
    metrics: dict  # the loss's metrics (engine/train/losses.py), row-weighted over the micro-batches
    skipped: torch.Tensor  # the rows (of the step's) run forward only (engine/train/zero_advantage.py)
    unscored: torch.Tensor  # the rows not run at all: their logps are 0, the metrics are over the others


@dataclasses.dataclass
class Update:
    """Phase 4's optimizer step on the step's loss."""

    loss: float  # the step's loss (data-parallel: reduced over the ranks)
    grad_norm: float  # before clipping; inf for a non-finite loss
    skipped: str | None  # why the step was skipped (non-finite loss or gradients); None: it was taken


@dataclasses.dataclass
class StepTimes:
    """Wall-clock of a step's phases (perf/*)."""

    start: float  # time.perf_counter() at the step's start
    rollout_s: float = 0.0  # getting the rollout (its first step only)
    train_s: float = 0.0  # π_old, π, loss, backward, AdamW
    sync_s: float = 0.0  # the weight sync (a rollout's last step only)


@dataclasses.dataclass
class RunState:
    """Where the run is after a step, taken or skipped."""

    step: int  # optimizer steps done, this one included
    epoch: float  # passes over the prompts, fractional
    lr: float  # the learning rate after the step's schedule update
    bad_steps: int  # steps skipped for non-finite numbers so far (engine/train/skipped_steps.py)
    bad_streak: int  # of them, in a row up to this step
    loss_scale: dict  # fp16: the loss scaler's metrics; else empty


@dataclasses.dataclass
class TakenStep:
    """What a taken step's phases returned."""

    batch: GenerationBatch  # the rollout trained on
    rows: torch.Tensor  # its rows in this step
    sampled: bool  # this step made the rollout (its first step)
    lag: int  # optimizer steps since the weights that sampled it
    passed: LossPass
    update: Update
    flop: float  # the step's model FLOPs (engine/train/flops.py)


def skipped_row(state: RunState, times: StepTimes) -> dict:
    """A step skipped before its loss (nothing to train on): the common part, loss and gradient NaN."""
    return {**_common(state, times.start), "loss": math.nan, "grad_norm": math.nan}


def taken_row(state: RunState, taken: TakenStep, times: StepTimes, peak: Peak) -> dict:
    """A taken step's metrics row; `peak` is the matmul peak perf/mfu divides by (measured again when this step
    beats it)."""
    batch, passed = taken.batch, taken.passed
    # the loss's mismatch/is_* override the rollout's: as applied
    metrics = {**batch.metrics, **passed.metrics, **_common(state, times.start)}
    step_s = metrics["perf/step_s"]
    metrics.update(
        {
            "loss": taken.update.loss,
            "grad_norm": taken.update.grad_norm,
            "policy/lag": float(taken.lag),
            "perf/rollout_s": batch.rollout.seconds if taken.sampled else 0.0,
            "perf/train_s": step_s - times.rollout_s,
            "perf/sync_s": times.sync_s,
            "perf/skipped_backward_rows": float(len(passed.skipped) + len(passed.unscored)),
            "perf/skipped_forward_rows": float(len(passed.unscored)),
        }
    )
    if not taken.sampled:  # the waiting happened on the rollout's first step
        metrics.update({"perf/trainer_wait_s": 0.0, "perf/overlap_frac": 0.0})
    # perf/idle_s: the step less waiting for the rollout, training (π_old, log-probs, loss, backward, AdamW) and
    # the weight sync
    wait_s = metrics["perf/trainer_wait_s"]
    metrics.update(
        {
            "perf/flop": taken.flop,
            "perf/mfu": peak.mfu(taken.flop / step_s, state.step),
            "perf/peak_flop_s": peak.flop_s,
            "perf/idle_s": max(0.0, step_s - wait_s - times.train_s - times.sync_s),
        }
    )
    return metrics


def _common(state: RunState, start: float) -> dict:
    """The part of a metrics row every step has, taken or skipped."""
    return {
        "step": state.step,
        "time": time.time(),
        "epoch": state.epoch,
        "lr": state.lr,
        "perf/step_s": time.perf_counter() - start,
        "mem/peak_gib": _peak_gib(),
        "mem/rss_gib": _rss_gib(),
        "precision/bad_steps": float(state.bad_steps),
        "precision/bad_streak": float(state.bad_streak),
        **state.loss_scale,
    }


def merge_metrics(into: dict, part: dict, share: float) -> None:
    """Combine one micro-batch's metrics: min/max for extremes, row-weighted mean otherwise."""
    for key, value in part.items():
        if key.endswith("_min"):
            into[key] = min(into.get(key, value), value)
        elif key.endswith("_max"):
            into[key] = max(into.get(key, value), value)
        else:
            into[key] = into.get(key, 0.0) + value * share


def _peak_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _rss_gib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**30
