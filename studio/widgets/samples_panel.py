"""The dashboard's Samples tab: a filter line and a search box, the table of samples (newest first), and the
highlighted sample in full under it (widgets/sample_view.py). Keys, with the table focused: a all, b best,
w worst, z zero-variance groups, t truncated; / searches prompts and completions (enter or escape returns)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Input, Static

from ...contract.metrics import fmt
from ..rundata import RunData
from . import sample_view


class SamplesPanel(Vertical):
    BINDINGS = [
        *[
            Binding(key, f"filter('{name}')", name, id=f"samples.filter_{key}", show=False)
            for key, name in sample_view.FILTERS.items()
        ],
        Binding("slash", "search", "Search", id="samples.search", show=False),
    ]
    DEFAULT_CSS = """
    SamplesPanel { height: 1fr; }
    SamplesPanel #samples-bar { height: auto; }
    SamplesPanel #samples-filter { width: 1fr; height: auto; padding: 0 1; }
    SamplesPanel #samples-search { width: 18; height: 1; border: none; padding: 0 1; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.mode = "all"
        self.run: RunData | None = None
        self.rows: list[dict] = []  # the table's rows, in its order
        self.by_group: dict[tuple, list[dict]] = {}

    def compose(self) -> ComposeResult:
        with Horizontal(id="samples-bar"):
            yield Static("", id="samples-filter", markup=False)
            yield Input(placeholder="/ search", id="samples-search")
        yield DataTable(id="samples-table", zebra_stripes=True, cursor_type="row")
        with VerticalScroll(id="sample-detail-box"):
            yield Static("", id="sample-detail", markup=False)

    def show(self, run: RunData) -> None:
        """Fill the table from the run's samples under the current filter and search."""
        self.run = run
        table = self.query_one("#samples-table", DataTable)
        funcs = run.reward_funcs()
        if not table.columns:
            table.add_columns("step", "adv", *funcs, "completion", "prompt")
        samples = list(run.samples)
        query = self.query_one("#samples-search", Input).value
        self.rows = sample_view.select(samples, self.mode, query)
        self.by_group = sample_view.groups(samples)
        table.clear()
        for row in self.rows:
            scores = row.get("rewards", {})
            table.add_row(
                str(row.get("step", "")),
                fmt(row.get("advantage")),
                *[fmt(scores.get(f)) for f in funcs],
                sample_view.table_cell(row),
                repr(row.get("prompt", ""))[1:-1][-60:],
            )
        keys = " · ".join(f"{k} {name}" for k, name in sample_view.FILTERS.items())
        found = f"{len(self.rows)} of {len(samples)}" + (f" matching {query!r}" if query else "")
        self.query_one("#samples-filter", Static).update(f"{self.mode}: {found} — {keys}")
        self._detail(table.cursor_row)

    def action_filter(self, mode: str) -> None:
        self.mode = mode
        if self.run is not None:
            self.show(self.run)

    def action_search(self) -> None:
        self.query_one("#samples-search", Input).focus()

    def on_input_changed(self, message: Input.Changed) -> None:
        if self.run is not None:
            self.show(self.run)

    def on_input_submitted(self, message: Input.Submitted) -> None:
        self.query_one("#samples-table", DataTable).focus()

    def on_key(self, event) -> None:
        if event.key == "escape" and self.query_one("#samples-search", Input).has_focus:
            event.stop()
            self.query_one("#samples-table", DataTable).focus()

    def on_data_table_row_highlighted(self, message: DataTable.RowHighlighted) -> None:
        self._detail(message.cursor_row)

    def _detail(self, index: int) -> None:
        """The highlighted sample in full: the prompt exactly as the model saw it, its scores and group, then
        the completion, or a multi-turn episode turn by turn in a taller box."""
        detail = self.query_one("#sample-detail", Static)
        if not 0 <= index < len(self.rows):
            detail.update("")
            return
        row = self.rows[index]
        self.query_one("#sample-detail-box").set_class(sample_view.episode(row) is not None, "episode")
        detail.update(sample_view.detail(row, self.by_group.get(sample_view.group_key(row))))
