"""The fault suite's hostile cases for the studio's charts and keys (studio/widgets/metric_chart.py,
studio/screens/dashboard_screen.py); benchmarks/fault_probes.py says how they run. Each probe drives the real app
headless with Textual's pilot: a log chart fed only zeros, negatives, NaN and inf; a chart one column wide; a run
that crashed before its first row; keys pressed while a modal is open. None may raise, hide what it left out, or let
a key reach the screen under a modal."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from .fault_probes import Probe

CATEGORY = "studio"


def _chart_app(chart, size):
    from textual.app import App

    class ChartApp(App):
        def compose(self):
            yield chart

    return ChartApp(), size


def _draw(chart, lines, title: str, size) -> str:
    """Show `lines` on `chart` alone in an app of `size`; the chart's text as drawn."""
    from ..studio.widgets.metric_chart import MetricChart

    assert isinstance(chart, MetricChart)
    app, size = _chart_app(chart, size)
    seen: dict = {}

    async def run():
        async with app.run_test(size=size) as pilot:
            chart.show(lines, title)
            await pilot.pause()
            from textual.geometry import Region

            region = Region(0, 0, chart.size.width, chart.size.height)
            seen["text"] = "\n".join(strip.text for strip in chart.render_lines(region))

    asyncio.run(run())
    return seen["text"]


def a_log_chart_of_only_zeros_negatives_nan_and_inf_says_none_drawn(tmp: Path) -> str | None:
    from ..studio.widgets.metric_chart import Line, MetricChart

    chart = MetricChart(log=True)
    ys = [0.0, -1.0, float("nan"), float("inf"), float("-inf"), 0.0]
    text = _draw(chart, [Line("k3", list(range(1, 7)), ys)], "KL k3", (60, 14))
    if chart.drawn_title != "KL k3 · 6 values ≤0 or NaN not drawn":
        return f"title {chart.drawn_title!r}"
    words = " ".join(text.replace("│", " ").split())
    return None if "all 6 values ≤ 0: none on a log axis" in words else f"no 'none on a log axis' in {words!r}"


def a_chart_one_column_wide_draws_without_raising(tmp: Path) -> str | None:
    from ..studio.widgets.metric_chart import Line, MetricChart

    chart = MetricChart(log=True)
    lines = [Line("a long series name", [1, 2, 3], [1e-7, 0.0, 3e-7]), Line("another", [1, 2], [2e-7, 5e-7])]
    _draw(chart, lines, "a title far wider than one column", (1, 6))
    return None if chart.drawn_title else "no title at all"


def a_run_with_no_rows_that_crashed_says_so(tmp: Path) -> str | None:
    from ..contract import rundir
    from ..studio.app import StudioApp
    from .synthetic_run import write_run

    run = write_run(tmp / "runs" / "crashed", steps=1, state="crashed")
    (run / rundir.METRICS).write_text("")
    app = StudioApp(attach=run, live_hardware=False, poll_s=3600)
    seen: dict = {}

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            seen["text"] = "\n".join(s.text for s in app.screen._compositor.render_strips())

    asyncio.run(go())
    words = " ".join(seen["text"].replace("│", " ").split())
    return None if "no data: the run crashed before its first step" in words else "no crash message on the charts"


def keys_pressed_under_a_modal_stay_in_the_modal(tmp: Path) -> str | None:
    """With the stop confirmation open on a running run, digits, filter keys and d/e/x reach nothing below it;
    n closes it and the dashboard is where it was."""
    from textual.widgets import TabbedContent

    from ..studio.app import StudioApp
    from ..studio.screens.modals import Confirm
    from .synthetic_run import write_run

    run = write_run(tmp / "runs" / "live", steps=4, total=8, state="running")
    app = StudioApp(attach=run, live_hardware=False, poll_s=3600)
    calls: list = []
    for name in ("duplicate_run", "export_report", "export_model", "fork_run"):
        setattr(app, name, lambda *a, _n=name: calls.append(_n))
    seen: dict = {}

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            dashboard = app.screen
            await pilot.press("8")  # Samples
            await pilot.press("s")
            if not isinstance(app.screen, Confirm):
                seen["why"] = f"s opened {type(app.screen).__name__}, not the confirmation"
                return
            await pilot.press("2", "b", "d", "e", "x", "f", "question_mark")
            seen["under"] = (dashboard.query_one(TabbedContent).active, dashboard.query_one("#samples-panel").mode)
            seen["modal"] = type(app.screen).__name__
            await pilot.press("n")
            seen["after"] = app.screen is dashboard

    asyncio.run(go())
    if "why" in seen:
        return seen["why"]
    if seen["under"] != ("samples", "all") or calls:
        return f"keys reached the dashboard under the modal: tab/mode {seen['under']}, calls {calls}"
    return None if seen["after"] and seen["modal"] == "Confirm" else f"after n: {seen}"


def metrics_of_inf_and_nan_in_the_file_keep_the_dashboard_up(tmp: Path) -> str | None:
    """A metrics.jsonl whose k3 is 0, then NaN and ±inf as JSON numbers can spell them: every chart tab draws."""
    from ..contract import metrics, rundir
    from ..studio.app import StudioApp
    from .synthetic_run import write_run

    run = write_run(tmp / "runs" / "odd", steps=4)
    rows = [json.loads(line) for line in (run / rundir.METRICS).read_text().splitlines()]
    for row, value in zip(rows, (0.0, float("nan"), float("inf"), 0.0)):
        row[metrics.K3] = value
    (run / rundir.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    app = StudioApp(attach=run, live_hardware=False, poll_s=3600)
    seen: dict = {}

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            for key in "12345":
                await pilot.press(key)
            seen["title"] = app.screen.query_one("#overview-k3").drawn_title

    asyncio.run(go())
    return None if "not drawn" in seen["title"] else f"k3 title {seen['title']!r} does not count what it left out"


def cases() -> list:
    return [
        Probe(
            CATEGORY,
            "a log chart of zeros, negatives, NaN and inf",
            a_log_chart_of_only_zeros_negatives_nan_and_inf_says_none_drawn,
        ),
        Probe(CATEGORY, "a chart one column wide", a_chart_one_column_wide_draws_without_raising),
        Probe(CATEGORY, "a crashed run with no rows", a_run_with_no_rows_that_crashed_says_so),
        Probe(CATEGORY, "keys under a modal", keys_pressed_under_a_modal_stay_in_the_modal, timeout_s=120),
        Probe(CATEGORY, "NaN and inf in metrics.jsonl", metrics_of_inf_and_nan_in_the_file_keep_the_dashboard_up),
    ]
