"""The runs list keeps a stable order (newest start first, ties by name; not folder mtime, which moves as a
run writes) and a refresh keeps the cursor on its run, not on its row number."""

from __future__ import annotations

import os
import shutil

import pytest
from textual.widgets import DataTable

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import config as cfgmod
from grpo_studio.contract import rundir
from grpo_studio.contract.run_state import started_at
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.screens.runs_list_screen import RunsScreen
from tests.studio_helpers import anyio_backend  # noqa: F401

T0 = 1_750_000_000.0


def names(screen: RunsScreen) -> list[str]:
    return [row["name"] for row in screen.rows]


def cursor_run(screen: RunsScreen) -> str:
    return screen.rows[screen.query_one(DataTable).cursor_row]["name"]


def test_start_time_is_the_first_event_else_the_config(tmp_path):
    run = write_run(tmp_path / "a", steps=3, t0=T0)
    with open(run / rundir.EVENTS, "a") as fh:
        fh.write('{"time": 9e9, "event": "started", "message": "resumed"}\n')
    assert started_at(run) == T0
    (run / rundir.EVENTS).unlink()
    os.utime(run / rundir.CONFIG, (T0 + 5, T0 + 5))
    assert started_at(run) == T0 + 5


@pytest.mark.anyio
async def test_refresh_keeps_the_order_and_the_cursor_on_its_run(tmp_path):
    runs = tmp_path / "runs"
    for i, name in enumerate(["old", "mid", "new"]):
        write_run(runs / name, steps=4, t0=T0 + 100 * i)
    write_run(runs / "mid-twin", steps=4, t0=T0 + 100)  # same start as "mid": by name
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", runs, live_hardware=False, poll_s=3600)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("f3")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        assert names(screen) == ["new", "mid", "mid-twin", "old"]
        await pilot.press("down")
        assert cursor_run(screen) == "mid"

        with open(runs / "old" / rundir.METRICS, "a") as fh:  # an older run writes: its mtimes move
            fh.write('{"step": 5}\n')
        os.utime(runs / "old", (T0 + 900, T0 + 900))
        write_run(runs / "newest", steps=2, t0=T0 + 500)  # a new run above the cursor
        await pilot.press("r")
        await pilot.pause()
        assert names(screen) == ["newest", "new", "mid", "mid-twin", "old"]
        assert cursor_run(screen) == "mid"

        shutil.rmtree(runs / "mid")  # its run went away: the cursor stays on that row
        await pilot.press("r")
        await pilot.pause()
        assert names(screen) == ["newest", "new", "mid-twin", "old"]
        assert cursor_run(screen) == "mid-twin"
