"""The studio against a real trainer: launch by keyboard, watch real rows arrive, stop gracefully,
reattach from a fresh app and see the same history; then compare finished runs."""

from __future__ import annotations

import json
import os

import pytest

from grpo_studio.engine.contract import config as cfgmod
from grpo_studio.engine.contract import rundir
from grpo_studio.studio import hardware
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.charts import MetricChart
from grpo_studio.studio.compare import CompareScreen
from grpo_studio.studio.dashboard import DashboardScreen
from grpo_studio.studio.runs_screen import RunsScreen
from tests.studio_helpers import anyio_backend, tiny_model_name, visible_text, wait_until  # noqa: F401
from tests.synthetic_run import write_run

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
    cfg = cfgmod.load("tiny-arith", [f"model.name={model}", "train.steps=400", "train.prompts_per_step=2",
                                     "rollout.num_generations=2", "train.save_every=0"])
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
        assert reward.lines[0].xs == on_disk[:len(reward.lines[0].xs)]
        rows = metrics_rows(run_dir)
        assert reward.lines[0].ys == [r["reward/mean"] for r in rows[:len(reward.lines[0].ys)]]
        assert "reward" in visible_text(reward)
        pid = rundir.read_pid(run_dir)
        assert pid is not None and os.getpgid(pid) == pid  # its own session / process group

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
    again = StudioApp(cfgmod.load(str(run_dir / rundir.CONFIG)), str(run_dir), runs, attach=run_dir,
                      live_hardware=False)
    async with again.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        dash2 = again.screen
        assert isinstance(dash2, DashboardScreen)
        await wait_until(pilot, lambda: dash2.query_one("#overview-reward", MetricChart).lines)
        assert dash2.run.steps == history == metrics_steps(run_dir)
        assert dash2.query_one("#overview-reward", MetricChart).lines[0].ys == first_reward
        assert dash2.run.state() == "stopped"


async def test_compare_two_finished_runs_by_keyboard(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "runs" / "ab-bf16", 30, dtype="bf16", seed=1)
    write_run(tmp_path / "runs" / "ab-fp16", 30, dtype="fp16", seed=2)
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", tmp_path / "runs", live_hardware=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("f3")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)
        table_text = visible_text(app.screen.query_one("#runs-table"))
        assert "ab-bf16" in table_text and "ab-fp16" in table_text and "finished" in table_text
        await pilot.press("space", "space", "c")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        k3 = app.screen.query_one("#cmp-k3", MetricChart)
        assert len(k3.lines) == 2
        assert {line.label.split()[-1] for line in k3.lines} == {"bf16/bf16", "fp16/fp16"}
        bf16 = next(line for line in k3.lines if "bf16/bf16" in line.label)
        fp16 = next(line for line in k3.lines if "fp16/fp16" in line.label)
        assert len(bf16.xs) == len(fp16.xs) == 30
        assert sum(bf16.ys) > sum(fp16.ys)  # the data says bf16 drifts more; the chart must carry it
        summary = visible_text(app.screen.query_one("#compare-summary"))
        assert "ab-bf16" in summary and "ab-fp16" in summary
