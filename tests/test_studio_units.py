"""Studio building blocks: tailing with back-pressure, downsampling, chart ticks and notes, run states, keymaps."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import psutil
import pytest
from textual.app import App

from grpo_studio.benchmarks.synthetic_run import ENV_ONLY, LAGGED_ONLY, MOE_ONLY, write_run
from grpo_studio.contract import metrics, rundir
from grpo_studio.contract.metrics import fmt
from grpo_studio.studio import launcher
from grpo_studio.studio.keymap import load_keymap
from grpo_studio.studio.panels import LOSS_NOTE, PANELS
from grpo_studio.studio.rundata import RunData
from grpo_studio.studio.widgets.chart_axes import log_range, ticks
from grpo_studio.studio.widgets.metric_chart import Line, MetricChart, downsample, ema
from tests.studio_helpers import anyio_backend, visible_text  # noqa: F401
from tests.trained_runs import DTYPES, TRAINED_STEPS


def test_rundata_reads_partial_lines_only_when_complete(tmp_path):
    path = tmp_path / rundir.METRICS
    path.write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "rew')
    run = RunData(tmp_path)
    assert run.poll() and run.steps == [1]
    v = run.version
    assert not run.poll() and run.version == v  # nothing new: no redraw
    with open(path, "a") as fh:
        fh.write('ard/mean": 0.75}\n')
    assert run.poll() and run.steps == [1, 2] and run.series("reward/mean") == ([1, 2], [0.5, 0.75])


def test_rundata_back_pressure_drains_a_big_backlog_over_several_polls(tmp_path):
    pad = "x" * 2000
    with open(tmp_path / rundir.METRICS, "w") as fh:
        for step in range(1, 10_001):
            fh.write(json.dumps({"step": step, "reward/mean": step / 10_000, "note": pad}) + "\n")
    run = RunData(tmp_path)
    run.poll()
    assert 0 < len(run.steps) < 10_000  # one poll reads at most 8 MiB
    run.drain()
    assert run.steps == list(range(1, 10_001))


def test_rundata_a_repeated_step_keeps_its_later_row(tmp_path):
    """A step written again replaces its row in place (a resume's rewrite of the file starts over instead:
    tests/test_readers_hostile.py)."""
    run = RunData(tmp_path)
    run.add_metrics([{"step": s, "loss": float(s)} for s in (1, 2, 3, 4)])
    run.add_metrics([{"step": 3, "loss": 30.0}])
    assert run.series("loss") == ([1, 2, 3, 4], [1.0, 2.0, 30.0, 4.0])


def test_downsample_keeps_ends_and_bucket_means():
    xs = list(range(1, 10_001))
    ys = [float(x) for x in xs]
    dx, dy = downsample(xs, ys, 200)
    assert len(dx) == 200 and dx[-1] == 10_000 and dy[-1] == 10_000.0
    assert abs(dy[0] - sum(ys[:50]) / 50) < 1e-9
    assert downsample([1, 2], [3.0, 4.0], 200) == ([1, 2], [3.0, 4.0])
    assert ema([1.0, 3.0], alpha=0.5) == [1.0, 2.0]


def test_run_states_from_events_and_pid(tmp_path):
    assert RunData(write_run(tmp_path / "a", 5, state="finished")).state() == "finished"
    b = write_run(tmp_path / "b", 5, state="running")
    (b / "trainer.pid").unlink()  # started, no goodbye, no live pid
    run = RunData(b)
    run.drain()
    assert run.state() == rundir.run_state(b).state == "crashed"
    # a stand-in trainer: a live process whose command line is a grpo-studio train of this run directory
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "grpo_studio.cli.main", "train", "--run-dir", str(b)]
    sleeper = subprocess.Popen(argv, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(sleeper.pid).cmdline() != argv and time.monotonic() < deadline:
            time.sleep(0.01)  # until the fork has become the stand-in
        rundir.write_lock(b, rundir.Lock.of(sleeper.pid))
        assert run.state() == rundir.run_state(b).state == "running"
        launcher.kill(b)  # SIGKILL to the proven trainer and its children
        sleeper.wait(timeout=10)
        assert sleeper.returncode == -9
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


def test_synthetic_rows_hold_every_schema_metric(tmp_path):
    every = set(metrics.names(["correctness", "format"]))
    # an async MoE run: the lagged tokens' mismatch and the routers' disagreement too; env/*: multi-turn runs only
    lagged = RunData(write_run(tmp_path / "lagged", 3, lagged=0.3, moe=True))
    lagged.drain()
    assert set(lagged.columns) | {"step", "time"} == every - ENV_ONLY
    episodic = RunData(write_run(tmp_path / "episodes", 3, episodes=True))
    episodic.drain()
    assert set(episodic.columns) | {"step", "time"} == every - LAGGED_ONLY - MOE_ONLY | {"env/tool_calls/calc"}
    run = RunData(write_run(tmp_path / "r", 3))  # a dense model has no routers
    run.drain()
    assert set(run.columns) | {"step", "time"} == every - LAGGED_ONLY - ENV_ONLY - MOE_ONLY
    assert run.steps == [1, 2, 3] and run.histogram["edges"] == metrics.HIST_EDGES


def test_panels_read_their_keys_and_log_axes_from_the_schema():
    assert all(key in metrics.SCHEMA for panel in PANELS.values() for key in panel.keys)
    assert {pid for pid, panel in PANELS.items() if panel.log} == {"k3", "loss_scale", "lag_k3"}


def test_ticks_are_whole_steps_and_round_values():
    assert ticks(1, 40, integer=True) == [10, 20, 30, 40]
    assert ticks(1, 17, integer=True) == [5, 10, 15]
    assert ticks(1, 3, integer=True) == [1, 2, 3]
    assert ticks(1.5e-8, 2.1e-8) == pytest.approx([1.6e-8, 1.8e-8, 2.0e-8])
    assert ticks(-0.01, 0.01) == pytest.approx([-0.01, -0.005, 0.0, 0.005, 0.01])
    lo, hi, marks = log_range(math.log10(4e-8), math.log10(1.8e-7))
    assert [10**t for t in marks] == pytest.approx([5e-8, 1e-7]) and 10**lo == pytest.approx(4e-8)
    # whole decades, the frame widened to them, when 1-2-5 marks are too many
    assert log_range(-13.2, -5.1) == (-15, -5, [-15, -10, -5])
    # less than one 1-2-5 mark: round values inside the data's frame, never 6.30957e-06
    lo, hi, marks = log_range(math.log10(3.98e-6), math.log10(6.31e-6), 3)
    assert [10**t for t in marks] == pytest.approx([4e-6, 5e-6, 6e-6])


@pytest.mark.anyio
async def test_chart_labels_steps_tiny_values_and_its_note():
    """A loss of ~1e-8 over 40 steps: whole-step x labels, scientific y labels, the note (its words wrapped under
    the plot when the chart is narrower than it, none lost)."""

    class One(App):
        def compose(self):
            yield MetricChart("loss", note=LOSS_NOTE)

    app = One()
    async with app.run_test(size=(60, 14)) as pilot:
        chart = app.query_one(MetricChart)
        chart.show([Line("loss", list(range(1, 41)), [1.5e-8 + 1.5e-10 * i for i in range(40)])])
        await pilot.pause()
        text = visible_text(chart)
        # the frame widened to round ends (1.4e-8, 2.2e-8), labelled in one format with the digits they need
        assert [line.split("┤")[0].strip() for line in text.splitlines() if "┤" in line] == [
            "2.2e-08",
            "2.0e-08",
            "1.8e-08",
            "1.6e-08",
            "1.4e-08",
        ]
        assert text.splitlines()[-2].split() == ["10", "20", "30", "40"]
        assert text.splitlines()[-1].strip() == LOSS_NOTE
        await pilot.resize_terminal(30, 14)
        await pilot.pause()
        lines = [line.strip() for line in visible_text(chart).splitlines()]
        assert lines[-2:] == ["≈0 by design: ratio 1, zero-", "mean advantages; gradient ≠ 0"], lines


def test_duplicate_with_other_dtype(tmp_path):
    run = write_run(tmp_path / "r", 3, dtype="bf16")
    cfg, dtype = launcher.duplicate_with_dtype(run)
    assert dtype == "fp16" and cfg.model.dtype == "fp16" and cfg.rollout_dtype == "fp16"
    assert cfg.train.steps == 3


def test_keymap_file(tmp_path, monkeypatch):
    path = tmp_path / "keymap.toml"
    path.write_text('[keys]\n"setup.launch" = "f5"\n"dashboard.stop" = "ctrl+x"\n')
    monkeypatch.setenv("GRPO_STUDIO_KEYMAP", str(path))
    assert load_keymap() == ({"setup.launch": "f5", "dashboard.stop": "ctrl+x"}, "")
    path.write_text('[keys]\n"setup.launch" = 5\n')
    keys, error = load_keymap()
    assert keys == {} and "setup.launch must be a string" in error


def test_studio_refuses_to_run_without_a_terminal():
    out = subprocess.run(
        [sys.executable, "-m", "grpo_studio.cli.main"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "TEXTUAL_DRIVER"},
    )
    assert out.returncode == 2
    assert "not a terminal" in out.stderr


def test_attach_unknown_run_is_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "grpo_studio.cli.main", "attach", "nope", "--runs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "attach error: run 'nope' not found" in out.stderr


def test_report_cli_writes_pngs_and_html(tmp_path):
    run = write_run(tmp_path / "r", 12, dtype="fp16")
    out = subprocess.run(
        [sys.executable, "-m", "grpo_studio.cli.main", "report", str(run), "--out", str(tmp_path / "rep")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    pngs = sorted(p.name for p in (tmp_path / "rep").glob("*.png"))
    assert {"reward.png", "k3.png", "loss_scale.png", "dlogp_histogram.png"} <= set(pngs)
    assert all((tmp_path / "rep" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    html = (tmp_path / "rep" / "index.html").read_text()
    assert "reward.png" in html and "fp16/fp16" in html and "skipped_step" in html


def _file_rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / rundir.METRICS).read_text().splitlines()]


def test_rundata_reads_a_real_run_column_for_column(trained_runs):
    """RunData over a run the real trainer wrote: every column of metrics.jsonl, value for value."""
    for dtype in DTYPES:
        rows = _file_rows(trained_runs[dtype])
        run = RunData(trained_runs[dtype])
        run.drain()
        assert run.steps == [r["step"] for r in rows] == list(range(1, TRAINED_STEPS + 1))
        keys = {k for r in rows for k in r} - {"step", "time"}
        assert set(run.columns) == keys
        assert "eval/accuracy" in keys and (dtype == "fp16") == ("precision/loss_scale" in keys)
        events = [json.loads(line) for line in (trained_runs[dtype] / rundir.EVENTS).read_text().splitlines()]
        (before,) = [e for e in events if e["event"] == "eval" and e["step"] == 0]
        for key in keys:
            present = [r for r in rows if r.get(key) is not None]
            # the starting weights' score (every eval/* value, its interval too)
            start = ([0], [before[key.removeprefix("eval/")]]) if key.startswith("eval/") else ([], [])
            assert run.series(key) == (start[0] + [r["step"] for r in present], start[1] + [r[key] for r in present]), (
                key
            )
        assert run.series("eval/accuracy")[0] == [0, 2, 4]  # before training, then train.eval_every = 2
        assert (run.state(), run.total_steps, run.dtype()) == ("finished", TRAINED_STEPS, f"{dtype}/{dtype}")
        assert run.reward_funcs() == ["correctness", "format"]


def test_compare_overlay_and_summary_hold_the_real_files_values(trained_runs):
    """compare.overlay draws each run's column exactly; compare.summary prints the last values
    through metrics.fmt (runs written by the real trainer)."""
    from grpo_studio.studio.screens.compare_screen import COMPARE_PANELS, overlay, summary

    runs = [RunData(trained_runs[d]) for d in DTYPES]
    for run in runs:
        run.drain()
    files = [_file_rows(trained_runs[d]) for d in DTYPES]
    keys = {"reward": metrics.REWARD, "k3": metrics.K3, "loss": metrics.LOSS, "dp_max": metrics.DP_MAX}
    assert COMPARE_PANELS == list(keys)
    for pid, key in keys.items():
        lines = overlay(runs, pid)
        assert [line.label for line in lines] == [f"real-{d} {d}/{d}" for d in DTYPES]
        for line, rows in zip(lines, files):
            assert line.xs == [r["step"] for r in rows] == list(range(1, TRAINED_STEPS + 1))
            assert line.ys == [r[key] for r in rows], pid
    table = summary(runs)
    cells = [list(col._cells) for col in table.columns]
    assert [c.header for c in table.columns] == ["run", "dtype", "state", "step", "reward", "k3", "|Δp| max"]
    for i, (d, rows) in enumerate(zip(DTYPES, files)):
        assert [col[i] for col in cells] == [
            f"real-{d}",
            f"{d}/{d}",
            "finished",
            str(TRAINED_STEPS),
            fmt(rows[-1][metrics.REWARD]),
            fmt(rows[-1][metrics.K3]),
            fmt(rows[-1][metrics.DP_MAX]),
        ]


def test_report_of_a_real_run_prints_the_files_values(trained_runs, tmp_path):
    """report.export on a run the real trainer wrote: the summary table's values are the file's,
    formatted by metrics.fmt; one PNG per panel with data (no kl_ref with beta = 0, the fp16 loss
    scale only for the fp16 run) plus the Δlogp histogram."""
    import re

    from grpo_studio.studio.report import export

    for dtype in DTYPES:
        run_dir = trained_runs[dtype]
        out = export(run_dir, tmp_path / dtype)
        rows = _file_rows(run_dir)
        smooth = None
        for r in rows:  # EMA, alpha 0.1
            smooth = r[metrics.REWARD] if smooth is None else smooth + 0.1 * (r[metrics.REWARD] - smooth)
        page = (out / "index.html").read_text()
        table = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", page))
        assert table == {
            "state": "finished",
            "steps": f"{TRAINED_STEPS}/{TRAINED_STEPS}",
            "dtype (train/rollout)": f"{dtype}/{dtype}",
            "model": "tiny-arith",
            "algorithm": "grpo",
            "final reward": fmt(rows[-1][metrics.REWARD]),
            "smoothed reward": fmt(smooth),
            "final k3": fmt(rows[-1][metrics.K3]),
            "peak memory GiB": fmt(rows[-1][metrics.PEAK_GIB]),
        }
        pngs = {p.name for p in out.glob("*.png")}
        expected = {
            f"{pid}.png"
            for pid in (
                "reward",
                "eval",
                "k3",
                "loss",
                "grad_norm",
                "entropy",
                "dp_max",
                "is",
                "length",
                "step_time",
                "tok_s",
                "memory",
            )
        } | {"dlogp_histogram.png"}
        assert pngs == expected | ({"loss_scale.png"} if dtype == "fp16" else set())
        assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
        assert re.findall(r'<img src="(.*?)"', page) and set(re.findall(r'<img src="(.*?)"', page)) == pngs


def test_runs_cli_lists_states(tmp_path):
    write_run(tmp_path / "done", 4, state="finished")
    write_run(tmp_path / "halted", 2, total=4, state="stopped")
    time.sleep(0.01)
    out = subprocess.run(
        [sys.executable, "-m", "grpo_studio.cli.main", "runs", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    lines = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:]}
    assert lines["done"][1:3] == ["finished", "4/4"] and lines["halted"][1:3] == ["stopped", "2/4"]


def test_log_chart_keeps_fp32_scale_mismatch():
    """fp32 k3 (~1e-13 to 1e-14) stays on the log10 axis; an exact 0 is left out (and counted), never floored."""
    from grpo_studio.studio.widgets.metric_chart import positive

    assert positive([1, 2, 3], [1e-13, 1e-14, 0.0]) == ([1, 2], [1e-13, 1e-14], 1)


def test_eval_accuracy_starts_at_step_0_with_the_before_training_event(tmp_path):
    from grpo_studio.studio import report

    run_dir = write_run(tmp_path / "r", 20)
    rows = [json.loads(line) for line in (run_dir / rundir.METRICS).read_text().splitlines()]
    for row in rows:
        row.pop(metrics.EVAL_ACCURACY, None)
    rows[9][metrics.EVAL_ACCURACY], rows[19][metrics.EVAL_ACCURACY] = 0.5, 0.75
    (run_dir / rundir.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    with (run_dir / rundir.EVENTS).open("a") as fh:
        fh.write(json.dumps({"time": 1.0, "event": "eval", "message": "before", "step": 0, "accuracy": 0.125}) + "\n")
    run = RunData(run_dir)
    run.drain()
    assert run.series(metrics.EVAL_ACCURACY) == ([0, 10, 20], [0.125, 0.5, 0.75])
    assert run.series(metrics.REWARD)[0][0] == 1  # only eval/accuracy has a step 0
    out = report.export(run_dir)
    assert (out / "eval.png").stat().st_size > 0 and 'alt="eval"' in (out / "index.html").read_text()
