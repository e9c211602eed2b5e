"""`grpo-studio bench ui`: studio responsiveness.

first frame   process start -> the setup screen's first frame (python start-up and imports
              included), median of N fresh processes; target < 1.5 s
chart refresh one new metrics row appended -> tail read, the overview's charts rebuilt from
              10,000 steps of history and rendered; target < 50 ms. Baseline: the same with
              100 steps, so the ratio shows how refresh cost scales with history.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..contract import config, metrics, rundir

FIRST_FRAME_TARGET_S = 1.5
REFRESH_TARGET_MS = 50.0

CHILD = r"""
import sys, time
t0 = float(sys.argv[1])
import asyncio
from grpo_studio.studio import hardware
from grpo_studio.studio.app import StudioApp
async def main():
    app = StudioApp(live_hardware=False)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.setup_screen is None or not app.setup_screen.is_mounted:
            await asyncio.sleep(0.001)
        done = asyncio.Event()
        app.setup_screen.call_after_refresh(done.set)
        await done.wait()
        print(time.time() - t0)
asyncio.run(main())
"""


def first_frame_s(repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-c", CHILD, str(t0)], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "child failed")
        out.append(float(proc.stdout.strip().splitlines()[-1]))
    return out


def metrics_row(step: int, rng: random.Random) -> dict:
    """A row as wide as the trainer's: every schema metric (tiny-arith's rewards), values in [0, 1)."""
    return {
        **{name: rng.random() for name in metrics.names(["correctness", "format"])},
        metrics.STEP: step,
        metrics.TIME: float(step),
    }


def write_metrics(path: Path, steps: range, rng: random.Random) -> None:
    with open(path, "a") as fh:
        fh.writelines(json.dumps(metrics_row(step, rng)) + "\n" for step in steps)


async def _refresh_ms(run_dir: Path, repeats: int) -> list[float]:
    from ..studio.app import StudioApp
    from ..studio.widgets.metric_chart import MetricChart

    app = StudioApp(live_hardware=False, poll_s=3600)
    times = []
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_run(run_dir)
        await pilot.pause()
        dash = app.screen
        charts = list(dash.query_one("#overview").query(MetricChart))
        rng = random.Random(0)
        for _ in range(repeats):
            write_metrics(run_dir / rundir.METRICS, range(dash.run.step + 1, dash.run.step + 2), rng)
            t = time.perf_counter()
            dash.refresh_data()  # tail read + lines for the visible tab
            for chart in charts:  # what the compositor does next: plotext build at the widget's size
                chart.render()
            times.append((time.perf_counter() - t) * 1000)
            await pilot.pause()
    return times


def refresh_ms(steps: int, repeats: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "bench"
        run.mkdir()
        config.save(config.load("tiny-arith", [f"train.steps={steps + 1000}"]), run / rundir.CONFIG)
        write_metrics(run / rundir.METRICS, range(1, steps + 1), random.Random(1))
        return asyncio.run(_refresh_ms(run, repeats))


def run(repeats: int, history: int) -> dict:
    """First-frame seconds over `repeats` fresh processes; chart refresh ms with `history` steps vs 100."""
    frames = first_frame_s(repeats)
    base = refresh_ms(100, repeats * 4)
    big = refresh_ms(history, repeats * 4)
    return {
        "first_frame_s": {
            "median": statistics.median(frames),
            "min": min(frames),
            "max": max(frames),
            "target": FIRST_FRAME_TARGET_S,
        },
        "chart_refresh_ms": {
            "history": history,
            "median": statistics.median(big),
            "max": max(big),
            "baseline_100_steps_median": statistics.median(base),
            "target": REFRESH_TARGET_MS,
            "ratio_vs_100_steps": statistics.median(big) / max(statistics.median(base), 1e-9),
        },
    }


def print_report(result: dict) -> None:
    ff, cr = result["first_frame_s"], result["chart_refresh_ms"]
    ok = lambda v, t: "ok" if v < t else "OVER TARGET"  # noqa: E731
    import os

    print(f"machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (figures scale with it)")
    print(
        f"first frame      median {ff['median']:.2f} s (min {ff['min']:.2f}, max {ff['max']:.2f}); "
        f"target < {FIRST_FRAME_TARGET_S} s: {ok(ff['median'], FIRST_FRAME_TARGET_S)}"
    )
    print(
        f"chart refresh    {cr['history']:,} steps: median {cr['median']:.1f} ms (max {cr['max']:.1f}); "
        f"100 steps: {cr['baseline_100_steps_median']:.1f} ms; ratio {cr['ratio_vs_100_steps']:.2f}x; "
        f"target < {REFRESH_TARGET_MS:.0f} ms: {ok(cr['median'], REFRESH_TARGET_MS)}  "
        f"(2 charts, 5 lines, at 120x40)"
    )
