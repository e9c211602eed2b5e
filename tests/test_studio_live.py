"""The studio against a real trainer: launch by keyboard, watch real rows arrive, stop gracefully,
reattach from a fresh app and see the same history; then compare finished runs."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from textual.widgets import DataTable, Label

from grpo_studio.contract import config as cfgmod
from grpo_studio.contract import metrics, rundir
from grpo_studio.contract.metrics import fmt
from grpo_studio.studio import hardware
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.panels import PANELS, TABS, short
from grpo_studio.studio.screens.compare_screen import CompareScreen
from grpo_studio.studio.screens.dashboard_screen import DashboardScreen
from grpo_studio.studio.screens.runs_list_screen import RunsScreen
from grpo_studio.studio.widgets.metric_chart import MetricChart, percent
from tests.studio_helpers import anyio_backend, tiny_model_name, visible_text, wait_until  # noqa: F401
from tests.trained_runs import TRAINED_STEPS

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def quiet_hardware(monkeypatch):
    monkeypatch.setattr(hardware, "gpus", lambda: [])


def metrics_rows(run_dir) -> list[dict]:
    """Complete rows only: the trainer may be halfway through appending the last line."""
    *complete, _partial = (run_dir / rundir.METRICS).read_text().split("\n")
    return [json.loads(line) for line in complete if line.strip()]


def metrics_steps(run_dir):
    return [row["step"] for row in metrics_rows(run_dir)]


@pytest.mark.slow
async def test_launch_watch_stop_and_reattach(tmp_path, request):
    model = tiny_model_name(request)
    cfg = cfgmod.load(
        "tiny-arith",
        [
            f"model.name={model}",
            "train.steps=400",
            "train.prompts_per_step=2",
            "rollout.num_generations=2",
            "train.save_every=0",
        ],
    )
    runs = tmp_path / "runs"
    app = StudioApp(cfg, "tiny-arith", runs, live_hardware=False, poll_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+r")  # launch, from the keyboard
        await pilot.pause()
        dash = app.screen
        assert isinstance(dash, DashboardScreen)
        run_dir = dash.run.dir
        await wait_until(pilot, lambda: dash.run.step >= 2)

        # the charts hold exactly the rows the trainer wrote
        reward = dash.query_one("#overview-reward", MetricChart)
        await wait_until(pilot, lambda: reward.lines and reward.lines[0].xs == dash.run.steps)
        on_disk = metrics_steps(run_dir)
        assert reward.lines[0].xs == on_disk[: len(reward.lines[0].xs)]
        rows = metrics_rows(run_dir)
        assert reward.lines[0].ys == [r["reward/mean"] for r in rows[: len(reward.lines[0].ys)]]
        assert "reward" in visible_text(reward)
        pid = rundir.read_pid(run_dir)
        assert pid is not None and os.getsid(pid) == app.procs[-1].pid  # in the session `grpo-studio train` leads

        # graceful stop: confirm, the trainer checkpoints and logs `stopped`
        await pilot.press("s")
        await pilot.pause()
        await pilot.press("y")
        await wait_until(pilot, lambda: dash.run.state() == "stopped", timeout=180)
        events = [e["event"] for e in rundir.read_events(run_dir)]
        assert events[-1] == "stopped" and "checkpoint" in events
        assert any((run_dir / rundir.CHECKPOINTS).iterdir())
        await wait_until(pilot, lambda: dash.run.steps == metrics_steps(run_dir))
        history = list(dash.run.steps)
        first_reward = list(reward.lines[0].ys)
        assert "stopped" in visible_text(dash.query_one("#run-title"))

    # a new studio instance attaches and shows the same history
    again = StudioApp(
        cfgmod.load(str(run_dir / rundir.CONFIG)), str(run_dir), runs, attach=run_dir, live_hardware=False
    )
    async with again.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        dash2 = again.screen
        assert isinstance(dash2, DashboardScreen)
        await wait_until(pilot, lambda: dash2.query_one("#overview-reward", MetricChart).lines)
        assert dash2.run.steps == history == metrics_steps(run_dir)
        assert dash2.query_one("#overview-reward", MetricChart).lines[0].ys == first_reward
        assert dash2.run.state() == "stopped"


async def test_compare_two_finished_runs_by_keyboard(tmp_path, monkeypatch, trained_runs):
    """Two runs the real trainer wrote (bf16, fp16): the runs table lists them, and compare draws
    each file's columns exactly and prints each run's last values as metrics.fmt formats them."""
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    for dtype, run in trained_runs.items():
        shutil.copytree(run, runs / f"ab-{dtype}")
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", runs, live_hardware=False)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        await pilot.press("f3")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)
        table_text = visible_text(app.screen.query_one("#runs-table"))
        assert "ab-bf16" in table_text and "ab-fp16" in table_text and "finished" in table_text
        await pilot.press("space", "space", "c")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        summary = visible_text(app.screen.query_one("#compare-summary"))
        for dtype in ("bf16", "fp16"):
            rows = file_rows(runs / f"ab-{dtype}")
            last = rows[-1]
            for pid, key in (
                ("k3", metrics.K3),
                ("reward", metrics.REWARD),
                ("loss", metrics.LOSS),
                ("dp_max", metrics.DP_MAX),
            ):
                chart = app.screen.query_one(f"#cmp-{pid}", MetricChart)
                (line,) = [line for line in chart.lines if line.label == f"ab-{dtype} {dtype}/{dtype}"]
                assert line.xs == [r["step"] for r in rows] == list(range(1, TRAINED_STEPS + 1))
                assert line.ys == [r[key] for r in rows], (pid, dtype)
            (shown,) = [line.split() for line in summary.splitlines() if line.split()[:1] == [f"ab-{dtype}"]]
            assert shown == [
                f"ab-{dtype}",
                f"{dtype}/{dtype}",
                "finished",
                str(TRAINED_STEPS),
                fmt(last[metrics.REWARD]),
                fmt(last[metrics.K3]),
                fmt(last[metrics.DP_MAX]),
            ]


def file_rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / rundir.METRICS).read_text().splitlines()]


def hand_histogram(hist: dict) -> tuple[list[str], list[float]]:
    """Per-decade bars by hand: exact zeros, underflow, 4 bins per decade from 1e-8, overflow."""
    labels, values = ["=0"], [float(hist["zero"])]
    if hist["under"]:
        labels.append("<")
        values.append(float(hist["under"]))
    for i, decade in enumerate(range(-8, 1)):
        labels.append(f"1e{decade}")
        values.append(float(sum(hist["counts"][4 * i : 4 * i + 4])))
    if hist["over"]:
        labels.append(">")
        values.append(float(hist["over"]))
    return labels, values


async def test_attached_dashboard_shows_exactly_what_the_trainer_wrote(trained_runs):
    """Attach to a finished real run: every chart on every tab holds the file's columns, every
    headline and the status line print the file's last values through metrics.fmt, the histogram
    tab the last histograms.jsonl row per decade, the samples table the last samples.jsonl row."""
    run_dir = trained_runs["fp16"]
    rows = file_rows(run_dir)
    last = rows[-1]
    column = {key: [r[key] for r in rows if r.get(key) is not None] for key in {k for r in rows for k in r}}
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    zero = [e for e in events if e["event"] == "eval" and e.get("step") == 0]
    # the step-0 `eval` event holds every eval/* value without its prefix (accuracy, general/accuracy, _lo/_hi ...)
    skip = {"event", "message", "step", "time"}
    before = {f"eval/{k}": v for k, v in zero[0].items() if k not in skip} if zero else {}
    app = StudioApp(
        cfgmod.load(str(run_dir / rundir.CONFIG)), str(run_dir), run_dir.parent, attach=run_dir, live_hardware=False
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        dash = app.screen
        assert isinstance(dash, DashboardScreen)
        await wait_until(pilot, lambda: dash.run.steps == [r["step"] for r in rows])
        status = str(dash.query_one("#run-step", Label).render())
        assert status.startswith(f"{TRAINED_STEPS}/{TRAINED_STEPS}  ")
        assert status.endswith(f"reward {fmt(last[metrics.REWARD])}  k3 {fmt(last[metrics.K3])}")
        seen = set()
        for tab, _, panel_ids in TABS:
            await pilot.press(str([t[0] for t in TABS].index(tab) + 1))
            await pilot.pause()
            for pid in panel_ids:
                if pid == "kl_ref":  # beta = 0: no chart
                    assert not dash.query(f"#{tab}-{pid}")
                    continue
                chart = dash.query_one(f"#{tab}-{pid}", MetricChart)
                await wait_until(pilot, lambda: dash.drawn.get(tab) == dash.run.version, timeout=60)
                panel = PANELS[pid]
                if panel.gate and not any(panel.logged or v > 0 for v in column.get(panel.gate, [])):  # e.g. no lag
                    assert not chart.display and chart.lines == []
                    continue
                keys = list(panel.keys) + (
                    [metrics.reward_key(fn) for fn in ("correctness", "format")] if panel.rewards else []
                )
                keys = [key for key in keys if key in column]  # e.g. no mismatch/masked_frac without is_level
                assert [line.label for line in chart.lines[: len(keys)]] == [short(key) for key in keys]
                for key, line in zip(keys, chart.lines):
                    zero = before.get(key)  # eval/*: the step-0 `eval` event (train.eval_before) starts the line
                    head = ([0], [zero]) if zero is not None else ([], [])
                    assert line.xs == head[0] + [r["step"] for r in rows if r.get(key) is not None], key
                    assert line.ys == head[1] + column[key], key
                    seen.add(key)
                if panel.rewards:  # the smoothed line: EMA with alpha 0.1 of the mean reward
                    acc, smooth = None, []
                    for y in column[metrics.REWARD]:
                        acc = y if acc is None else acc + 0.1 * (y - acc)
                        smooth.append(acc)
                    assert chart.lines[-1].label == "smoothed" and chart.lines[-1].ys == smooth
                bounds = [key for key in panel.bounds if key in column]  # Wilson 95% interval: a lo and a hi line each
                assert len(chart.lines) == len(keys) + panel.rewards + 2 * len(bounds)
                suffix = " · log10 axis" if panel.log else ""
                value = last.get(panel.keys[0])  # a share in percent (MFU), as the Perf table shows it
                shown = percent(value) if panel.percent else fmt(value)
                named = f"{short(panel.keys[0])} " if len(panel.keys) > 1 else ""  # which series the value is of
                assert chart.chart_title == f"{panel.title}  {named}{shown}{suffix}"
        assert {metrics.REWARD, metrics.K3, metrics.LOSS, "lr", "precision/loss_scale"} <= seen

        await pilot.press(str(len(TABS) + 1))  # the Δlogp histogram
        await pilot.pause()
        hist = json.loads((run_dir / rundir.HISTOGRAMS).read_text().splitlines()[-1])
        assert hist["step"] == TRAINED_STEPS
        chart = dash.query_one("#histogram-chart", MetricChart)
        await wait_until(pilot, lambda: chart.bars is not None, timeout=60)
        assert chart.bars == hand_histogram(hist)

        await pilot.press(str(len(TABS) + 3))  # samples, newest first
        await pilot.pause()
        table = dash.query_one("#samples-table", DataTable)
        await wait_until(pilot, lambda: table.row_count > 0, timeout=60)
        newest = json.loads((run_dir / rundir.SAMPLES).read_text().splitlines()[-1])
        cells = [str(c) for c in table.get_row_at(0)]
        assert cells[:4] == [
            str(newest["step"]),
            fmt(newest["advantage"]),
            fmt(newest["rewards"]["correctness"]),
            fmt(newest["rewards"]["format"]),
        ]
