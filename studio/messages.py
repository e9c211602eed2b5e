"""What the screens ask of the app, as Textual messages: a screen posts one (`self.post_message(...)`), it
bubbles up to StudioApp, and the app's `on_<name>` handler acts (starts a trainer, pushes a screen, exports).
So no screen reaches into the app, and each screen can be hosted, tested or replaced on its own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.message import Message
from textual.screen import Screen

from ..contract.config import Config


class LaunchRequested(Message):
    """Start a trainer on this config (setup screen, ctrl+r; ctrl+b: after a rehearsal step, `train --rehearse`);
    `force` once the user answered "launch anyway"."""

    def __init__(self, cfg: Config, force: bool = False, nproc: int = 1, rehearse: bool = False) -> None:
        super().__init__()
        self.cfg, self.force, self.nproc, self.rehearse = cfg, force, nproc, rehearse


class OpenRun(Message):
    """Show this run's dashboard (runs list, enter)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)


class CompareRuns(Message):
    """Overlay these runs on one set of charts (runs list, c with two or more marked)."""

    def __init__(self, run_dirs: list[Path]) -> None:
        super().__init__()
        self.run_dirs = [Path(d) for d in run_dirs]


class DuplicateRun(Message):
    """Ask, then launch a copy of this run with the other dtype: the one-key precision A/B."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)


class ForkRun(Message):
    """Show the config diff, then fork this run with `key` = `value` (a doctor's suggestion) and compare the two."""

    def __init__(self, run_dir: Path, key: str, value: str) -> None:
        super().__init__()
        self.run_dir, self.key, self.value = Path(run_dir), key, value


class ExportModel(Message):
    """Ask for a destination, then export this run's newest checkpoint in a child process."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)


class ExportReport(Message):
    """Write this run's PNG charts and HTML summary (studio/report.py) in a worker thread."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)


class ShowRuns(Message):
    """Show the runs list, with `mark` (a run folder) already marked for a comparison."""

    def __init__(self, mark: Path | None = None) -> None:
        super().__init__()
        self.mark = mark


class ShowSetup(Message):
    """Back to the setup screen, closing whatever is above it."""


class GoBack(Message):
    """Leave the dashboard: to the screen under it, or to the runs list when it is the only run screen."""


class AskUser(Message):
    """Show a modal dialog (screens/modals.py); `then` is called with its answer."""

    def __init__(self, dialog: Screen, then: Callable[[Any], None] | None = None) -> None:
        super().__init__()
        self.dialog, self.then = dialog, then
