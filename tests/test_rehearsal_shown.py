"""The rehearsal shown while it runs: the trainer process (`train --rehearse`, in this process, its rehearsal held
until the test lets it go) writes a `rehearsal` event with phase "running" before the step, so the run is listed
and its dashboard says "rehearsing" with the event's line; then the result (phase "done"), and the Device tab's
one planned number per memory kind next to the rehearsal's peak and the run's, each as the files hold it."""

from __future__ import annotations

import json
import threading
import time

import pytest

from grpo_studio.cli import main as cli_main
from grpo_studio.contract import config as cfgmod
from grpo_studio.contract import run_state
from grpo_studio.contract.metrics import PEAK_GIB, fmt
from grpo_studio.contract.planner import preflight
from grpo_studio.contract.rundir import CONFIG, EVENTS, METRICS, read_events
from grpo_studio.engine.run import rehearsal
from grpo_studio.studio import memory_rows
from grpo_studio.studio.app import StudioApp
from tests.studio_helpers import anyio_backend, visible_text, wait_until  # noqa: F401

SETS = ["train.steps=1", "train.prompts_per_step=2", "rollout.num_generations=2"]


def flat(widget) -> str:
    return " ".join(visible_text(widget).split())


@pytest.mark.anyio
async def test_the_dashboard_shows_the_rehearsal_running_then_its_result(tmp_path, monkeypatch):
    gate, real = threading.Event(), rehearsal.rehearse

    def held(*args):
        assert gate.wait(300)
        return real(*args)

    monkeypatch.setattr(rehearsal, "rehearse", held)
    run = tmp_path / "runs" / "run"
    codes: list[int] = []
    sets = [a for s in SETS for a in ("--set", s)]
    argv = ["train", "--no-supervisor", "tiny-arith", *sets, "--run-dir", str(run), "--rehearse"]
    trainer = threading.Thread(target=lambda: codes.append(cli_main.main(argv)))
    trainer.start()
    try:
        deadline = time.monotonic() + 120  # a hung trainer's deadline, not a speed assert
        while not (run / EVENTS).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (running,) = read_events(run)
        assert running["event"] == "rehearsal" and running["phase"] == "running"
        assert running["message"] == (
            f"rehearsal: one step on the longest prompt at {cfgmod.load('tiny-arith').rollout.max_completion_len} "
            f"completion tokens, {running['planned_gib']:.2f} GiB planned (host RAM) …"
        )
        assert run_state.run_state(run).state == "created"  # no lock, no state event yet
        assert [r["name"] for r in run_state.run_summaries(run.parent)] == ["run"]  # listed while it rehearses
        app = StudioApp(live_hardware=False, poll_s=3600)
        async with app.run_test(size=(120, 40)) as pilot:
            app.open_run(run)
            await pilot.pause()
            title, step = app.screen.query_one("#run-title"), app.screen.query_one("#run-step")
            assert flat(title).startswith("rehearsing · ")
            assert flat(step) == " ".join(running["message"].split())
            await pilot.press("7")  # Device
            await pilot.pause()
            info = app.screen.query_one("#hardware-info")
            assert f"planned host RAM {running['planned_gib']:.2f} GiB (the run's pre-flight, host RAM)" in flat(info)
            assert "rehearsal peak rehearsing …" in flat(info) and "run peak – (no step yet)" in flat(info)
            gate.set()
            trainer.join(600)
            assert codes == [0]
            app.screen.refresh_data()
            app.screen.drawn.clear()
            await pilot.press("1", "7")
            await pilot.pause()
            done = [e for e in read_events(run) if e["event"] == "rehearsal"][-1]
            assert done["phase"] == "done" and done["planned_gib"] == running["planned_gib"]
            peak = max(json.loads(line)[PEAK_GIB] for line in (run / METRICS).read_text().splitlines())
            text = flat(info)
            assert f"rehearsal peak {done['measured_gib']:.2f} GiB (peak RSS growth, getrusage ru_maxrss)" in text
            assert f"run peak {fmt(peak)} GiB (mem/peak_gib, the trainer's peak RSS)" in text
            assert "run peak: the trainer's whole peak RSS, Python and torch included" in text
            assert flat(title).startswith("finished · ")
    finally:
        gate.set()
        trainer.join(600)


def test_the_device_tabs_planned_number_is_the_preflights_on_this_machine(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = cfgmod.load("tiny-arith", SETS)
    cfgmod.save(cfg, run / CONFIG)
    plan = memory_rows.plan_here(run)
    assert plan is not None and plan.where == preflight.device().where()
    assert plan.gib == preflight.check(cfg, preflight.devices()).need_gib
