"""The dashboard's Doctor tab: what `grpo-studio doctor RUN` finds (contract/diagnosis_rules.py), most
important first, one row each; under the table the highlighted finding's evidence, cause and suggested
change, and the key that forks the run with that change (studio/fork.py). A run no rule fired on says so
in one line."""

from __future__ import annotations

import time
from pathlib import Path

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ...contract.diagnosis import Finding, read_run
from ...contract.diagnosis_rules import findings, healthy_line

READ_EVERY_S = 10.0  # a live run's files are read again at most this often (samples.jsonl grows large)
FORK_HINT = "f: fork this run with the suggested change (the config diff is shown first)"


def detail(finding: Finding) -> str:
    return "\n".join(
        [
            f"{finding.severity}: {finding.title}",
            f"evidence: {finding.evidence}",
            f"cause: {finding.cause}",
            f"try: {finding.suggestion_key} = {finding.suggestion_value}",
            FORK_HINT,
        ]
    )


class DoctorPanel(Vertical):
    DEFAULT_CSS = """
    DoctorPanel { height: 1fr; }
    DoctorPanel #doctor-summary { height: auto; padding: 0 1; }
    DoctorPanel DataTable { height: auto; max-height: 50%; }
    DoctorPanel #doctor-detail { height: auto; padding: 0 1; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.found: list[Finding] = []
        self.read_at = -READ_EVERY_S

    def compose(self) -> ComposeResult:
        yield Static("", id="doctor-summary", markup=False)
        yield DataTable(id="doctor-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="doctor-detail", markup=False)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("severity", "finding")

    def diagnose(self, run_dir: Path) -> None:
        """Read the run again and list its findings (the cursor stays on its row number); on a live run at
        most every READ_EVERY_S seconds."""
        if time.monotonic() - self.read_at < READ_EVERY_S:
            return
        self.read_at = time.monotonic()
        view = read_run(run_dir)
        self.found = findings(view)
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        table.clear()
        for f in self.found:
            table.add_row(f.severity, f.title)
        n = len(self.found)
        summary = f"{n} finding{'s' * (n != 1)}, most important first" if n else healthy_line(view)
        self.query_one("#doctor-summary", Static).update(summary)
        table.display = bool(n)
        if n:
            table.move_cursor(row=min(max(cursor, 0), n - 1))
        self._show(table.cursor_row)

    def on_data_table_row_highlighted(self, message: DataTable.RowHighlighted) -> None:
        self._show(message.cursor_row)

    def _show(self, index: int) -> None:
        text = detail(self.found[index]) if 0 <= index < len(self.found) else ""
        self.query_one("#doctor-detail", Static).update(text)

    @property
    def selected(self) -> Finding | None:
        index = self.query_one(DataTable).cursor_row
        return self.found[index] if 0 <= index < len(self.found) else None
