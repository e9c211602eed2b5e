"""Deterministic run directories for snapshot tests, the UI benchmark and screenshots.

The rows follow the trainer's metric names (DESIGN.md) and shapes; the numbers come from a
seeded generator, with bf16 drifting more than fp16 as measured in this project (≈8×)."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

from grpo_studio.engine.contract import config as cfgmod
from grpo_studio.engine.contract import rundir

EDGES = [10.0 ** (-9 + i / 4) for i in range(37)]


def metrics_row(step: int, steps: int, dtype: str, rng: random.Random, t0: float) -> dict:
    progress = step / steps
    drift = {"bf16": 1.8e-3, "fp16": 2.3e-4, "fp32": 1e-7, "fp8": 6e-3}.get(dtype, 1e-4)
    correct = 2.0 * (1 - math.exp(-4 * progress)) * (0.9 + 0.1 * rng.random())
    fmt_r = 0.5 * min(1.0, 0.3 + 1.5 * progress) * (0.9 + 0.1 * rng.random())
    k3 = drift * drift * (0.6 + 0.8 * rng.random()) * (1 + 2 * progress)
    row = {
        "step": step, "time": t0 + 1.5 * step, "epoch": step * 16 / 2500,
        "reward/mean": correct + fmt_r, "reward/std": 0.6 * (1 - progress) + 0.05,
        "rewards/correctness/mean": correct, "rewards/correctness/std": 0.8,
        "rewards/format/mean": fmt_r, "rewards/format/std": 0.2, "reward/frac_zero_std": 0.1 + 0.5 * progress,
        "loss": 0.02 * rng.gauss(0, 1), "grad_norm": 0.8 * math.exp(-progress) + 0.1 * rng.random(),
        "lr": 2e-3, "entropy": 1.2 * (1 - 0.6 * progress) + 0.05 * rng.random(),
        "clip/low": 0.01 * rng.random(), "clip/high": 0.02 * rng.random(), "clip/region": 0.03 * rng.random(),
        "mismatch/k1": k3 * 0.5, "mismatch/k2": k3, "mismatch/k3": k3,
        "mismatch/abs_dlogp_mean": drift * (0.8 + 0.4 * rng.random()),
        "mismatch/abs_dlogp_max": drift * 20 * (0.5 + rng.random()),
        "mismatch/abs_dp_mean": drift * 0.3, "mismatch/abs_dp_max": drift * 8 * (0.5 + rng.random()),
        "mismatch/is_min": 1 - drift * 15 * rng.random(), "mismatch/is_mean": 1.0,
        "mismatch/is_max": 1 + drift * 15 * rng.random(), "mismatch/ess": 0.99, "mismatch/masked_frac": 0.0,
        "completion/len_mean": 7.5 - 2 * progress, "completion/len_max": 8,
        "completion/truncated_frac": max(0.0, 0.6 - progress),
        "perf/step_s": 1.5, "perf/rollout_s": 0.6, "perf/train_s": 0.9, "perf/rollout_tok_s": 900 + 50 * rng.random(),
        "mem/peak_gib": 0.21, "mem/rss_gib": 0.9,
    }
    if dtype == "fp16":
        row["precision/loss_scale"] = 65536.0 if step < steps // 2 else 32768.0
        row["precision/skipped_steps"] = 0 if step < steps // 2 else 1
    return row


def histogram_row(step: int, dtype: str) -> dict:
    center = {"bf16": -3.0, "fp16": -4.0, "fp32": -7.0, "fp8": -2.5}.get(dtype, -4.0)
    counts = [int(400 * math.exp(-((math.log10(EDGES[i]) - center) ** 2))) for i in range(36)]
    return {"step": step, "edges": EDGES, "counts": counts, "counts_pos": [c // 2 for c in counts],
            "counts_neg": [c - c // 2 for c in counts], "zero": 50, "under": 0, "over": 0, "n": sum(counts) + 50}


def write_run(run_dir: Path, steps: int, total: int | None = None, dtype: str = "bf16", seed: int = 0,
              state: str = "finished", t0: float = 1_750_000_000.0) -> Path:
    """A run directory with `steps` rows of a `total`-step run, ending in `state`."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    total = total or steps
    cfg = cfgmod.load("tiny-arith", [f"model.dtype={dtype}", f"train.steps={total}"])
    cfgmod.save(cfg, run_dir / rundir.CONFIG)
    rng = random.Random(seed)
    with open(run_dir / rundir.METRICS, "w") as fh:
        for step in range(1, steps + 1):
            fh.write(json.dumps(metrics_row(step, total, dtype, rng, t0)) + "\n")
    with open(run_dir / rundir.HISTOGRAMS, "w") as fh:
        fh.write(json.dumps(histogram_row(steps, dtype)) + "\n")
    with open(run_dir / rundir.SAMPLES, "w") as fh:
        for step in range(max(1, steps - 3), steps + 1):
            for a, b in ((12, 30), (7, 41)):
                ok = (step + a) % 3 != 0
                answer = a + b if ok else a + b + 1
                fh.write(json.dumps({"step": step, "prompt": f"{a}+{b}=", "completion": f"<answer>{answer}</answer>",
                                     "advantage": 0.7 if ok else -1.2,
                                     "rewards": {"correctness": 2.0 if ok else 0.0, "format": 0.5}}) + "\n")
    events = [{"time": t0, "event": "started", "message": "starting step 0", "total_steps": total}]
    if steps >= 20:
        events.append({"time": t0 + 30, "event": "checkpoint", "message": "saved step-20", "step": 20})
    if dtype == "fp16" and steps > total // 2:
        events.append({"time": t0 + 40, "event": "skipped_step", "message": f"fp16 overflow at step {total // 2}"})
    if state in ("finished", "stopped", "crashed"):
        events.append({"time": t0 + 1.5 * steps, "event": state, "message": f"{state} at step {steps}", "step": steps})
    with open(run_dir / rundir.EVENTS, "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    return run_dir


def now() -> float:
    return time.time()
