"""Charts: a PlotextPlot that keeps its lines, downsamples to ~2× its width and redraws only
when it is handed new data (or resized). Whole steps on the x axis; y ticks round and distinct in one
number format (widgets/chart_axes.py), real values on a log10 axis. The legend and the chart's note
share the line under the plot, so no label covers data; each label has its own marker (an interval's two bounds
share one); a legend whose names do not fit numbers its markers and lists the names under it, and `rows_needed`
says the height that keeps them whole. Nothing is hidden: a smoothed line is drawn under the data, the series with
the fewest points last (on top), and a cell where two series' markers fall shows ◆ ('◆ shared' in the legend); a
log axis leaves out values ≤ 0 and says how many in the title; the title shortens to fit (never dropped)."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

from plotext._matrix import matrix_class
from plotext._utility import no_color
from rich.text import Text
from textual.message import Message
from textual_plotext import PlotextPlot

from ...contract.metrics import fmt
from . import chart_axes

# Named colours plotext maps onto the 16-colour palette, so charts read in plain terminals too.
COLORS = ["cyan", "magenta", "green", "yellow", "blue", "red", "white"]
LEAST = 7  # a chart's rows besides the names under it: title, frame (2), x labels, legend line, 2 rows of plot


def percent(value: float | None) -> str:
    """A share in percent, as every figure of it on screen shows it (MFU: chart headline, ticks, Perf table)."""
    return "–" if value is None or not math.isfinite(value) else fmt(100 * value) + "%"


@dataclass
class Line:
    label: str
    xs: list[float]
    ys: list[float]
    color: str | None = None
    under: bool = False  # drawn first, beneath the data it summarises (a smoothed line)


def downsample(xs: list[float], ys: list[float], n: int) -> tuple[list[float], list[float]]:
    """At most n points: the mean of each equal-width bucket of indices (the last point kept exact)."""
    size = len(xs)
    if size <= n or n < 2:
        return list(xs), list(ys)
    out_x, out_y = [], []
    per = size / (n - 1)
    for b in range(n - 1):
        i, j = int(b * per), max(int((b + 1) * per), int(b * per) + 1)
        out_x.append(xs[(i + j - 1) // 2])
        out_y.append(sum(ys[i:j]) / (j - i))
    out_x.append(xs[-1])
    out_y.append(ys[-1])
    return out_x, out_y


def ema(ys: list[float], alpha: float = 0.1) -> list[float]:
    out, acc = [], None
    for y in ys:
        acc = y if acc is None else acc + alpha * (y - acc)
        out.append(acc)
    return out


def positive(xs: list[float], ys: list[float]) -> tuple[list[float], list[float], int]:
    """The points a log axis can draw (finite y > 0), and how many it cannot."""
    kept = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y) and y > 0]
    return [x for x, _ in kept], [y for _, y in kept], len(ys) - len(kept)


def not_drawn(zeros: int, others: int) -> str:
    """'2 zero values not drawn' ('2 values ≤0 or NaN …' when some are negative or not finite); '' for none."""
    n = zeros + others
    if not n:
        return ""
    what = "zero value" if not others else "value ≤0 or NaN"
    if n > 1:
        what = what.replace("value", "values")
    return f"{n} {what} not drawn"


def grid_rows(charts: list[MetricChart], columns: int, share: int) -> str:
    """Textual grid-rows for `charts` laid out `columns` to a row: `share` lines each, or more where a chart of the row
    needs them to list its legend's names whole (MetricChart.rows_needed)."""
    rows = [charts[r : r + columns] for r in range(0, len(charts), columns)] or [[]]
    return " ".join(str(max([share] + [chart.rows_needed for chart in row])) for row in rows)


class SharedCells(matrix_class):
    """plotext's matrix of characters, noting which markers land on each cell of the canvas: a cell where two of
    `kinds` (the markers of the series drawn on top, not a smoothed line's or an interval's) fall shows SHARED."""

    def __init__(self, kinds: set[str]):
        self.kinds = kinds
        self.owners: dict[tuple[int, int], set[str]] = {}
        super().__init__()  # which builds an empty canvas

    def insert_element(self, col, row, marker, fullground=None, style=None, background=None, check_canvas=False):
        kind = chart_axes.drawn_by(marker)
        if kind in self.kinds and self.in_canvas(col, row):
            self.owners.setdefault((col, row), set()).add(kind)
        super().insert_element(col, row, marker, fullground, style, background, check_canvas)

    @property
    def shared(self) -> list[tuple[int, int]]:
        return [cell for cell, kinds in self.owners.items() if len(kinds) > 1]

    def set_canvas(self):
        for col, row in self.shared:  # in the terminal's own colour: the cell is neither series'
            self.set_marker(col, row, chart_axes.SHARED)
            self.set_fullground(col, row, no_color)
        return super().set_canvas()


class MetricChart(PlotextPlot):
    """One chart. `show(lines, title)` stores the data and asks for a redraw; a chart handed no points
    says `empty`: "waiting for data" before the run logs a step, "not logged (N steps so far)" after."""

    DEFAULT_CSS = "MetricChart { height: 1fr; }"

    class NeedsRows(Message):
        """The chart's `rows_needed` changed (its legend's names at its width): the screen may refit its rows."""

    def __init__(
        self,
        title: str = "",
        *,
        ylabel: str = "",
        log: bool = False,
        percent: bool = False,
        note: str = "",
        id: str | None = None,
        classes: str | None = None,
    ):
        super().__init__(id=id, classes=classes)
        self.chart_title = title
        self.ylabel = ylabel
        self.use_log10 = log
        self.percent = percent  # y ticks in percent of the plotted shares
        self.note = note
        self.short_title = ""  # the title when the full one does not fit (chart_axes.fit_title)
        self.drawn_title = ""  # the title as last drawn
        self.names: list[str] = []  # the numbered legend's names, under the plot
        self.dropped = ""  # what a log axis left out (not_drawn)
        self.legend_line = ""  # the legend as last drawn under the plot
        self.rows_needed = 0  # the height that lists every name under the plot whole, at the chart's width
        self.kinds: set[str] = set()  # the markers of the series drawn on top (SharedCells)
        self.shared = False  # the legend says '◆ shared': the last drawing had cells two series share
        self.empty = "waiting for data"
        self.lines: list[Line] = []
        self.bars: tuple[list[str], list[float]] | None = None
        self.redraws = 0

    def show(
        self,
        lines: list[Line],
        title: str | None = None,
        empty: str | None = None,
        short: str | None = None,
        note: str | None = None,
    ) -> None:
        self.lines = lines
        self.bars = None
        if title is not None:
            self.chart_title = title
        if short is not None:
            self.short_title = short
        if empty is not None:
            self.empty = empty
        if note is not None:
            self.note = note
        self.refresh()

    def show_bars(self, labels: list[str], values: list[float], title: str | None = None) -> None:
        self.bars = (labels, values)
        self.lines = []
        if title is not None:
            self.chart_title = title
        self.refresh()

    def _draw(self) -> None:
        plt = self.plt
        plt.clear_figure()
        width = max(self.size.width, 10)
        self.names, self.dropped, self.legend_line, self.kinds = [], "", "", set()
        if self.bars is not None:
            labels, values = self.bars
            y_width = 0
            if values:
                plt.bar(labels, values, color=COLORS[0], width=0.6)
                _, top, ys = chart_axes.nice_range(0.0, max(max(values), 1.0), 5, integer=True)
                plt.ylim(0, top)
                plt.yticks(ys, chart_axes.labels(ys))
                y_width = max(map(len, chart_axes.labels(ys)))
            self._title(width, y_width)
            return
        series = [line for line in self.lines if line.xs]
        # one marker, colour and legend entry per label (an interval's two bounds share theirs), in order
        slots = {label: k for k, label in enumerate(dict.fromkeys(line.label for line in series))}
        plotted, zeros, others = [], 0, 0
        for line in series:
            xs, ys = line.xs, line.ys
            if self.use_log10:
                xs, ys, n = positive(xs, ys)
                if not line.under:
                    n_zero = sum(1 for y in line.ys if y == 0)
                    zeros, others = zeros + n_zero, others + n - n_zero
                ys = [math.log10(y) for y in ys]
            if xs:
                plotted.append((slots[line.label], line, *downsample(xs, ys, 2 * width)))
        self.dropped = not_drawn(zeros, others)
        if not plotted:
            n = zeros + others
            message = self.empty if not n else f"all {n} values ≤ 0: none on a log axis"
            lines = textwrap.wrap(message, max(width - 6, 8))  # plotext cuts a text wider than the canvas
            row = 1.0 / max(self.size.height - 5, 1)  # about a row of the canvas, on its 0 … 1 axis
            for k, text in enumerate(lines):
                plt.text(text, 0.5, 0.5 + ((len(lines) - 1) / 2 - k) * row, alignment="center")
            plt.xlim(0, 1)
            plt.ylim(0, 1)
            plt.xticks([], [])
            plt.yticks([], [])
            self._title(width, 0)
            return
        # beneath first (a smoothed line), then the most points first: the sparsest series is drawn on top
        for k, line, xs, ys in sorted(plotted, key=lambda p: (not p[1].under, -len(p[2]))):
            marker = chart_axes.MARKERS[k % len(chart_axes.MARKERS)]
            plt.plot(xs, ys, color=line.color or COLORS[k % len(COLORS)], marker=marker)
            if not line.under:
                self.kinds.add(marker)
        keys = [
            (chart_axes.glyph(chart_axes.MARKERS[k % len(chart_axes.MARKERS)]), label) for label, k in slots.items()
        ]
        self.legend_line, under, self.names = self._under(keys, width, self.shared)
        # the height asked for holds '◆ shared' whether or not this drawing has shared cells: a row grown for it
        # that then had none would shrink back, share cells again and grow (a loop)
        self.rows_needed = LEAST + len(self._under(keys, width, len(self.kinds) > 1)[2])
        room = max(self.size.height - LEAST, 0)  # the lines under the plot leave it 2 rows at least
        if len(self.names) > room:
            self.names = self.names[:room]
            if self.names:
                self.names[-1] = self.names[-1][: width - 3] + " …"
        # plotext writes the ylabel left-aligned on the line under the plot: the legend's and the note's place
        if under:
            plt.ylabel(under if len(under) <= width - 1 else under[: width - 2] + "…")
        rows = self.size.height - len(self.names) - 4 - bool(under)  # less the title, frame and x labels
        xs_seen = [x for _, _, xs, _ in plotted for x in (xs[0], xs[-1])]
        ys_seen = [y for _, _, _, ys in plotted for y in ys if math.isfinite(y)]
        y_width = self._ticks(
            min(xs_seen), max(xs_seen), min(ys_seen, default=0.0), max(ys_seen, default=0.0), rows, width
        )
        self._title(width, y_width)

    def _under(self, keys: list[tuple[str, str]], width: int, shared: bool) -> tuple[str, str, list[str]]:
        """The legend line; the line under the plot (the legend, with the note where it fits); the lines under that
        (a numbered legend's names, then the note's words wrapped where it does not fit, none lost)."""
        legend, names = chart_axes.legend_lines(keys, width - 1, shared) if len(keys) > 1 else ("", [])
        if self.note and len(f"{legend} · {self.note}") <= width - 1:
            return legend, f"{legend} · {self.note}" if legend else self.note, names
        return legend, legend, names + (textwrap.wrap(self.note, width - 1) if self.note else [])

    def _title(self, width: int, y_width: int) -> None:
        """The full title, else the short one, with what a log axis left out; cut to fit, never empty."""
        full, short = self.chart_title, self.short_title or self.chart_title
        candidates = [full, short]
        if self.dropped:  # the count survives any cut: it comes first in the last candidate
            brief = self.dropped.replace(" value ", " ").replace(" values ", " ")  # '1 zero not drawn'
            candidates = [f"{full} · {self.dropped}", f"{short} · {self.dropped}", f"{short} · {brief}"]
            candidates.append(f"{brief} · {short}")
        self.drawn_title = chart_axes.fit_title(candidates, width, y_width)
        self.plt.title(self.drawn_title)

    def _ticks(self, x_lo: float, x_hi: float, y_lo: float, y_hi: float, rows: int, width: int) -> int:
        """Set the axes' ranges and ticks; the y labels' width."""
        plt = self.plt
        if y_hi - y_lo < 1e-12:  # flat data: plotext would invert the axis
            if y_lo == 0:  # all zero: a share, a count, a clip fraction: 0 at the bottom
                y_lo, y_hi = 0.0, 1.0
            else:  # pad by a tenth of the value
                y_lo, y_hi = y_lo - abs(y_lo) / 10, y_hi + abs(y_hi) / 10
            plt.ylim(y_lo, y_hi)
        n_y = max(3, min(5, (rows + 1) // 2))  # a blank row at least between two labels
        if self.use_log10:
            y_lo, y_hi, ys = chart_axes.log_range(y_lo, y_hi, n_y)
        else:  # the frame's top and bottom on round values, both labelled
            y_lo, y_hi, ys = chart_axes.nice_range(y_lo, y_hi, n_y)
        if rows < len(ys):  # fewer rows than ticks: two would share a row and one label hide the other
            ys = [ys[0], ys[-1]]
        y_labels = chart_axes.labels([10.0**y for y in ys]) if self.use_log10 else chart_axes.labels(ys, self.percent)
        plt.ylim(y_lo, y_hi)
        plt.yticks(ys, y_labels)
        room = width - 4 - max(map(len, y_labels))  # less the y labels and the frame
        n_x = max(2, min(6, room // (len(str(int(x_hi))) + 4)))
        xs = chart_axes.ticks(x_lo, x_hi, n_x, integer=True)
        plt.xticks(xs, [str(int(x)) for x in xs])
        return max(map(len, y_labels))

    def render(self):
        """The plot above the numbered legend's names (PlotextPlot.render, less their lines). The legend says
        '◆ shared' as the last drawing did; drawn again with the other legend where the cells disagree (at most
        twice more: a legend that says shared is kept, should the plot then have no such cell)."""
        needed = self.rows_needed
        for attempt, shared in enumerate((self.shared, not self.shared, True)):
            self.shared = shared
            self._draw()
            width, height = self.size.width, max(self.size.height - len(self.names), 1)
            self._plot.plotsize(width, height)
            self._plot._set_size(width, height)  # as PlotextPlot.render does (textual-plotext issue 5)
            self._plot.theme(self._get_plotext_theme_name(self.app.theme))
            cells = self._plot.monitor.matrix = SharedCells(self.kinds)
            plot = self._plot.build()
            if bool(cells.shared) == shared or (shared and attempt):
                break
        self.redraws += 1
        if self.rows_needed != needed:
            self.post_message(self.NeedsRows())
        out = Text.from_ansi(plot.rstrip("\n"))
        for name_line in self.names:
            out.append("\n" + name_line)
        return out
