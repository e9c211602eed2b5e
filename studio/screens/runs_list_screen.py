"""The runs list: every run under the runs folder with its state (from pid liveness and events), newest
start first (a stable order; a refresh keeps the cursor on its run). Open any of them, mark two or more to
compare, duplicate one with another dtype, or export its newest checkpoint (`grpo-studio export` in a child
process: the studio never loads torch)."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from ...contract import rundir
from ...contract.metrics import fmt
from ..messages import CompareRuns, DuplicateRun, ExportModel, OpenRun, ShowSetup
from .dashboard_screen import STATE_STYLE


class RunsScreen(Screen):
    BINDINGS = [
        Binding("enter", "open", "Open", id="runs.open", priority=True),
        Binding("space", "mark", "Mark", id="runs.mark"),
        Binding("c", "compare", "Compare", id="runs.compare"),
        Binding("d", "duplicate", "A/B dtype", id="runs.duplicate"),
        Binding("x", "export", "Export", id="runs.export", show=False),  # the hint line says it: 80 columns
        Binding("r", "reload", "Refresh", id="runs.refresh"),
        Binding("escape", "back", "Back", id="runs.back"),
    ]

    def __init__(self, root: Path, mark: Path | None = None, **kwargs):
        super().__init__(**kwargs)
        self.root = Path(root)
        self.marked: set[Path] = {Path(mark)} if mark else set()
        self.rows: list[dict] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="runs-hint")
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"runs · {self.root}"
        table = self.query_one(DataTable)
        table.add_columns("", "run", "state", "step", "dtype", "reward", "k3", "model")
        self.action_reload()
        self.set_interval(2.0, self.action_reload)
        table.focus()

    def action_reload(self) -> None:
        table = self.query_one(DataTable)
        row_now, run_now = table.cursor_row, self._current()
        self.rows = rundir.run_summaries(self.root)
        table.clear()
        for row in self.rows:
            total = f"/{row['total']}" if row["total"] else ""
            table.add_row(
                "●" if row["path"] in self.marked else " ",
                row["name"],
                Text(row["state"], style=STATE_STYLE.get(row["state"], "")),
                f"{row['step']}{total}",
                row["dtype"],
                fmt(row["reward"]),
                fmt(row["k3"]),
                row["model"],
                key=str(row["path"]),
            )
        if self.rows:  # the cursor stays on its run; if that run went away, on the row it was on
            paths = [row["path"] for row in self.rows]
            keep = paths.index(run_now["path"]) if run_now and run_now["path"] in paths else row_now
            table.move_cursor(row=min(keep, len(self.rows) - 1))
        hint = (
            f"{len(self.rows)} runs under {self.root}.  space marks runs; c compares the marked ones; x exports"
            if self.rows
            else f"no runs under {self.root} yet: launch one from the setup screen"
        )
        self.query_one("#runs-hint", Static).update(hint)

    def _current(self) -> dict | None:
        table = self.query_one(DataTable)
        return self.rows[table.cursor_row] if self.rows and 0 <= table.cursor_row < len(self.rows) else None

    def action_open(self) -> None:
        row = self._current()
        if row:
            self.post_message(OpenRun(row["path"]))

    def action_mark(self) -> None:
        row = self._current()
        if row:
            self.marked.symmetric_difference_update({row["path"]})
            self.action_reload()
            self.query_one(DataTable).action_cursor_down()

    def action_compare(self) -> None:
        paths = [r["path"] for r in self.rows if r["path"] in self.marked]
        if len(paths) < 2:
            self.notify("mark two or more runs with space first", severity="warning")
            return
        self.post_message(CompareRuns(paths))

    def action_duplicate(self) -> None:
        row = self._current()
        if row:
            self.post_message(DuplicateRun(row["path"]))

    def action_export(self) -> None:
        row = self._current()
        if row:
            self.post_message(ExportModel(row["path"]))

    def action_back(self) -> None:
        self.post_message(ShowSetup())
