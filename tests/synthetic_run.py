"""Deterministic run directories for the studio tests and `scripts/screenshots.py --demo`.

Every row holds every metric of the schema (engine/contract/metrics.py), each drawn from its own
seeded generator, so a metric added to the schema shows up here without shifting the others.
Mismatch metrics scale with the dtype's drift (bf16 ≈ 8× fp16's |Δlogp|, as measured here)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from grpo_studio.engine.contract import config as cfgmod
from grpo_studio.engine.contract import metrics, rundir

FUNCS = ["correctness", "format"]  # tiny-arith's reward functions
DRIFT = {"bf16": 1.8e-3, "fp16": 2.3e-4, "fp32": 1e-7, "fp8": 6e-3}  # mean token |Δlogp| per dtype


def shapes(drift: float) -> dict[str, tuple[float, float, float]]:
    """(base, scale, growth) per schema name: value = base + scale·(1 + growth·progress)·(0.8 + 0.4·u),
    u uniform in [0, 1). Names not listed get (0, 1, 0)."""
    return {
        metrics.REWARD: (0.0, 0.5, 4.0), metrics.reward_key(metrics.FN): (0.0, 0.25, 4.0),
        metrics.LOSS: (-0.02, 0.02, 0.0), metrics.K3: (0.0, drift ** 2, 2.0),
        metrics.DP_MAX: (0.0, 8 * drift, 0.0), "mismatch/abs_dp_mean": (0.0, 0.3 * drift, 0.0),
        "mismatch/is_min": (1.0, -8 * drift, 0.0), "mismatch/is_mean": (1.0, 0.0, 0.0),
        "mismatch/is_max": (1.0, 8 * drift, 0.0), "mismatch/masked_frac": (0.0, 0.0, 0.0),
        "precision/loss_scale": (65536.0, 0.0, 0.0),
    }


def metrics_rows(steps: int, total: int, dtype: str, seed: int, t0: float) -> list[dict]:
    shape = shapes(DRIFT[dtype])
    names = metrics.names(FUNCS)
    rngs = {name: random.Random(f"{seed}/{name}") for name in names}
    rows = []
    for step in range(1, steps + 1):
        progress = step / total
        row = {}
        for name in names:
            base, scale, growth = shape.get(metrics.lookup(name).name, (0.0, 1.0, 0.0))
            row[name] = base + scale * (1 + growth * progress) * (0.8 + 0.4 * rngs[name].random())
        rows.append({**row, metrics.STEP: step, metrics.TIME: t0 + 1.5 * step})
    return rows


def histogram_row(step: int, dtype: str) -> dict:
    center = math.log10(DRIFT[dtype])
    edges = metrics.HIST_EDGES
    counts = [int(400 * math.exp(-((math.log10(edges[i]) - center) ** 2))) for i in range(len(edges) - 1)]
    return {"step": step, "edges": edges, "counts": counts, "counts_pos": [c // 2 for c in counts],
            "counts_neg": [c - c // 2 for c in counts], "zero": 50, "under": 0, "over": 0, "n": sum(counts) + 50}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_run(run_dir: Path, steps: int, total: int | None = None, dtype: str = "bf16", seed: int = 0,
              state: str = "finished", t0: float = 1_750_000_000.0) -> Path:
    """A run directory with `steps` rows of a `total`-step run, ending in `state`."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    total = total or steps
    cfgmod.save(cfgmod.load("tiny-arith", [f"model.dtype={dtype}", f"train.steps={total}"]), run_dir / rundir.CONFIG)
    write_jsonl(run_dir / rundir.METRICS, metrics_rows(steps, total, dtype, seed, t0))
    write_jsonl(run_dir / rundir.HISTOGRAMS, [histogram_row(steps, dtype)])
    samples = []
    for step in range(max(1, steps - 3), steps + 1):
        for a, b in ((12, 30), (7, 41)):
            ok = (step + a) % 3 != 0
            answer = a + b if ok else a + b + 1
            samples.append({"step": step, "prompt": f"{a}+{b}=", "completion": f"<answer>{answer}</answer>",
                            "advantage": 0.7 if ok else -1.2, "rewards": {"correctness": 2.0 if ok else 0.0, "format": 0.5}})
    write_jsonl(run_dir / rundir.SAMPLES, samples)
    events = [{"time": t0, "event": "started", "message": "starting step 0", "total_steps": total}]
    if steps >= 20:
        events.append({"time": t0 + 30, "event": "checkpoint", "message": "saved step-20", "step": 20})
    if dtype == "fp16" and steps > total // 2:
        events.append({"time": t0 + 40, "event": "skipped_step", "message": f"fp16 overflow at step {total // 2}"})
    if state in ("finished", "stopped", "crashed"):
        events.append({"time": t0 + 1.5 * steps, "event": state, "message": f"{state} at step {steps}", "step": steps})
    write_jsonl(run_dir / rundir.EVENTS, events)
    return run_dir
