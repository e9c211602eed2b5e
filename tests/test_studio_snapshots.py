"""Snapshot tests of the main screens at 80×24 and 120×40, on deterministic run data.

Update after an intended UI change with: pytest tests/test_studio_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import config as cfgmod
from grpo_studio.studio import hardware
from grpo_studio.studio.app import StudioApp

SIZES = [(80, 24), (120, 40)]


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """Two finished runs (bf16, fp16) and one mid-run, under a relative runs/ folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hardware, "gpus", lambda: [])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("TZ", "UTC")
    write_run(Path("runs/tiny-bf16"), 40, dtype="bf16", seed=1)
    write_run(Path("runs/tiny-fp16"), 40, dtype="fp16", seed=2)
    write_run(Path("runs/tiny-live"), 17, total=40, dtype="bf16", seed=3, state="stopped")
    return Path("runs")


def app_for(runs: Path) -> StudioApp:
    cfg = cfgmod.load("tiny-arith", ["model.name=Qwen/Qwen3-0.6B", "model.dtype=bf16"])
    return StudioApp(cfg, "tiny-arith", runs, live_hardware=False, poll_s=3600)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_setup_screen(snap_compare, runs, size):
    assert snap_compare(app_for(runs), terminal_size=size)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_dashboard(snap_compare, runs, size):
    async def open_run(pilot):
        pilot.app.open_run(runs / "tiny-live")
        await pilot.pause()

    assert snap_compare(app_for(runs), terminal_size=size, run_before=open_run)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_dashboard_mismatch_tab(snap_compare, runs, size):
    async def open_run(pilot):
        pilot.app.open_run(runs / "tiny-fp16")
        await pilot.pause()
        await pilot.press("3")
        await pilot.pause()

    assert snap_compare(app_for(runs), terminal_size=size, run_before=open_run)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_runs_list(snap_compare, runs, size):
    assert snap_compare(app_for(runs), terminal_size=size, press=["f3"])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_compare(snap_compare, runs, size):
    async def compare(pilot):
        pilot.app.compare_runs([runs / "tiny-bf16", runs / "tiny-fp16"])
        await pilot.pause()

    assert snap_compare(app_for(runs), terminal_size=size, run_before=compare)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_dashboard_lag_verdict(snap_compare, runs, size):
    """An asynchronous run (30% of tokens one version behind, lagged k3 30× lag-0): the Mismatch tab's verdict
    and lag charts. Its own folder, so the runs list stays the three runs above."""
    lagged = write_run(Path("async/tiny-async"), 40, dtype="bf16", seed=6, lagged=30.0)

    async def open_run(pilot):
        pilot.app.open_run(lagged)
        await pilot.pause()
        await pilot.press("3")
        await pilot.pause()

    assert snap_compare(app_for(runs), terminal_size=size, run_before=open_run)
