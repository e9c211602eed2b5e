"""The studio app and its entry points (`grpo-studio`, `grpo-studio attach RUN`).

Screens (screens/): setup (with the VRAM panel) → dashboard of a run; runs list; compare. The trainer is
always a separate process; the studio reads its run directory and nothing else. The screens never reach into
the app: they post the messages in messages.py, and the `on_*` handlers below act on them.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from ..contract import config as cfgmod
from ..contract import rundir
from ..contract.bundled import DEFAULT_RECIPE
from ..contract.config import Config
from ..contract.errors import UserError
from ..contract.run_reader import Warnings, read_config
from ..contract.run_state import run_state
from . import launcher, messages
from .keymap import load_keymap


class StudioApp(App):
    CSS_PATH = "studio.tcss"
    TITLE = "grpo-studio"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    BINDINGS = [
        Binding("f2", "show_setup", "Setup", id="app.setup", show=False),
        Binding("f3", "show_runs", "Runs", id="app.runs"),
        Binding("question_mark,f1", "keys_help", "Keys", id="app.help", show=False),
        Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True, show=False),
    ]

    def __init__(
        self,
        cfg: Config | None = None,
        source: str = DEFAULT_RECIPE,
        runs_root: Path = rundir.RUNS,
        attach: Path | None = None,
        watch_tty: bool = False,
        poll_s: float = 1.0,
        live_hardware: bool = True,
    ):
        super().__init__()
        self.cfg = cfg if cfg is not None else cfgmod.load(source)
        self.source = source
        self.runs_root = Path(runs_root)
        self.attach_dir = attach
        self.watch_tty = watch_tty
        self.poll_s = poll_s
        self.live_hardware = live_hardware
        self.procs = []  # trainers started here: polled so a finished one is reaped, never waited on
        self.setup_screen = None

    def on_mount(self) -> None:
        keymap, error = load_keymap()
        if keymap:
            self.set_keymap(keymap)
        if error:
            self.notify(error, severity="error")
        from .screens.setup_screen import SetupScreen

        self.setup_screen = SetupScreen(self.cfg, self.source)
        self.push_screen(self.setup_screen)
        if self.attach_dir is not None:
            self.open_run(self.attach_dir)
        self.set_interval(1.0, self._housekeeping)
        if self.watch_tty:
            self._install_hangup()

    # ---- terminal liveness ------------------------------------------------------------------
    def _install_hangup(self) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, lambda: self._terminal_gone("terminal hung up"))
        except (NotImplementedError, RuntimeError):
            pass

    def _terminal_gone(self, why: str) -> None:
        """Exit, never spin: a clean shutdown, and a hard exit if writing to a dead tty blocks it."""
        import threading

        timer = threading.Timer(3.0, os._exit, args=(1,))
        timer.daemon = True
        timer.start()
        self.exit(return_code=1, message=f"grpo-studio: {why}; training continues")

    def _housekeeping(self) -> None:
        self.procs = [p for p in self.procs if p.poll() is None]  # reap exited trainers (no zombies)
        if self.watch_tty and not _stdin_is_tty():
            self._terminal_gone("the terminal went away")

    # ---- navigation -------------------------------------------------------------------------
    def action_show_setup(self) -> None:
        while len(self.screen_stack) > 2:
            self.pop_screen()

    def action_show_runs(self, mark: Path | None = None) -> None:
        from .screens.runs_list_screen import RunsScreen

        if isinstance(self.screen, RunsScreen):
            return
        self.push_screen(RunsScreen(self.runs_root, mark=mark))

    def action_keys_help(self) -> None:
        from .screens.keys_help import KeysHelp, binding_rows

        screen = self.screen
        if isinstance(screen, KeysHelp):
            return
        name = type(screen).__name__.removesuffix("Screen").lower()
        own = screen.help_sections(self._keymap) if hasattr(screen, "help_sections") else None
        sections = own or [(name, binding_rows(screen, self._keymap))]
        self.push_screen(KeysHelp([*sections, ("everywhere", binding_rows(self, self._keymap))]))

    def open_run(self, run_dir: Path) -> None:
        from .screens.dashboard_screen import DashboardScreen

        self.push_screen(DashboardScreen(Path(run_dir), poll_s=self.poll_s, live_hardware=self.live_hardware))

    def compare_runs(self, run_dirs: list[Path]) -> None:
        from .screens.compare_screen import CompareScreen

        self.push_screen(CompareScreen(run_dirs))

    # ---- training processes -----------------------------------------------------------------
    def launch_run(
        self, cfg: Config, label: str | None = None, force: bool = False, nproc: int = 1, rehearse: bool = False
    ) -> Path:
        run_dir = launcher.new_run_dir(self.runs_root, label or launcher.run_label(cfg))
        self.procs.append(launcher.launch(cfg, run_dir, force, nproc, rehearse))
        self.notify(f"trainer started: {run_dir}")
        self.open_run(run_dir)
        return run_dir

    def duplicate_run(self, run_dir: Path) -> None:
        from .screens.modals import Confirm

        try:
            cfg, dtype = launcher.duplicate_with_dtype(Path(run_dir))
        except UserError as err:
            self.notify(str(err), severity="error")
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.launch_run(cfg, f"{Path(run_dir).name.split('-2')[0]}-ab-{dtype}")
                self.notify("precision A/B started: F3, mark both runs with space, c to compare")

        self.push_screen(Confirm(f"Launch a copy of {Path(run_dir).name} with model.dtype = {dtype}?"), done)

    def fork_run(self, run_dir: Path, key: str, value: str) -> None:
        """Show the fork's config diff and where it starts; on yes, write it, start it and compare it with its
        parent (studio/fork.py)."""
        from . import fork
        from .screens.compare_screen import CompareScreen
        from .screens.modals import Confirm

        try:
            plan = fork.plan(Path(run_dir), key, value)
        except UserError as err:
            self.notify(str(err), severity="error")
            return

        def done(yes: bool | None) -> None:
            if not yes:
                return
            try:
                path = fork.make(plan)  # beside the parent, wherever the studio's runs list looks
            except UserError as err:
                self.notify(str(err), severity="error")
                return
            started = launcher.resume(path) if plan.step else launcher.launch(plan.cfg, path)
            self.procs.append(started)
            self.notify(f"fork started: {path}")
            self.push_screen(CompareScreen([plan.parent, path]))

        self.push_screen(Confirm("\n".join([*plan.lines(), "", "Launch this fork?"])), done)

    def export_model(self, run_dir: Path) -> None:
        """Ask for a destination, then export the run's newest checkpoint there in a child process (a folder:
        merged safetensors; FILE.gguf: f16 GGUF), showing its one line."""
        from .screens.modals import PathPrompt

        run_dir = Path(run_dir)

        def work(dest: str) -> None:
            self.call_from_thread(self.notify, f"exporting {run_dir.name} to {dest} …")
            ok, line = launcher.export(run_dir, dest)
            self.call_from_thread(self.notify, line, severity="information" if ok else "error", timeout=15)

        def chosen(dest: str | None) -> None:
            if dest:
                self.run_worker(lambda: work(dest), thread=True, exit_on_error=False, name="export")

        self.push_screen(
            PathPrompt(
                f"Export {run_dir.name}'s newest checkpoint to a folder (merged safetensors) or a FILE.gguf (f16)",
                str(run_dir / "merged"),
            ),
            chosen,
        )

    def export_report(self, run_dir: Path) -> None:
        def work() -> None:
            from . import report

            out = report.export(Path(run_dir))
            self.call_from_thread(self.notify, f"report written: {out}/index.html")

        self.run_worker(work, thread=True, exit_on_error=False, name="report")

    # ---- what the screens ask (messages.py) -------------------------------------------------
    def on_launch_requested(self, message: messages.LaunchRequested) -> None:
        devices = {"nproc": message.nproc} if message.nproc > 1 else {}
        if message.rehearse:
            devices["rehearse"] = True
        if message.force:
            self.launch_run(message.cfg, force=True, **devices)
        else:
            self.launch_run(message.cfg, **devices)

    def on_open_run(self, message: messages.OpenRun) -> None:
        self.open_run(message.run_dir)

    def on_compare_runs(self, message: messages.CompareRuns) -> None:
        self.compare_runs(message.run_dirs)

    def on_duplicate_run(self, message: messages.DuplicateRun) -> None:
        self.duplicate_run(message.run_dir)

    def on_fork_run(self, message: messages.ForkRun) -> None:
        self.fork_run(message.run_dir, message.key, message.value)

    def on_export_model(self, message: messages.ExportModel) -> None:
        self.export_model(message.run_dir)

    def on_export_report(self, message: messages.ExportReport) -> None:
        self.export_report(message.run_dir)

    def on_show_runs(self, message: messages.ShowRuns) -> None:
        self.action_show_runs(mark=message.mark)

    def on_show_setup(self, message: messages.ShowSetup) -> None:
        self.action_show_setup()

    def on_go_back(self, message: messages.GoBack) -> None:
        if len(self.screen_stack) > 2:
            self.pop_screen()
        else:
            self.action_show_runs()

    def on_ask_user(self, message: messages.AskUser) -> None:
        self.push_screen(message.dialog, message.then)

    # ---- command palette --------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        from .screens.dashboard_screen import DashboardScreen
        from .screens.setup_screen import SetupScreen

        yield SystemCommand("Runs", "List runs: open, compare, A/B precision", self.action_show_runs)
        yield SystemCommand("Setup", "Back to the setup screen", self.action_show_setup)
        if isinstance(screen, SetupScreen):
            yield SystemCommand("Launch run", "Start training with this setup", screen.action_launch)
            yield SystemCommand("Save setup", "Save the setup as a TOML preset", screen.action_save)
            yield SystemCommand("Load setup", "Load a TOML preset or recipe", screen.action_load)
            yield SystemCommand("Toggle VRAM mode", "Documented vs accurate estimate", screen.action_toggle_mode)
        if isinstance(screen, DashboardScreen):
            yield SystemCommand("Stop run", "Graceful: checkpoint, then exit", screen.action_stop)
            yield SystemCommand("Kill run", "SIGKILL the trainer's process group", screen.action_kill)
            yield SystemCommand("Duplicate with another dtype", "One-click precision A/B", screen.action_duplicate)
            yield SystemCommand("Export report", "PNG charts + HTML summary", screen.action_export)


def _stdin_is_tty() -> bool:
    try:
        return os.isatty(0)
    except (OSError, ValueError):
        return False


def _watch_tty() -> bool:
    """Watch for the terminal going away, except under `textual serve` (a web driver, no tty)."""
    return not os.environ.get("TEXTUAL_DRIVER")


def _terminal_ok() -> bool:
    return bool(os.environ.get("TEXTUAL_DRIVER")) or (_stdin_is_tty() and sys.stdout.isatty())


def _run(app: StudioApp) -> int:
    if not _terminal_ok():
        print("grpo-studio: stdin/stdout is not a terminal; use `grpo-studio train` for headless runs", file=sys.stderr)
        return 2
    app.run()
    return int(app.return_code or 0)


def open_studio(recipe: str, sets: list[str], runs_dir: Path) -> int:
    """`grpo-studio [RECIPE|FILE.toml] [--set KEY=VALUE]...`: the setup screen on the recipe."""
    cfg = cfgmod.load(recipe, sets)
    return _run(StudioApp(cfg, recipe, runs_dir, watch_tty=_watch_tty()))


def resolve_run(run: str, runs_root: Path) -> Path:
    path = Path(run)
    for candidate in (path, runs_root / run):
        if candidate.is_dir():
            return candidate
    names = [r.name for r in rundir.list_runs(runs_root)][:8]
    raise UserError(
        f"run {run!r} not found (not a folder, not under {runs_root}/)"
        + (f"; runs: {', '.join(names)}" if names else ""),
        kind="attach",
    )


def attach(run: str, runs_dir: Path | None = None) -> int:
    """`grpo-studio attach RUN`: the studio on a run's dashboard. What the run directory cannot give (an
    unreadable file, a config.toml that does not load) is a `warning:` line on stderr, and the dashboard opens on
    what is left (the setup screen then starts from the default recipe). Without --runs-dir the runs list is the
    run's own folder, where its forks land beside it."""
    run_dir = resolve_run(run, runs_dir or rundir.RUNS)
    runs_dir = runs_dir or run_dir.resolve().parent
    warn = Warnings()
    state = run_state(run_dir)
    warn.extend(state.warnings)
    read_config(run_dir, warn)
    try:
        cfg = launcher.load_run_config(run_dir)
    except UserError as err:
        warn(f"{rundir.CONFIG}: does not load ({err.line()}); the setup screen starts from {DEFAULT_RECIPE}")
        cfg = cfgmod.load(DEFAULT_RECIPE)
    for line in warn:  # malformed lines too, naming their file, as `grpo-studio runs` says them
        print(f"warning: {run_dir}/{line}", file=sys.stderr)
    return _run(StudioApp(cfg, str(run_dir), runs_dir, attach=run_dir, watch_tty=_watch_tty()))
