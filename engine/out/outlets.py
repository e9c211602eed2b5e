"""What leaves the trainer as the run goes, besides the run directory: tracker fan-out (engine/out/trackers.py)
and alerts (engine/out/alerts.py). The trainer holds one `Outlets` and calls `row` after each metrics row is
stored, `event` on the run's end (finished, stopped, diverged, crashed) and `close` when done. Only the
process that writes the run directory (rank 0) has live outlets."""

from __future__ import annotations

from ...contract.config import Config
from ...contract.rundir import RunWriter
from .alerts import Alerts
from .trackers import Trackers


class Outlets:
    def __init__(self, cfg: Config, writer: RunWriter, main: bool = True):
        """A missing tracker package or notify-send is one line here, before the model loads."""
        self.main = main
        if main:
            self.trackers, self.alerts = Trackers(cfg, writer), Alerts(cfg, writer)

    def row(self, row: dict) -> None:
        if self.main:
            self.trackers.row(row)
            self.alerts.row(row)

    def event(self, kind: str, message: str, step: int) -> None:
        if self.main:
            self.alerts.event(kind, message, step)

    def close(self) -> None:
        if self.main:
            self.trackers.close()
