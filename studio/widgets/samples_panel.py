"""The dashboard's Samples tab: a filter line and a search box, the table of samples (newest first), and the
highlighted sample in full under it (widgets/sample_view.py). Keys, with the table focused: a all, b best,
w worst, z zero-variance groups, t truncated; [ and ] the previous and next page; / searches prompts and
completions (enter or escape returns).

Every row of samples.jsonl is reachable: the table shows one page (PAGE rows) of the run's samples index
(contract/samples_index.py), and a search covers the whole file in a worker thread (the UI never waits on it;
a newer query cancels it), then only the rows appended since as the run goes on."""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Input, Static
from textual.worker import get_current_worker

from ...contract.metrics import fmt
from ...contract.samples_index import SamplesIndex
from ..rundata import RunData
from . import sample_view


class SamplesPanel(Vertical):
    BINDINGS = [
        *[
            Binding(key, f"filter('{name}')", name, id=f"samples.filter_{key}", show=False)
            for key, name in sample_view.FILTERS.items()
        ],
        Binding("left_square_bracket", "page(-1)", "Previous page", id="samples.page_previous", show=False),
        Binding("right_square_bracket", "page(1)", "Next page", id="samples.page_next", show=False),
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
        self.first = 0  # the page's first row, in the filter's order
        self.ids: list[int] = []  # the table's rows as index ids, in its order
        self.rows: list[dict] = []  # the same rows, read from the file (long texts clipped)
        self.found: Found | None = None  # the search's hits so far
        self._order: tuple[tuple, list[int] | range] = ((), range(0))  # the filter's order, and what it was of

    def compose(self) -> ComposeResult:
        with Horizontal(id="samples-bar"):
            yield Static("", id="samples-filter", markup=False)
            yield Input(placeholder="/ search", id="samples-search")
        yield DataTable(id="samples-table", zebra_stripes=True, cursor_type="row")
        with VerticalScroll(id="sample-detail-box"):
            yield Static("", id="sample-detail", markup=False)

    def show(self, run: RunData) -> None:
        """Fill the table with the current page of the run's samples under the filter and search."""
        self.run = run
        index = run.samples_index
        table = self.query_one("#samples-table", DataTable)
        funcs = run.reward_funcs()
        if not table.columns:
            table.add_columns("step", "adv", *funcs, "completion", "prompt")
        query = self.query_one("#samples-search", Input).value
        found = self._search(index, query)
        order = self._ordered(index, found)
        self.first = min(self.first, max(0, len(order) - 1) // PAGE * PAGE)
        self.ids = list(order[self.first : self.first + PAGE])
        self.rows = [clipped(row or {}) for row in index.rows(self.ids)]
        table.clear()
        for row in self.rows:
            scores = row.get("rewards") or {}
            table.add_row(
                str(row.get("step", "")),
                fmt(row.get("advantage")),
                *[fmt(scores.get(f)) for f in funcs],
                sample_view.table_cell(row),
                repr(row.get("prompt", ""))[1:-1][-60:],
            )
        self.query_one("#samples-filter", Static).update(self._line(index, query, found, len(order)))
        self._detail(table.cursor_row)

    def _line(self, index: SamplesIndex, query: str, found: Found | None, shown: int) -> str:
        """The filter line: the filter, which rows of how many, the search and the file's extent, then the keys."""
        keys = " · ".join(f"{k} {name}" for k, name in sample_view.FILTERS.items()) + " · [ ] page"
        if found is not None and found.busy:
            return f"{self.mode}: searching {len(index):,} rows for {query!r} … — {keys}"
        rows = f"{self.first + 1:,}–{self.first + len(self.ids):,} of {shown:,}" if shown else "no rows"
        if found is not None:
            rows += f"{'+' * found.more} matching {query!r}"
        steps = index.step_range()  # the whole file's extent, whatever the filter keeps
        where = f" · {len(index):,} rows, steps {steps[0]}–{steps[1]}" if steps else ""
        return f"{self.mode}: {rows}{where} — {keys}"

    def _ordered(self, index: SamplesIndex, found: Found | None) -> list[int] | range:
        """The filter's order of every row (or of the search's hits), kept until the index or the hits change."""
        hits = None if found is None else found.hits
        key = (self.mode, index.generation, len(index), None if hits is None else len(hits), id(found))
        if self._order[0] != key:
            self._order = (key, index.order(self.mode, hits))
        return self._order[1]

    def _search(self, index: SamplesIndex, query: str) -> Found | None:
        """The hits of `query` so far; a search of what they do not cover yet starts in a worker thread."""
        if not query:
            self.found = None
            return None
        found = self.found
        if found is None or found.query != query or found.generation != index.generation:
            found = self.found = Found(query, index.generation)
            self.first = 0
        if not found.busy and found.upto < len(index) and not found.more:
            found.busy = True
            self.run_worker(
                lambda: self._search_from(index, found, found.upto, len(index)),
                thread=True,
                exclusive=True,
                group="samples-search",
                exit_on_error=False,
            )
        return found

    def _search_from(self, index: SamplesIndex, found: Found, first: int, upto: int) -> None:
        """In a worker thread: the hits of rows first..upto-1, then the table again (unless cancelled)."""
        worker = get_current_worker()
        hits, more = index.search(found.query, lambda: worker.is_cancelled, first, upto)
        if worker.is_cancelled:
            return
        self.app.call_from_thread(self._searched, found, hits, more, upto)

    def _searched(self, found: Found, hits: list[int], more: bool, upto: int) -> None:
        found.hits, found.more, found.upto, found.busy = found.hits + hits, more, upto, False
        if found is self.found and self.run is not None:
            self.show(self.run)

    def action_page(self, step: int) -> None:
        """The previous (-1) or next (+1) page of the filter's rows."""
        if self.run is None:
            return
        self.first = max(0, self.first + step * PAGE)
        self.show(self.run)
        self.query_one("#samples-table", DataTable).move_cursor(row=0)

    def action_filter(self, mode: str) -> None:
        self.mode, self.first = mode, 0
        if self.run is not None:
            self.show(self.run)

    def action_search(self) -> None:
        self.query_one("#samples-search", Input).focus()

    def on_input_changed(self, message: Input.Changed) -> None:
        self.first = 0
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
        samples = self.run.samples_index
        group = [r for r in samples.rows(samples.group(self.ids[index])) if r is not None]
        detail.update(sample_view.detail(row, group or [row]))


PAGE = 100  # table rows a page
MAX_CELL_CHARS = 20_000  # a prompt or completion longer than this is shown cut, saying how much more there is


@dataclass
class Found:
    """A search's hits (index ids, file order) over rows 0..upto-1 of the index's generation."""

    query: str
    generation: int
    hits: list[int] = field(default_factory=list)
    upto: int = 0
    more: bool = False  # samples_index.MAX_HITS reached
    busy: bool = False  # a worker is searching


def clipped(row: dict) -> dict:
    """The row with a prompt or completion over MAX_CELL_CHARS cut there (a 10 MB line stays one screen)."""
    out = dict(row)
    for key in ("prompt", "completion"):
        text = out.get(key)
        if isinstance(text, str) and len(text) > MAX_CELL_CHARS:
            out[key] = f"{text[:MAX_CELL_CHARS]}… ({len(text) - MAX_CELL_CHARS:,} more characters)"
    return out
