"""Charts: a PlotextPlot that keeps its lines, downsamples to ~2× its width and redraws only
when it is handed new data (or resized)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from textual_plotext import PlotextPlot

from grpo_studio.engine.contract.metrics import fmt  # noqa: F401  (re-exported for the panels)

# Named colours plotext maps onto the 16-colour palette, so charts read in plain terminals too.
COLORS = ["cyan", "magenta", "green", "yellow", "blue", "red", "white"]


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


class MetricChart(PlotextPlot):
    """One chart. `show(lines, title)` stores the data and asks for a redraw."""

    DEFAULT_CSS = "MetricChart { height: 1fr; }"

    def __init__(self, title: str = "", *, ylabel: str = "", log: bool = False, id: str | None = None,
                 classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.chart_title = title
        self.ylabel = ylabel
        self.use_log10 = log
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
        drawn, lo, hi = False, math.inf, -math.inf
        for i, line in enumerate(self.lines):
            if not line.xs:
                continue
            xs, ys = downsample(line.xs, line.ys, 2 * width)
            if self.use_log10:
                ys = log10(ys)
            plt.plot(xs, ys, label=line.label if len(self.lines) > 1 else None,
                     color=line.color or COLORS[i % len(COLORS)], marker=line.marker)
            drawn = True
            finite = [y for y in ys if math.isfinite(y)]
            lo, hi = min([lo, *finite]), max([hi, *finite])
        if drawn and math.isfinite(lo) and hi - lo < 1e-12:  # flat data: plotext would invert the axis
            plt.ylim(lo - 1, hi + 1)
        if not drawn:
            plt.text("waiting for data", 0.5, 0.5, alignment="center")
            plt.xlim(0, 1)
            plt.ylim(0, 1)

    def render(self):
        self._draw()
        self.redraws += 1
        return super().render()
