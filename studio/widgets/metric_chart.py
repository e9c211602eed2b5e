"""Charts: a PlotextPlot that keeps its lines, downsamples to ~2× its width and redraws only
when it is handed new data (or resized). Whole steps on the x axis; y ticks in the metric
schema's number format (scientific for tiny values, real values on a log10 axis)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from textual_plotext import PlotextPlot

from grpo_studio.contract.metrics import fmt

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
    marker: str = "hd"  # 2×2 blocks: ~2.5× cheaper to build than braille, and clear in any font


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


def ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """At most n round values within [lo, hi], 1, 2 or 5 × 10^k apart (the smallest such step
    that gives at most n); whole numbers when `integer`."""
    if hi <= lo:
        return [lo]

    def grid(step: float) -> list[float]:
        return [i * step for i in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)]

    k = math.floor(math.log10((hi - lo) / n))
    steps = [m * 10.0**e for e in (k, k + 1) for m in (1, 2, 5)]
    return next(g for g in map(grid, [s for s in steps if s >= 1 or not integer]) if len(g) <= n)


def log_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Ticks on a log10 axis (lo, hi are log10 values): 1, 2, 5 × 10^k; whole decades when those
    are more than n; round log10 steps when they are fewer than two."""
    marks = [k + math.log10(m) for k in range(math.floor(lo), math.ceil(hi) + 1) for m in (1, 2, 5)]
    marks = [t for t in marks if lo - 1e-9 <= t <= hi + 1e-9]
    if len(marks) > n:
        return ticks(lo, hi, n, integer=True)
    return marks if len(marks) >= 2 else ticks(lo, hi, n)


class MetricChart(PlotextPlot):
    """One chart. `show(lines, title)` stores the data and asks for a redraw."""

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
        self.lines: list[Line] = []
        self.bars: tuple[list[str], list[float]] | None = None
        self.redraws = 0

    def show(self, lines: list[Line], title: str | None = None) -> None:
        self.lines = lines
        self.bars = None
        if title is not None:
            self.chart_title = title
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
        plt.title(self.chart_title)
        width = max(self.size.width, 10)
        if self.bars is not None:
            labels, values = self.bars
            if values:
                plt.bar(labels, values, color=COLORS[0], width=0.6)
            return
        xs_seen, ys_seen = [], []
        for i, line in enumerate(self.lines):
            if not line.xs:
                continue
            xs, ys = downsample(line.xs, line.ys, 2 * width)
            if self.use_log10:
                ys = log10(ys)
            plt.plot(
                xs,
                ys,
                label=line.label if len(self.lines) > 1 else None,
                color=line.color or COLORS[i % len(COLORS)],
                marker=line.marker,
            )
            xs_seen += [xs[0], xs[-1]]
            ys_seen += [y for y in ys if math.isfinite(y)]
        if not xs_seen:
            plt.text("waiting for data", 0.5, 0.5, alignment="center")
            plt.xlim(0, 1)
            plt.ylim(0, 1)
            return
        if self.note:  # plotext writes the ylabel left-aligned on the bottom line: the note's place
            plt.ylabel(self.note if len(self.note) <= width else self.note[: width - 1] + "…")
        self._ticks(min(xs_seen), max(xs_seen), min(ys_seen, default=0.0), max(ys_seen, default=0.0))

    def _ticks(self, x_lo: float, x_hi: float, y_lo: float, y_hi: float) -> None:
        plt = self.plt
        xs = ticks(x_lo, x_hi, integer=True)
        plt.xticks(xs, [str(int(x)) for x in xs])
        if y_hi - y_lo < 1e-12:  # flat data: plotext would invert the axis; pad by a tenth of the value
            pad = abs(y_lo) / 10 or 1.0
            y_lo, y_hi = y_lo - pad, y_hi + pad
            plt.ylim(y_lo, y_hi)
        if self.use_log10:
            ys = log_ticks(y_lo, y_hi)
            plt.yticks(ys, [fmt(10.0**y) for y in ys])
        else:
            ys = ticks(y_lo, y_hi)
            plt.yticks(ys, [percent(y) if self.percent else fmt(y) for y in ys])

    def render(self):
        self._draw()
        self.redraws += 1
        return super().render()
