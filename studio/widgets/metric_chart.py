"""Charts: a PlotextPlot that keeps its lines, downsamples to ~2× its width and redraws only
when it is handed new data (or resized). Whole steps on the x axis; y ticks round and distinct in one
number format (widgets/chart_axes.py), real values on a log10 axis. The legend and the chart's note
share the line under the plot, so no label covers data; each series has its own marker."""

from __future__ import annotations

import math
from dataclasses import dataclass

from textual_plotext import PlotextPlot

from ...contract.metrics import fmt
from . import chart_axes

# Named colours plotext maps onto the 16-colour palette, so charts read in plain terminals too.
COLORS = ["cyan", "magenta", "green", "yellow", "blue", "red", "white"]


def percent(value: float | None) -> str:
    """A share in percent, as every figure of it on screen shows it (MFU: chart headline, ticks, Perf table)."""
    return "–" if value is None or not math.isfinite(value) else fmt(100 * value) + "%"


@dataclass
class Line:
    label: str
    xs: list[float]
    ys: list[float]
    color: str | None = None


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


def log10(ys: list[float], floor: float = 1e-18) -> list[float]:
    return [math.log10(max(y, floor)) for y in ys]


class MetricChart(PlotextPlot):
    """One chart. `show(lines, title)` stores the data and asks for a redraw; a chart handed no points
    says `empty`: "waiting for data" before the run logs a step, "not logged (N steps so far)" after."""

    DEFAULT_CSS = "MetricChart { height: 1fr; }"

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
        self.empty = "waiting for data"
        self.lines: list[Line] = []
        self.bars: tuple[list[str], list[float]] | None = None
        self.redraws = 0

    def show(self, lines: list[Line], title: str | None = None, empty: str | None = None) -> None:
        self.lines = lines
        self.bars = None
        if title is not None:
            self.chart_title = title
        if empty is not None:
            self.empty = empty
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
        plt.title(self.chart_title if len(self.chart_title) <= width else self.chart_title[: width - 1] + "…")
        if self.bars is not None:
            labels, values = self.bars
            if values:
                plt.bar(labels, values, color=COLORS[0], width=0.6)
                _, top, ys = chart_axes.nice_range(0.0, max(max(values), 1.0), 5, integer=True)
                plt.ylim(0, top)
                plt.yticks(ys, chart_axes.labels(ys))
            return
        drawn = [line for line in self.lines if line.xs]
        if not drawn:
            plt.text(self.empty, 0.5, 0.5, alignment="center")
            plt.xlim(0, 1)
            plt.ylim(0, 1)
            plt.xticks([], [])
            plt.yticks([], [])
            return
        xs_seen, ys_seen, keys = [], [], []
        for i, line in enumerate(drawn):
            marker = chart_axes.MARKERS[i % len(chart_axes.MARKERS)]
            xs, ys = downsample(line.xs, line.ys, 2 * width)
            if self.use_log10:
                ys = log10(ys)
            plt.plot(xs, ys, color=line.color or COLORS[i % len(COLORS)], marker=marker)
            keys.append((chart_axes.glyph(marker), line.label))
            xs_seen += [xs[0], xs[-1]]
            ys_seen += [y for y in ys if math.isfinite(y)]
        # plotext writes the ylabel left-aligned on the line under the plot: the legend's and the note's place
        under = chart_axes.legend(keys, width - 1) if len(drawn) > 1 else ""
        if self.note:
            under = f"{under} · {self.note}" if under else self.note
        if under:
            plt.ylabel(under if len(under) <= width - 1 else under[: width - 2] + "…")
        rows = self.size.height - 4 - bool(under)  # less the title, the frame's two lines and the x labels
        self._ticks(min(xs_seen), max(xs_seen), min(ys_seen, default=0.0), max(ys_seen, default=0.0), rows, width)

    def _ticks(self, x_lo: float, x_hi: float, y_lo: float, y_hi: float, rows: int, width: int) -> None:
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
            y_labels = chart_axes.labels([10.0**y for y in ys])
        else:  # the frame's top and bottom on round values, both labelled
            y_lo, y_hi, ys = chart_axes.nice_range(y_lo, y_hi, n_y)
            y_labels = chart_axes.labels(ys, percent=self.percent)
        plt.ylim(y_lo, y_hi)
        plt.yticks(ys, y_labels)
        room = width - 4 - max(map(len, y_labels))  # less the y labels and the frame
        n_x = max(2, min(6, room // (len(str(int(x_hi))) + 4)))
        xs = chart_axes.ticks(x_lo, x_hi, n_x, integer=True)
        plt.xticks(xs, [str(int(x)) for x in xs])

    def render(self):
        self._draw()
        self.redraws += 1
        return super().render()
