"""Charts as the terminal shows them: the real app at 80×24, 120×40 and 200×60 on runs the real trainer
wrote (tests/trained_runs.py), every chart of every tab scrolled into view and read back from the screen.

On every chart: no plot glyph outside its frame (the legend's marker glyphs excepted, on the legend line);
the legend on its own line under the x labels, so it covers no data; y tick labels distinct, in one number
format, on evenly spaced values and rows; x tick labels distinct. Hand cases of the axis helpers below."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from textual.app import App

from grpo_studio.contract import rundir
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.screens.compare_screen import CompareScreen
from grpo_studio.studio.widgets import chart_axes
from grpo_studio.studio.widgets.metric_chart import Line, MetricChart
from tests.studio_helpers import anyio_backend, screen_text, visible_text  # noqa: F401

SIZES = [(80, 24), (120, 40), (200, 60)]
# Glyphs only a plotted line draws (2×2 blocks and braille), never text, borders or scrollbars.
PLOT = set("▖▗▘▝▚▞▙▛▜▟") | {chr(c) for c in range(0x2801, 0x2900)}
CHART_TABS = "12345"  # Overview, Train, Mismatch, Lengths, Perf


def cells(app, chart: MetricChart) -> list[str]:
    """The chart's rectangle of the screen, one string per row, padded to its width."""
    region = chart.region
    rows = screen_text(app).split("\n")
    rows += [""] * (region.bottom - len(rows))
    return [rows[y][region.x : region.right].ljust(region.width) for y in range(region.y, region.bottom)]


def check_chart(rows: list[str], chart: MetricChart, where: str) -> None:
    top = next(i for i, row in enumerate(rows) if "┌" in row)
    bottom = next(i for i, row in enumerate(rows) if "└" in row)
    left, right = rows[top].index("┌"), rows[top].index("┐")
    series = [line for line in chart.lines if line.xs]
    legend = chart.legend_line
    legend_rows = [i for i, row in enumerate(rows) if len(series) > 1 and row.lstrip().startswith(legend[:12])]
    # glyphs: inside the frame, or the legend's own markers on the legend line
    for y, row in enumerate(rows):
        for x, ch in enumerate(row):
            if ch in PLOT and not (top < y < bottom and left < x < right):  # a legend marker: "▞ name" or "▞1"
                assert y in legend_rows and (row[x + 1] == " " or row[x + 1].isdigit()), (
                    f"{where}: plot glyph {ch!r} at row {y} col {x}\n" + ("\n".join(rows))
                )
    # the legend: under the x labels, never on a row of the plot
    if len(series) > 1:
        assert legend_rows and legend_rows[0] > bottom + 1, f"{where}: legend not under the plot\n" + "\n".join(rows)
        for row in rows[top : bottom + 1]:
            assert not any(line.label[:6] in row for line in series), f"{where}: a label inside the plot: {row}"
    if not series:
        return
    # y ticks: distinct labels, one format, evenly spaced values on evenly spaced rows
    marks = [(y, row[:left].strip()) for y, row in enumerate(rows[: bottom + 1]) if row[left] == "┤"]
    labels = [text for _, text in marks]
    assert len(labels) >= 2 and len(set(labels)) == len(labels), f"{where}: y labels {labels}"
    kinds = {"e" in t for t in labels if t.rstrip("%") != "0"}
    decimals = {
        len(t.rstrip("%").split(".")[1]) if "." in t else 0 for t in labels if "e" not in t and t.rstrip("%") != "0"
    }
    assert len(kinds) <= 1 and len(decimals) <= 1, f"{where}: mixed number formats {labels}"
    values = [float(t.rstrip("%")) for t in labels]
    if chart.use_log10:  # round values on a log axis: 1e-06, 5e-06, 4e-06, never 6.30957e-06
        assert all(float(f"{v:.1e}") == v for v in values), f"{where}: log labels not round {labels}"
    else:
        steps = {round(a - b, 9) for a, b in zip(values, values[1:])}
        assert len(steps) == 1, f"{where}: uneven y ticks {labels}"
    gaps = [b - a for (a, _), (b, _) in zip(marks, marks[1:])]
    if chart.use_log10:  # 1, 2, 5 x 10^k sit log10(2) and log10(2.5) apart: uneven rows, but never two on one
        assert min(gaps) >= 1, f"{where}: two y ticks on one row {gaps}"
    else:
        assert max(gaps) - min(gaps) <= 1, f"{where}: y ticks on uneven rows {gaps}"
    # x ticks: distinct
    xs = rows[bottom + 1].split()
    assert xs and len(set(xs)) == len(xs) and all(re.fullmatch(r"\d+", x) for x in xs), f"{where}: x labels {xs}"


async def check_visible_charts(app, pilot, container, where: str) -> int:
    checked = 0
    for chart in container.query(MetricChart):
        if not chart.display or chart.bars is not None:
            continue
        chart.scroll_visible(animate=False, immediate=True)
        await pilot.pause(0.05)
        check_chart(cells(app, chart), chart, f"{where} {chart.id}")
        checked += 1
    return checked


@pytest.mark.anyio
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_every_chart_stays_in_its_frame_with_its_legend_under_it_and_distinct_ticks(trained_runs, size):
    app = StudioApp()
    async with app.run_test(size=size) as pilot:
        for dtype, run_dir in trained_runs.items():
            app.open_run(run_dir)
            await pilot.pause()
            checked = 0
            for key in CHART_TABS:
                await pilot.press(key)
                await pilot.pause(0.2)
                pane = app.screen.query_one("TabbedContent").active_pane
                checked += await check_visible_charts(app, pilot, pane, f"{size} {dtype} tab {key}")
            assert checked >= 15, checked  # every tab's charts were read, not skipped
            await pilot.press("escape")
            await pilot.pause()
        app.push_screen(CompareScreen(list(trained_runs.values())))
        await pilot.pause(0.3)
        assert await check_visible_charts(app, pilot, app.screen, f"{size} compare") == 4


# ---- the axis helpers by hand --------------------------------------------------------------------


def test_labels_one_format_per_axis_the_fewest_digits_that_keep_them_distinct():
    assert chart_axes.labels([0.0, 0.5, 1.0, 1.5]) == ["0", "0.5", "1.0", "1.5"]
    assert chart_axes.labels([20.0, 40.0, 60.0]) == ["20", "40", "60"]
    assert chart_axes.labels([5e4, 1e5, 1.5e5]) == ["5.0e+04", "1.0e+05", "1.5e+05"]  # not "5e+04" by "1.00e+05"
    assert chart_axes.labels([0.998, 0.999, 1.0, 1.001]) == ["0.998", "0.999", "1.000", "1.001"]  # not "1" thrice
    assert chart_axes.labels([5e-6, 1e-5]) == ["5e-06", "1e-05"]
    assert chart_axes.labels([0.0, 0.25, 0.5], percent=True) == ["0%", "25%", "50%"]


def test_nice_range_labels_both_ends_of_the_frame():
    lo, hi, ticks = chart_axes.nice_range(0.987, 1.013, 3)
    assert (lo, hi) == pytest.approx((0.98, 1.02)) and ticks == pytest.approx([0.98, 1.0, 1.02])
    lo, hi, ticks = chart_axes.nice_range(0.0006, 0.0167, 3)
    assert (lo, hi) == pytest.approx((0.0, 0.02)) and ticks == pytest.approx([0.0, 0.01, 0.02])
    assert chart_axes.nice_range(0.0, 1462.0, 5, integer=True)[2] == pytest.approx([0, 500, 1000, 1500])


def test_legend_numbers_its_markers_and_lists_the_names_under_it_when_they_do_not_fit():
    entries = [("▞", "reward/mean"), ("⠿", "correctness"), ("•", "format")]
    assert chart_axes.legend_lines(entries, 80) == ("▞ reward/mean  ⠿ correctness  • format", [])
    line, names = chart_axes.legend_lines(entries, 30)
    assert line == "▞1 ⠿2 •3"
    assert names == ["1 reward/mean · 2 correctness", "3 format"]  # whole names, wrapped at 30 columns
    shared = "▞ reward/mean  ⠿ correctness  • format  ◆ shared"  # cells two series share: the legend says so
    assert chart_axes.legend_lines(entries, 80, shared=True) == (shared, [])
    assert chart_axes.legend_lines(entries, 30, shared=True) == ("▞1 ⠿2 •3  ◆ shared", names)


def test_title_fits_as_plotext_draws_it():
    """Brute force against plotext: a title is drawn whole exactly where title_fits says, else not at all."""
    import plotext

    for width in (30, 39, 47):
        for y_width in (1, 4, 7):
            for length in range(width - 12, width + 1):
                plotext.clear_figure()
                plotext.plotsize(width, 9)
                plotext.plot([1, 2], [1, 2])
                plotext.yticks([1, 2], ["x" * y_width, "y" * y_width])
                title = "T" * length
                plotext.title(title)
                drawn = title in plotext.build()
                assert drawn == chart_axes.title_fits(length, width, y_width), (width, y_width, length)
    assert chart_axes.fit_title(["MFU, % of measured matmul peak  42.15%", "MFU  42.15%"], 39, 6) == "MFU  42.15%"
    cut = chart_axes.fit_title(["x" * 60], 39, 6)
    assert (
        cut.endswith("…") and chart_axes.title_fits(len(cut), 39, 6) and not chart_axes.title_fits(len(cut) + 1, 39, 6)
    )


@pytest.mark.anyio
async def test_a_chart_whose_metric_the_run_never_logged_says_so_without_axes(trained_runs, tmp_path):
    """A copy of a real run with its entropy column removed: the chart says 'not logged', no tick labels."""
    run_dir = tmp_path / "no-entropy"
    shutil.copytree(trained_runs["bf16"], run_dir)
    metrics_file = run_dir / rundir.METRICS
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    metrics_file.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "entropy"}) + "\n" for r in rows))
    app = StudioApp()
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_run(run_dir)
        await pilot.pause()
        await pilot.press("2")  # Train
        await pilot.pause(0.2)
        chart = app.screen.query_one("#training-entropy", MetricChart)
        chart.scroll_visible(animate=False, immediate=True)
        await pilot.pause(0.05)
        text = "\n".join(cells(app, chart))
        assert f"not logged ({rows[-1]['step']} steps so far)" in text, text
        assert "┤" not in text and "┬" not in text, text


# ---- cells two series share ------------------------------------------------------------------------


class OneChart(App):
    def __init__(self, lines: list[Line]):
        super().__init__()
        self.lines = lines

    def compose(self):
        yield MetricChart("crossing", id="chart")

    def on_mount(self) -> None:
        self.query_one(MetricChart).show(self.lines)


async def canvas_of(lines: list[Line]) -> tuple[list[str], str]:
    """The chart's canvas (the cells inside its frame, one string per row, top first) and its legend line."""
    app = OneChart(lines)
    async with app.run_test(size=(44, 16)) as pilot:
        await pilot.pause()
        chart = app.query_one(MetricChart)
        rows = visible_text(chart).split("\n")
        legend = chart.legend_line
    top = next(i for i, row in enumerate(rows) if "┌" in row)
    bottom = next(i for i, row in enumerate(rows) if "└" in row)
    left, right = rows[top].index("┌"), rows[top].index("┐")
    return [row.ljust(right)[left + 1 : right] for row in rows[top + 1 : bottom]], legend


def glyphs_at(canvas: list[str], rows: range, cols: range) -> set[str]:
    return {chart_axes.drawn_by(canvas[r][c]) or canvas[r][c] for r in rows for c in cols if canvas[r][c] != " "}


@pytest.mark.anyio
async def test_two_crossing_series_show_the_shared_marker_at_the_crossing_and_their_own_elsewhere():
    xs = [float(x) for x in range(9)]
    canvas, legend = await canvas_of([Line("up", xs, xs), Line("down", xs, [8 - x for x in xs])])
    height, width = len(canvas), len(canvas[0])
    shared = [(r, c) for r, row in enumerate(canvas) for c, ch in enumerate(row) if ch == chart_axes.SHARED]
    # the lines cross at (4, 4): the canvas' centre (x and y both span 0 … 8)
    assert shared and all(abs(r - (height - 1) / 2) <= 1 and abs(c - (width - 1) / 2) <= 2 for r, c in shared), (
        shared,
        canvas,
    )
    assert legend.endswith("◆ shared"), legend
    # away from the crossing each series shows its own marker: "up" (hd) bottom left and top right, "down" (braille)
    # top left and bottom right
    half_r, half_c = height // 2 - 1, width // 2 - 3
    corners = {
        "top left": (range(half_r), range(half_c)),
        "top right": (range(half_r), range(width - half_c, width)),
        "bottom left": (range(height - half_r, height), range(half_c)),
        "bottom right": (range(height - half_r, height), range(width - half_c, width)),
    }
    seen = {where: glyphs_at(canvas, *cells) for where, cells in corners.items()}
    assert seen == {"top left": {"braille"}, "top right": {"hd"}, "bottom left": {"hd"}, "bottom right": {"braille"}}, (
        seen,
        canvas,
    )


@pytest.mark.anyio
async def test_series_that_share_no_cell_and_a_smoothed_line_under_its_data_show_no_shared_marker():
    xs = [float(x) for x in range(9)]
    apart, legend = await canvas_of([Line("low", xs, [0.0] * 9), Line("high", xs, [8.0] * 9)])
    assert not any(chart_axes.SHARED in row for row in apart) and "shared" not in legend, (apart, legend)
    assert {chart_axes.drawn_by(ch) for row in apart for ch in row if ch != " "} == {"hd", "braille"}
    # a smoothed line over the same points, drawn under: every cell of the data shows the data's own glyph, as the
    # data alone draws it, and no ◆
    point = Line("point", [0.0], [8.0])  # away from the data: the same legend rows in both charts
    under, legend = await canvas_of([Line("data", xs, xs), point, Line("smoothed", xs, xs, under=True)])
    alone, _ = await canvas_of([Line("data", xs, xs), point])
    assert not any(chart_axes.SHARED in row for row in under) and "shared" not in legend, (under, legend)
    data = [(r, c) for r, row in enumerate(alone) for c, ch in enumerate(row) if ch != " "]
    assert data and all(under[r][c] == alone[r][c] for r, c in data), (alone, under)


def test_drawn_by_tells_each_marker_from_its_glyphs():
    assert [chart_axes.drawn_by(ch) for ch in "▞▄█⣀⠁•+x*◆ a"] == ["hd"] * 3 + ["braille"] * 2 + list("•+x*") + [
        None
    ] * 3
