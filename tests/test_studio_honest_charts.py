"""Charts that hide nothing and captions that say what is true, each against a hand-written expectation:
a log axis leaves out zeros and says how many in its title, spanning the data; a smoothed line is drawn under
the data and the sparsest series last; every chart at 80×24 has a title; "before training" only with a step-0
eval; a share headline names its share; a crashed run with no rows says so; the Perf table's derived part says
its formula and the chart's line is named for what the file's perf/train_s is; synthetic shares are shares."""

from __future__ import annotations

import json
import math

import pytest
from textual.app import App

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import metrics, rundir
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.panels import PANELS
from grpo_studio.studio.rundata import RunData
from grpo_studio.studio.screens.dashboard_screen import DashboardScreen
from grpo_studio.studio.widgets import perf_tables
from grpo_studio.studio.widgets.metric_chart import Line, MetricChart, percent
from tests.studio_helpers import anyio_backend, screen_text, visible_text  # noqa: F401


def words(text: str) -> str:
    """The screen's words in reading order, frames left out: a message wrapped over rows reads whole."""
    return " ".join(text.replace("│", " ").split())


class ChartApp(App):
    def __init__(self, chart: MetricChart):
        super().__init__()
        self.chart = chart

    def compose(self):
        yield self.chart


async def draw(chart: MetricChart, lines: list[Line], title: str, size=(40, 12), short: str = "") -> list[tuple]:
    """Show `lines` on `chart` alone in an app; the (xs, ys) of each plotext plot call of the last drawing (a chart
    with shared cells is drawn twice), in drawing order."""
    calls: list[tuple] = []
    app = ChartApp(chart)
    async with app.run_test(size=size) as pilot:
        plot, clear = chart.plt.plot, chart.plt.clear_figure
        chart.plt.plot = lambda xs, ys, **kw: (calls.append((list(xs), list(ys))), plot(xs, ys, **kw))[1]
        chart.plt.clear_figure = lambda: (calls.clear(), clear())[1]
        chart.show(lines, title, short=short)
        await pilot.pause()
        chart.text = visible_text(chart)
    return calls


@pytest.mark.anyio
async def test_a_zero_on_a_log_axis_is_left_out_and_counted_and_the_axis_spans_the_data():
    chart = MetricChart(log=True)
    k3 = [0.0, 3.6e-7, 1.1e-6, 0.0, 5e-7]
    calls = await draw(chart, [Line("k3", [1, 2, 3, 4, 5], k3)], "KL k3")
    assert calls == [([2, 3, 5], [math.log10(3.6e-7), math.log10(1.1e-6), math.log10(5e-7)])]  # 3 points, no floor
    assert chart.drawn_title == "KL k3 · 2 zero values not drawn"
    first = chart.text.splitlines()[0].strip()
    assert first == "KL k3 · 2 zero values not drawn"
    labels = [row.split("┤")[0].strip() for row in chart.text.splitlines() if "┤" in row]
    values = [float(label) for label in labels]
    assert min(values) >= 1e-7 and max(values) <= 2e-6, labels  # not 1e-20 … 1e-05


@pytest.mark.anyio
async def test_log_axis_with_nothing_positive_says_so_and_counts_negatives():
    chart = MetricChart(log=True)
    await draw(chart, [Line("k3", [1, 2, 3], [0.0, 0.0, 0.0])], "KL k3")
    assert "all 3 values ≤ 0: none on a log axis" in words(chart.text)
    assert chart.drawn_title == "KL k3 · 3 zero values not drawn"
    chart = MetricChart(log=True)
    await draw(chart, [Line("k3", [1, 2, 3, 4], [-1e-7, float("nan"), 2e-7, 3e-7])], "KL k3", size=(60, 12))
    assert chart.drawn_title == "KL k3 · 2 values ≤0 or NaN not drawn"


@pytest.mark.anyio
async def test_smoothed_under_the_data_and_the_sparsest_series_last():
    chart = MetricChart()
    dense = Line("reward", list(range(1, 13)), [0.1 * i for i in range(12)])
    smooth = Line("smoothed", dense.xs, [0.05 * i for i in range(12)], under=True)
    sparse = Line("accuracy", [4, 8, 12], [0.2, 0.4, 0.6])
    calls = await draw(chart, [dense, sparse, smooth], "reward")
    assert [len(xs) for xs, _ in calls] == [12, 12, 3]
    assert calls[0][1] == smooth.ys and calls[1][1] == dense.ys  # smoothed first: beneath the reward


@pytest.mark.anyio
async def test_a_title_too_wide_for_the_chart_gives_way_to_the_short_one():
    chart = MetricChart(percent=True)
    await draw(chart, [Line("mfu", [1, 2, 3], [0.4, 0.42, 0.4215])], "MFU, % of measured matmul peak  42.15%",
               size=(39, 12), short="MFU  42.15%")  # fmt: skip
    assert chart.text.splitlines()[0].strip() == "MFU  42.15%"


def test_before_training_only_where_a_step_0_eval_exists(tmp_path):
    run_dir = write_run(tmp_path / "r", steps=4)
    run = RunData(run_dir)
    run.drain()
    panel = PANELS["eval"]
    assert "before training" not in panel.note_for(run)
    with open(run_dir / rundir.EVENTS, "a") as fh:
        fh.write(json.dumps({"time": 1.0, "event": "eval", "step": 0, "accuracy": 0.25, "message": "eval"}) + "\n")
    run = RunData(run_dir)
    run.drain()
    assert panel.note_for(run).startswith("step 0: before training")


def test_stop_reasons_headline_names_its_share_and_synthetic_shares_are_shares(tmp_path):
    run = RunData(write_run(tmp_path / "ep", steps=6, episodes=True))
    run.drain()
    done = run.last("env/stop/done")
    assert PANELS["stops"].headline(run) == f"episode stop reasons, share of episodes  done {percent(done)}"
    for row in map(json.loads, (run.dir / rundir.METRICS).read_text().splitlines()):
        for name, value in row.items():
            known = metrics.lookup(name)
            if known and known.unit == "fraction":
                assert 0.0 <= value <= 1.0, (name, value)
        assert sum(v for k, v in row.items() if k.startswith("env/stop/")) == pytest.approx(1.0)
        assert row["precision/skipped_steps"] == 0.0


def test_synthetic_running_run_reads_as_running(tmp_path):
    assert RunData(write_run(tmp_path / "live", steps=3, total=9, state="running")).state() == "running"


def test_perf_table_labels_the_derived_train_time_with_its_formula(tmp_path):
    from rich.console import Console

    run = RunData(write_run(tmp_path / "p", steps=5))
    run.drain()
    console = Console(width=120, record=True)
    console.print(perf_tables.split_table(run))
    text = console.export_text()
    assert "train (derived)" in text
    assert "train (derived) = step − wait − sync − other" in text
    rows = {r.phase: r for r in perf_tables.time_split(run)}
    last = {key: run.last(key) for key in ("perf/step_s", "perf/trainer_wait_s", "perf/sync_s", "perf/idle_s")}
    assert rows["train (derived)"].last == pytest.approx(
        last["perf/step_s"] - last["perf/trainer_wait_s"] - last["perf/sync_s"] - last["perf/idle_s"]
    )
    step_time = {line.label: line for line in PANELS["step_time"].lines(run)}
    assert "train_s" not in step_time  # the file's perf/train_s is the step less its rollout, named so
    assert step_time["step−rollout"].ys == run.series("perf/train_s")[1]


@pytest.mark.anyio
async def test_every_chart_at_80x24_has_a_title_and_a_crashed_run_says_it_crashed(tmp_path):
    runs = tmp_path / "runs"
    live = write_run(runs / "live", steps=12, total=30, dtype="fp16", episodes=True, state="running")
    crashed = runs / "crashed"
    write_run(crashed, steps=1, state="crashed")
    (crashed / rundir.METRICS).write_text("")  # crashed before its first step: no rows
    app = StudioApp(attach=live, live_hardware=False, poll_s=3600)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        status = screen_text(app).splitlines()[1]
        k3 = json.loads((live / rundir.METRICS).read_text().splitlines()[-1])[metrics.K3]
        assert status.endswith(f"k3 {metrics.fmt(k3)}"), status  # whole, at 80 columns, with the ETA
        titled = 0
        for key in "12345":
            await pilot.press(key)
            await pilot.pause(0.1)
            for chart in app.screen.query_one("TabbedContent").active_pane.query(MetricChart):
                if not chart.display:
                    continue
                chart.scroll_visible(animate=False, immediate=True)
                await pilot.pause(0.05)
                first = visible_text(chart).splitlines()[0].strip()
                assert first and first == chart.drawn_title, (chart.id, first, chart.drawn_title)
                titled += 1
        assert titled >= 20
        app.push_screen(DashboardScreen(crashed, poll_s=3600, live_hardware=False))
        await pilot.pause()
        text = screen_text(app)
        assert "no data: the run crashed before its first step" in words(text), text
