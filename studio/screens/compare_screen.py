"""Compare runs: 2+ runs overlaid on the same charts (e.g. bf16 vs fp16 reward and k3)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ...contract import metrics
from ...contract.metrics import fmt
from ..panels import PANELS
from ..rundata import RunData
from ..widgets.metric_chart import COLORS, Line, MetricChart, grid_rows
from .dashboard_screen import empty_text

COMPARE_PANELS = ["reward", "k3", "loss", "dp_max"]


def overlay(runs: list[RunData], panel_id: str) -> list[Line]:
    """One line per run of the panel's first key: each run its own marker and colour (by its place in the
    selection); MetricChart draws the run with fewer points on top."""
    panel = PANELS[panel_id]
    key = panel.keys[0]
    lines = []
    for i, run in enumerate(runs):
        xs, ys = run.series(key)
        lines.append(Line(f"{run.name[-18:]} {run.dtype()}", xs, ys, color=COLORS[i % len(COLORS)]))
    return lines


def summary(runs: list[RunData]) -> Table:
    table = Table(box=None, header_style="bold", expand=True)
    for col in ("run", "dtype", "state", "step", "reward", "k3", "|Δp| max"):
        table.add_column(col, no_wrap=col != "run", overflow="ellipsis")
    for run in runs:
        table.add_row(
            run.name,
            run.dtype(),
            run.state(),
            str(run.step),
            fmt(run.last(metrics.REWARD)),
            fmt(run.last(metrics.K3)),
            fmt(run.last(metrics.DP_MAX)),
        )
    return table


class CompareScreen(Screen):
    BINDINGS = [
        Binding("escape", "back", "Back", id="compare.back"),
        Binding("r", "reload", "Refresh", id="compare.refresh"),
    ]

    def __init__(self, run_dirs: list[Path], **kwargs):
        super().__init__(**kwargs)
        self.runs = [RunData(Path(d)) for d in run_dirs]
        self.version = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="compare-summary")
        with Grid(id="compare-grid"):
            for pid in COMPARE_PANELS:
                panel = PANELS[pid]
                yield MetricChart(panel.title, log=panel.log, percent=panel.percent, note=panel.note, id=f"cmp-{pid}")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "compare · " + " vs ".join(r.dtype() for r in self.runs)
        for run in self.runs:
            run.drain()
        self.action_reload()
        self.set_interval(1.0, self.action_reload)
        self.call_after_refresh(self._fit_charts)

    def _fit_charts(self) -> None:
        """Two rows sharing the grid's height, or more where a chart needs it for its legend's names (then the grid
        scrolls)."""
        grid = self.query_one("#compare-grid", Grid)
        grid.styles.grid_rows = grid_rows(list(grid.query(MetricChart)), 2, max(1, grid.size.height // 2))

    def on_resize(self) -> None:
        self._fit_charts()

    def on_metric_chart_needs_rows(self, event: MetricChart.NeedsRows) -> None:
        self._fit_charts()

    def action_reload(self) -> None:
        for run in self.runs:
            run.poll()
        version = tuple(r.version for r in self.runs)
        if version == self.version:
            return
        self.version = version
        self.query_one("#compare-summary", Static).update(summary(self.runs))
        for pid in COMPARE_PANELS:
            panel = PANELS[pid]
            title = panel.title + (" (log10)" if panel.log else "")
            empty = "; ".join(f"{run.name}: {empty_text(run)}" for run in self.runs)
            self.query_one(f"#cmp-{pid}", MetricChart).show(
                overlay(self.runs, pid), title, empty=empty, short=panel.short_title or panel.title
            )

    def action_back(self) -> None:
        self.dismiss()
