"""The studio's lag verdict, Perf time split, per-rank hardware rows and the devices control on the setup
screen: pure functions against hand cases, then the real app on synthetic run directories (real files)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import psutil
import pytest
from textual.widgets import Select, Static

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.cli.train_cmd import check_launch
from grpo_studio.contract import config as cfgmod
from grpo_studio.contract import model_card
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.planner import vram
from grpo_studio.studio import hardware, lag
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.rundata import RunData
from grpo_studio.studio.screens.setup_screen import SetupScreen
from grpo_studio.studio.widgets.metric_chart import MetricChart, percent
from grpo_studio.studio.widgets.perf_tables import rank_values, split_table, time_split
from grpo_studio.studio.widgets.vram_panel import VramPanel
from tests.studio_helpers import anyio_backend, focus_field, visible_text, wait_until  # noqa: F401


async def open_tab(app, pilot, run_dir, key: str) -> None:
    """Open the run's dashboard and switch to the tab of number `key`."""
    app.open_run(run_dir)
    await pilot.pause()
    await pilot.press(key)
    await pilot.pause()


# ---- the verdict: which cause dominates (hand cases) -------------------------------------------


def test_verdict_policy_lag_when_lagged_k3_far_above_lag0():
    v = lag.verdict(1e-6, 1e-4, 0.3, "bf16")
    assert v.cause == "lag"
    assert v.line == (
        "policy lag dominates (lagged k3 1.00e-04 ≫ lag-0 k3 1.00e-06, 30% of tokens lagged): "
        "set rollout.async_mode = off or lower train.max_staleness"
    )


def test_verdict_precision_gap_offers_the_one_click_dtype_ab():
    v = lag.verdict(3e-6, 4e-6, 0.3, "bf16")
    assert v.cause == "precision"
    assert v.line.endswith("press d: duplicate with model.dtype = fp16 (one-click precision A/B)")
    assert lag.verdict(3e-6, 4e-6, 0.3, "fp8").line.endswith("model.dtype = bf16 (one-click precision A/B)")
    # fp16's A/B partner (bf16) drifts more: not offered as the fix
    assert lag.verdict(5e-8, None, 0.0, "fp16").line.endswith(
        "fp16 already drifts less than bf16; model.dtype = fp32 narrows it further"
    )


def test_verdict_boundary_is_strictly_more_than_four_times():
    assert lag.verdict(1e-6, 4e-6, 0.5, "bf16").cause == "precision"
    assert lag.verdict(1e-6, 4.01e-6, 0.5, "bf16").cause == "lag"


def test_verdict_without_lagged_tokens_is_the_precision_gap_or_nothing():
    assert lag.verdict(3e-6, None, 0.0, "bf16").cause == "precision"
    assert lag.verdict(3e-6, 9e-3, 0.0, "bf16").cause == "precision"  # no lagged tokens: their k3 means nothing
    assert lag.verdict(1e-14, None, 0.0, "fp32").cause == "none"
    assert lag.verdict(1e-14, 1e-12, 0.2, "fp32").cause == "none"
    assert lag.verdict(None, None, None) is None


def test_lag_shares_reads_the_histogram_lag_counts_in_lag_order():
    assert lag.lag_shares({"lag": {"0": 7, "1": 3}}) == "tokens by lag 0: 70% · 1: 30%"
    assert lag.lag_shares({"lag": {"10": 1, "2": 3}}) == "tokens by lag 2: 75% · 10: 25%"
    assert lag.lag_shares({"lag": {"0": 12}}) == ""  # a synchronous run: nothing lags
    assert lag.lag_shares({"step": 3}) == "" and lag.lag_shares(None) == ""


# ---- the Perf time split and per-rank rows (hand computations) ---------------------------------


def test_time_split_parts_add_up_to_the_step():
    run = RunData(Path("/nonexistent"))
    run.add_metrics(
        [
            {"step": 1, "perf/step_s": 2.0, "perf/trainer_wait_s": 1.0, "perf/sync_s": 0.25, "perf/idle_s": 0.25},
            {"step": 2, "perf/step_s": 4.0, "perf/trainer_wait_s": 0.5, "perf/sync_s": 0.5, "perf/idle_s": 0.0},
        ]
    )
    rows = {r.phase: r for r in time_split(run)}
    assert list(rows) == ["wait for rollout", "train (derived)", "weight sync", "other"]
    assert (rows["wait for rollout"].last, rows["wait for rollout"].mean) == (0.5, 0.75)
    assert (rows["train (derived)"].last, rows["train (derived)"].mean) == (
        3.0,
        3.0 - 0.75 - 0.375 - 0.125,
    )  # the step less the rest
    assert rows["weight sync"].share == pytest.approx(0.375 / 3.0)
    assert sum(r.share for r in rows.values()) == pytest.approx(1.0)
    older = RunData(Path("/nonexistent"))  # a run without perf/idle_s shows no split
    older.add_metrics([{"step": 1, "perf/step_s": 2.0, "perf/trainer_wait_s": 1.0, "perf/sync_s": 0.25}])
    assert time_split(older) == []


def split_text(rows: list[dict]) -> str:
    from rich.console import Console

    run = RunData(Path("/nonexistent"))
    run.add_metrics(rows)
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(split_table(run))
    return console.export_text()


def test_perf_table_shows_mfu_in_percent_and_flags_one_above_the_peak():
    row = {"step": 1, "perf/step_s": 2.0, "perf/trainer_wait_s": 1.0, "perf/sync_s": 0.25, "perf/idle_s": 0.25}
    assert "MFU 32.54%" in split_text([{**row, "perf/mfu": 0.3254}])
    assert "stale" not in split_text([{**row, "perf/mfu": 1.0}])
    # above 100%: the peak it was divided by is stale (engine/train/flops.py Peak measures it again); shown as is
    assert "MFU 125% (peak stale)" in split_text([{**row, "perf/mfu": 1.25}])


def test_rank_values_gathers_every_rank_column():
    run = RunData(Path("/nonexistent"))
    run.add_metrics(
        [
            {
                "step": 1,
                "perf/rank0/step_s": 1.5,
                "perf/rank1/step_s": 1.75,
                "perf/rank1/comm_s": 0.25,
                "mem/rank1/peak_gib": 3.0,
                "perf/step_s": 1.75,
            }
        ]
    )
    assert rank_values(run) == {
        0: {"perf/rank<i>/step_s": 1.5},
        1: {"perf/rank<i>/step_s": 1.75, "perf/rank<i>/comm_s": 0.25, "mem/rank<i>/peak_gib": 3.0},
    }


# ---- the dashboard on real run directories -----------------------------------------------------


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(hardware, "gpus", lambda: [])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))


def app_on(runs: Path) -> StudioApp:
    return StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", runs, live_hardware=False, poll_s=3600)


def lag_charts(app) -> dict[str, bool]:
    return {c.id: c.display for c in app.screen.query(MetricChart) if c.id in ("mismatch-lag_k3", "mismatch-token_lag")}


@pytest.mark.anyio
async def test_mismatch_tab_shows_the_verdict_and_the_lag_charts_only_for_a_lagged_run(tmp_path, no_gpu):
    lagged = write_run(tmp_path / "runs/async", 12, dtype="bf16", seed=1, lagged=30.0)
    synced = write_run(tmp_path / "runs/sync", 12, dtype="bf16", seed=1)
    app = app_on(tmp_path / "runs")
    async with app.run_test(size=(120, 40)) as pilot:
        await open_tab(app, pilot, lagged, "3")
        info = app.screen.query_one("#mismatch-info", Static)
        text = " ".join(visible_text(info).split())
        assert info.display and "policy lag dominates" in text and lag.LAG_FIX in text
        assert "tokens by lag 0: 70% · 1: 30%" in text  # histograms.jsonl's lag counts
        assert lag_charts(app) == {"mismatch-lag_k3": True, "mismatch-token_lag": True}
        run = app.screen.run
        want = lag.verdict(run.last(lag.LAG0_K3), run.last(lag.LAGGED_K3), run.last(lag.LAGGED_FRAC), "bf16")
        assert want.cause == "lag" and want.line in text  # the same rule as the unit cases, on the file's numbers
        await pilot.press("escape")
        await open_tab(app, pilot, synced, "3")
        info = app.screen.query_one("#mismatch-info", Static)
        text = " ".join(visible_text(info).split())
        assert info.display and text.startswith("precision/kernel gap (no lagged tokens, lag-0 k3 ")
        assert text.endswith("press d: duplicate with model.dtype = fp16 (one-click precision A/B)")
        assert lag_charts(app) == {"mismatch-lag_k3": False, "mismatch-token_lag": False}


@pytest.mark.anyio
async def test_perf_tab_shows_mfu_and_the_time_split(tmp_path, no_gpu):
    run_dir = write_run(tmp_path / "runs/r", 8, dtype="bf16", seed=4)
    app = app_on(tmp_path / "runs")
    async with app.run_test(size=(120, 40)) as pilot:
        await open_tab(app, pilot, run_dir, "5")
        info = app.screen.query_one("#perf-info", Static)
        text = visible_text(info)
        run = app.screen.run
        for phase in ("wait for rollout", "train", "weight sync", "other", "sampling"):
            assert phase in text
        last = run.last("perf/mfu")
        assert f"MFU {percent(last)}" in text and "stale" not in text
        mfu = app.screen.query_one("#perf-mfu", MetricChart)
        assert mfu.display and mfu.lines[0].ys == run.series("perf/mfu")[1]  # the file's fractions, drawn
        chart = visible_text(mfu)  # shown in percent, as the table shows them: headline and ticks
        assert f"MFU, % of measured matmul peak  {percent(last)}" in chart
        ticks = [line.split("┤")[0].strip() for line in chart.splitlines() if "┤" in line]
        assert len(ticks) >= 2 and all(t.endswith("%") for t in ticks if t), ticks


@pytest.mark.anyio
async def test_hardware_tab_lists_each_data_parallel_rank(tmp_path, no_gpu):
    run_dir = write_run(tmp_path / "runs/ddp", 6, dtype="bf16", seed=5, world_size=2)
    app = app_on(tmp_path / "runs")
    async with app.run_test(size=(120, 40)) as pilot:
        await open_tab(app, pilot, run_dir, "7")
        text = visible_text(app.screen.query_one("#hardware-info", Static))
        run = app.screen.run
        from grpo_studio.contract.metrics import fmt

        for rank in (0, 1):
            line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"rank {rank}"))
            assert line.split()[2:] == [
                fmt(run.last(f"perf/rank{rank}/step_s")),
                fmt(run.last(f"perf/rank{rank}/comm_s")),
                fmt(run.last(f"mem/rank{rank}/peak_gib")),
            ]


# ---- the setup screen's devices control (GPUs faked: the one mock allowed) ---------------------


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (torchrun's ranks run in sessions of their own): suspend
    each level first, so nothing spawns between the listing and the kill."""
    root, seen = psutil.Process(pid), {}
    while True:
        try:
            new = [p for p in [root, *root.children(recursive=True)] if p.pid not in seen]
        except psutil.NoSuchProcess:
            break
        if not new:
            break
        for p in new:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.suspend()
            seen[p.pid] = p
    for p in seen.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def fake_gpus(n: int):
    return lambda: [hardware.Gpu(i, "NVIDIA H100 80GB HBM3", 79.6, 0.5, 0.0) for i in range(n)]


@pytest.mark.anyio
async def test_no_devices_control_without_more_than_one_gpu(tmp_path, no_gpu):
    app = app_on(tmp_path / "runs")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert not app.screen.query("#devices") and app.screen.nproc() == 1


@pytest.mark.anyio
async def test_two_gpus_offer_two_devices_and_launch_with_nproc(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "gpus", fake_gpus(2))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    base = cfgmod.load("tiny-arith")
    with pytest.raises(UserError, match="train.parallel"):
        check_launch(base, 2, None)  # the recipe alone: the CLI refuses --nproc 2
    app = app_on(tmp_path / "runs")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SetupScreen)
        devices = screen.query_one("#devices", Select)
        assert [str(o[0]) for o in devices._options] == ["1", "2"]
        await focus_field(pilot, "devices")
        await pilot.press("enter", "down", "enter")
        await pilot.pause()
        assert screen.nproc() == 2
        cfg, errors, general = screen.build_config()
        assert not errors and not general and cfg.train.parallel == "ddp"
        check_launch(cfg, 2, None)  # what the studio launches, the CLI accepts
        await pilot.press("ctrl+t")  # accurate mode: the planner's per-device plan, one line per device
        await pilot.pause()
        want = vram.estimate(model_card.load(cfg.model.name), cfg, mode="accurate", gpu_gib=79.6, world_size=2)
        text = visible_text(screen.query_one(VramPanel))
        assert [d.name for d in want.devices] == ["train rank 0", "train rank 1"]
        for dev in want.devices:
            assert f"{dev.name}  {dev.total_gib:,.2f} GiB  ✓" in text
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.procs, timeout=30, step=0.01)
        proc = app.procs[0]
        kill_tree(proc.pid)  # no training here: the command line and the setup it wrote are what is checked
        proc.wait()
        args = proc.args
        assert args[args.index("--nproc") + 1] == "2"
        run_dir = Path(args[args.index("--run-dir") + 1])
        assert cfgmod.load(str(run_dir / "setup.toml")).train.parallel == "ddp"


@pytest.mark.anyio
async def test_devices_that_do_not_divide_the_prompts_are_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "gpus", fake_gpus(3))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    app = app_on(tmp_path / "runs")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await focus_field(pilot, "devices")
        await pilot.press("enter", "down", "down", "enter")
        await pilot.pause()
        screen = app.screen
        assert screen.nproc() == 3
        _, _, general = screen.build_config()
        assert general == (
            "config error: train.prompts_per_step = 16: must divide evenly among the 3 processes "
            "(each samples its share of the prompts)"
        )
        with pytest.raises(UserError, match="must divide evenly"):
            check_launch(cfgmod.load("tiny-arith", ["train.parallel=ddp"]), 3, None)  # the CLI's own rule agrees
