"""Issue 4 acceptance: a short fp16 training run of the bundled model shows precision/loss_scale
adapting (it grows after the growth interval) and no NaN in any metric.

Oracle: the dynamic loss-scaling rule (torch.amp.GradScaler semantics, engine/precision/numerics.py),
replayed by hand from the run's own skipped-step counter: a finite step increments the growth
counter and the scale doubles when the counter reaches the interval; a non-finite step halves
the scale and resets the counter.
"""

from __future__ import annotations

import json
import math

import pytest

from grpo_studio.contract import config
from grpo_studio.engine.run.trainer import Trainer

INIT, INTERVAL, STEPS = 2.0**16, 2, 5


def replay_loss_scale(skipped_counts: list[float], init: float, interval: int) -> list[float]:
    """The scale after each step, from the cumulative skipped-step counter logged per step."""
    scale, tracker, prev, out = init, 0, 0.0, []
    for skipped in skipped_counts:
        if skipped > prev:  # this step overflowed: skip, back off ×0.5, reset the counter
            scale, tracker = max(scale * 0.5, 1.0), 0
        else:
            tracker += 1
            if tracker == interval:
                scale, tracker = scale * 2.0, 0
        prev = skipped
        out.append(scale)
    return out


@pytest.mark.slow
def test_fp16_run_loss_scale_grows_after_interval_and_no_nan(tmp_path, model_name):
    run = tmp_path / "run"
    cfg = config.load(
        "tiny-arith",
        [
            f"model.name={model_name}",
            "model.dtype=fp16",
            f"precision.loss_scale_init={INIT}",
            f"precision.loss_scale_growth_interval={INTERVAL}",
            f"train.steps={STEPS}",
            "train.prompts_per_step=2",
            "rollout.num_generations=4",
            "train.save_every=0",
        ],
    )
    assert Trainer(cfg, run).run() == "finished"

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    scales = [r["precision/loss_scale"] for r in rows]
    skipped = [r["precision/skipped_steps"] for r in rows]
    print(f"\nprecision/loss_scale per step: {scales}; skipped_steps: {skipped}")

    assert scales == replay_loss_scale(skipped, INIT, INTERVAL)
    # The fp16 run on the tiny model has no overflow, so the scale doubles every 2 steps:
    assert skipped == [0.0] * STEPS
    assert scales == [INIT, 2 * INIT, 2 * INIT, 4 * INIT, 4 * INIT]

    # No NaN anywhere: the run log writes non-finite floats as null, so null is a NaN/inf too.
    for row in rows:
        bad = {k: v for k, v in row.items() if v is None or (isinstance(v, float) and not math.isfinite(v))}
        assert not bad, f"step {row['step']}: non-finite metrics {bad}"
    for key in ("loss", "grad_norm", "reward/mean", "mismatch/k3", "entropy"):
        assert all(isinstance(r[key], (int, float)) for r in rows), key
