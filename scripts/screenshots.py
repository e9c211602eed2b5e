"""Regenerate screenshots/: the setup screen, the VRAM panel, a live dashboard mid-run and a
bf16-vs-fp16 comparison, the Perf tab, the Mismatch tab's lag verdict on a synthetic asynchronous run, and
the Samples tab of a synthetic multi-turn run (an episode turn by turn: trained and masked turns), and the
Doctor tab on a synthetic run made to show two faults.
SVG via App.save_screenshot; PNG via scripts/svg_png.py (Pillow and DejaVu Sans Mono), cell for cell as the SVG.

    python scripts/screenshots.py                  # real runs of the bundled tiny model
    python scripts/screenshots.py --model DIR      # real runs of another local model
    python scripts/screenshots.py --demo           # deterministic synthetic runs (no training)
    python scripts/screenshots.py --episodes-only  # only samples-episode (always synthetic)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from svg_png import convert as png  # scripts/svg_png.py, beside this script

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import bundled, rundir
from grpo_studio.contract import config as cfgmod
from grpo_studio.studio import hardware, launcher
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.panels import TABS

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "screenshots"
RUN_SETS = ["train.steps=20", "train.prompts_per_step=4", "rollout.num_generations=4", "train.save_every=0"]


async def shoot(app: StudioApp, name: str, size: tuple[int, int], before=None) -> Path:
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        if before is not None:
            await before(pilot)
        await pilot.pause(0.5)
        path = OUT / f"{name}.svg"
        app.save_screenshot(filename=path.name, path=str(OUT))
    return path


def episode_shot(tmp: Path) -> Path:
    """The Samples tab on its newest row, a finished episode (benchmarks/synthetic_run.py, episodes=True)."""
    run_dir = write_run(tmp / "episodes" / "tiny-arith-tools-bf16", 12, dtype="bf16", seed=4, episodes=True)

    async def samples(pilot):
        pilot.app.open_run(run_dir)
        await pilot.pause(1.0)
        await pilot.press(str(len(TABS) + 3))  # the tabs of charts, Δlogp, Device, then Samples

    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", run_dir.parent, live_hardware=False)
    return asyncio.run(shoot(app, "samples-episode", (120, 40), samples))


def stuck_run(tmp: Path) -> Path:
    """A synthetic run made to show two faults for the Doctor tab: most groups without reward spread, and
    completions cut at max_completion_len."""
    run_dir = write_run(tmp / "stuck" / "tiny-arith-stuck-bf16", 30, dtype="bf16", seed=5)
    path = run_dir / rundir.METRICS
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        row.update({"reward/frac_zero_std": 0.8, "completion/truncated_frac": 0.4})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


def real_runs(model: str, root: Path) -> tuple[Path, Path]:
    runs = []
    for dtype in ("bf16", "fp16"):
        cfg = cfgmod.load("tiny-arith", [f"model.name={model}", f"model.dtype={dtype}", *RUN_SETS])
        run_dir = root / f"tiny-arith-{dtype}"
        launcher.launch(cfg, run_dir)
        runs.append(run_dir)
    return runs[0], runs[1]


def steps_done(run_dir: Path) -> int:
    row = rundir.last_metrics_row(run_dir) or {}
    return int(row.get("step", 0))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model for the real runs (default: the bundled tiny-arith)")
    p.add_argument("--demo", action="store_true", help="synthetic run data instead of training")
    p.add_argument("--setup-only", action="store_true", help="only the setup screen and VRAM panel shots")
    p.add_argument("--episodes-only", action="store_true", help="only the Samples tab of a multi-turn run")
    args = p.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    hardware.gpus = lambda: []  # the same "no GPU" panel wherever the script runs
    if args.episodes_only:
        tmp = Path(tempfile.mkdtemp(prefix="grpo-shots-"))
        png(episode_shot(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        return 0
    model = args.model or ("tiny-arith" if bundled.bundled_model("tiny-arith") else None)
    tmp = Path(tempfile.mkdtemp(prefix="grpo-shots-"))
    root = tmp / "runs"
    shots: list[Path] = []

    setup_cfg = cfgmod.load(
        "tiny-arith",
        [
            "model.name=Qwen/Qwen3-4B",
            "model.dtype=bf16",
            "rollout.max_prompt_len=256",
            "rollout.max_completion_len=4096",
            "rollout.num_generations=8",
            "train.prompts_per_step=8",
            "model.gradient_checkpointing=true",
            "train.micro_batch_size=8",
            "model.logits_chunk=1024",
        ],
    )
    shots.append(asyncio.run(shoot(StudioApp(setup_cfg, "tiny-arith", root, live_hardware=False), "setup", (120, 40))))

    async def accurate(pilot):
        await pilot.press("ctrl+t")

    shots.append(
        asyncio.run(
            shoot(StudioApp(setup_cfg, "tiny-arith", root, live_hardware=False), "vram-panel-80x24", (80, 24), accurate)
        )
    )

    if args.setup_only:
        for svg in shots:
            png(svg)
        return 0
    if model and not args.demo:
        bf16, fp16 = real_runs(model, root)
        deadline = time.monotonic() + 900
        while steps_done(bf16) < 10 and time.monotonic() < deadline:
            time.sleep(1)
        source = f"real runs of {model}"
    else:
        bf16 = write_run(root / "tiny-arith-bf16", 12, total=30, dtype="bf16", seed=1, state="running")
        fp16 = write_run(root / "tiny-arith-fp16", 30, dtype="fp16", seed=2)
        source = "synthetic demo runs (benchmarks/synthetic_run.py)"

    async def open_bf16(pilot):
        pilot.app.open_run(bf16)
        await pilot.pause(1.0)

    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", root, live_hardware=False)
    shots.append(asyncio.run(shoot(app, "dashboard-live", (120, 40), open_bf16)))
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", root, live_hardware=False)
    shots.append(asyncio.run(shoot(app, "dashboard-live-80x24", (80, 24), open_bf16)))

    if model and not args.demo:
        deadline = time.monotonic() + 1200
        while any(rundir.run_state(r).state == "running" for r in (bf16, fp16)) and time.monotonic() < deadline:
            time.sleep(2)

    async def compare(pilot):
        pilot.app.compare_runs([bf16, fp16])
        await pilot.pause(1.0)

    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", root, live_hardware=False)
    shots.append(asyncio.run(shoot(app, "compare-bf16-fp16", (120, 40), compare)))

    def tab(run_dir, key: str):
        async def action(pilot):  # the run's dashboard on the tab of number `key`
            pilot.app.open_run(run_dir)
            await pilot.pause(1.0)
            await pilot.press(key)

        return action

    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", root, live_hardware=False)
    shots.append(asyncio.run(shoot(app, "dashboard-perf", (120, 40), tab(fp16, "5"))))
    # The lag verdict needs policy lag (rollout.async_mode with a rollout server): a synthetic run shows it.
    lagged = write_run(tmp / "async" / "tiny-arith-async-bf16", 30, dtype="bf16", seed=3, lagged=30.0)
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", root, live_hardware=False)
    shots.append(asyncio.run(shoot(app, "dashboard-lag-80x24", (80, 24), tab(lagged, "3"))))
    shots.append(episode_shot(tmp))
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", root, live_hardware=False)
    shots.append(asyncio.run(shoot(app, "dashboard-doctor-80x24", (80, 24), tab(stuck_run(tmp), "0"))))
    for svg in shots:
        png(svg)
    (OUT / "SOURCE.txt").write_text(
        f"Generated by scripts/screenshots.py from {source}; dashboard-lag-80x24 from "
        f"a synthetic asynchronous run (benchmarks/synthetic_run.py, lagged k3 30× lag-0); samples-episode from "
        f"a synthetic multi-turn run (benchmarks/synthetic_run.py, episodes=True); dashboard-doctor-80x24 from a "
        f"synthetic run with 80% zero-variance groups and 40% truncated completions written into it.\n"
    )
    print(f"{len(shots)} screenshots in {OUT} ({source})")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
