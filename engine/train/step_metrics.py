"""A GRPO step's metrics row (engine/train/grpo_step.py): the part every step has, taken or skipped, a taken step's
loss, gradient and perf/* (wall time, model FLOPs, MFU, idle), mem/* and the micro-batches' loss metrics
merged into one. Keys are contract/metrics.py's names."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from . import flops

if TYPE_CHECKING:
    from ..rollout.rollouts import GenerationBatch
    from .grpo_step import GRPOStep, LossPass, StepTimes, Update


def taken_row(
    grpo: GRPOStep,
    batch: GenerationBatch,
    rows,
    sampled: bool,
    lag: int,
    passed: LossPass,
    update: Update,
    times: StepTimes,
) -> dict:
    """A taken step's metrics row (call after step_no += 1)."""
    # the loss's mismatch/is_* override the rollout's: as applied
    metrics = {**batch.metrics, **passed.metrics, **common_metrics(grpo, times.start)}
    metrics.update(
        {
            "loss": update.loss,
            "grad_norm": update.grad_norm,
            "policy/lag": float(lag),
            "perf/rollout_s": batch.rollout.seconds if sampled else 0.0,
            "perf/train_s": metrics["perf/step_s"] - times.rollout_s,
            "perf/sync_s": times.sync_s,
            "perf/skipped_backward_rows": float(len(passed.skipped) + len(passed.unscored)),
            "perf/skipped_forward_rows": float(len(passed.unscored)),
        }
    )
    if not sampled:  # the waiting happened on the rollout's first step
        metrics.update({"perf/trainer_wait_s": 0.0, "perf/overlap_frac": 0.0})
    metrics.update(
        _perf(grpo, batch, rows, passed, sampled, metrics["perf/step_s"], metrics["perf/trainer_wait_s"], times)
    )
    return metrics


def _perf(
    grpo: GRPOStep,
    batch: GenerationBatch,
    rows,
    passed: LossPass,
    sampled: bool,
    step_s: float,
    wait_s: float,
    times: StepTimes,
) -> dict:
    """perf/flop, perf/peak_flop_s, perf/mfu and perf/idle_s of a step: its model FLOPs (engine/train/flops.py)
    over its wall time and the matmul peak (flops.Peak: measured again when this step beats it); idle = the
    step less waiting for the rollout, training (π_old, log-probs, loss, backward, AdamW) and the weight sync."""
    flop = flops.grpo_step_flop(
        grpo.matmul_params,
        flops.real_tokens(batch.attention, batch.rollout.mask),
        rows,
        sampled_here=sampled and grpo.cfg.rollout.colocate,
        old_logps=sampled and batch.inputs.old_logps is not None,
        reference=grpo.cfg.algo.beta > 0,
        lora=grpo.cfg.model.lora_rank > 0,
        untrained=rows[passed.skipped],
        unrun=rows[passed.unscored],
    )
    mfu = grpo.peak.mfu(flop / step_s, grpo.step_no)
    return {
        "perf/flop": flop,
        "perf/peak_flop_s": grpo.peak.flop_s,
        "perf/mfu": mfu,
        "perf/idle_s": max(0.0, step_s - wait_s - times.train_s - times.sync_s),
    }


def common_metrics(grpo: GRPOStep, start: float) -> dict:
    """The part of a metrics row every step has, taken or skipped (call after step_no += 1)."""
    row = {
        "step": grpo.step_no,
        "time": time.time(),
        "epoch": grpo.prompts.epoch + grpo.prompts.index / max(1, len(grpo.prompts.rows)),
        "lr": grpo.schedule.get_last_lr()[0],
        "perf/step_s": time.perf_counter() - start,
        "mem/peak_gib": _peak_gib(),
        "mem/rss_gib": _rss_gib(),
        "precision/bad_steps": float(grpo.skips.bad_steps),
        "precision/bad_streak": float(grpo.skips.bad_streak),
    }
    if grpo.precision.loss_scaling:
        row.update(grpo.scaler.metrics())
    return row


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
