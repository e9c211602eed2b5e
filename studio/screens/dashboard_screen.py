"""The live dashboard of one run: charts fed by tailing the run directory, at most once a
second and only when the trainer appended something."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Label, ProgressBar, RichLog, Static, TabbedContent, TabPane

from ...contract import metrics
from ...contract.dtypes import DTYPES
from ...contract.errors import UserError
from ...contract.metrics import fmt
from .. import hardware, lag, launcher, memory_rows
from ..messages import AskUser, DuplicateRun, ExportModel, ExportReport, ForkRun, GoBack, ShowRuns
from ..panels import PANELS, TABS, histogram_bars, histogram_title
from ..rundata import RunData
from ..widgets import perf_tables
from ..widgets.doctor_panel import DoctorPanel
from ..widgets.metric_chart import MetricChart, grid_rows
from ..widgets.samples_panel import SamplesPanel
from .modals import Confirm

EVENT_STYLE = {
    "warning": "yellow",
    "skipped_step": "yellow",
    "reward_error": "red",
    "crashed": "bold red",
    "stopped": "bold yellow",
    "finished": "bold green",
    "started": "bold cyan",
    "checkpoint": "green",
    "diverged": "bold red",
    "collapsed": "bold red",
    "alert": "bold black on yellow",
}
ALERT = "alert"  # alerts.* firings (docs/alerts.md): the whole line highlighted, and the bell
INFO_TABS = ("mismatch", "perf")
# The tabs after the charts', keyed on from the number after the last chart tab's ("0" for the tenth).
# Labels short enough for all ten tabs to fit 80 columns.
MORE_TABS = [("histogram", "Δlogp"), ("hardware", "Device"), ("samples", "Samples"), ("events", "Log")]
MORE_TABS += [("doctor", "Doctor")]
# Dashboard keys that act on one tab only: listed in that tab's section of the keys help.
TAB_KEYS = {"doctor": ("dashboard.fork",)}
SEARCH_HELP = ("typing", "in the search box: enter or esc returns to the table")
VERDICT_STYLE = {"lag": "bold yellow", "precision": "bold yellow", "none": "green"}
STATE_STYLE = {
    "running": "bold green",
    "finished": "bold cyan",
    "stopped": "bold yellow",
    "crashed": "bold red",
    "created": "dim",
}


def empty_text(run: RunData) -> str:
    """What a chart without points says: the run has logged steps without its keys; it ended before its first
    step; or none yet."""
    if run.steps:
        return f"not logged ({run.step} steps so far)"
    state = run.state()
    if state in ("crashed", "stopped", "finished"):
        return f"no data: the run {state} before its first step"
    return "waiting for data"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class DashboardTabs(TabbedContent):
    """The dashboard's tabs, whichever way a tab opens (a key, a click, code): focus that lands in the pane just
    hidden (Textual's Screen._reset_focus hands it to a sibling there, the Samples table's detail box) neither
    takes that tab back nor keeps keys going to a hidden widget."""

    def _on_tab_pane_focused(self, event: TabPane.Focused) -> None:
        if event.tab_pane.id != self.active:
            event.prevent_default()  # Textual would still call TabbedContent's handler after this one
            event.stop()
            self.screen.set_focus(None)


class DashboardScreen(Screen):
    BINDINGS = [
        Binding("s", "stop", "Stop", id="dashboard.stop"),
        Binding("k", "kill", "Kill", id="dashboard.kill"),
        Binding("d", "duplicate", "A/B dtype", id="dashboard.duplicate"),
        Binding("c", "compare", "Compare", id="dashboard.compare"),
        Binding("f", "fork", "Fork fix", id="dashboard.fork", show=False),
        Binding("e", "export", "Export", id="dashboard.export", show=False),
        Binding("x", "export_model", "Export model", id="dashboard.export_model", show=False),
        *[
            Binding(str((i + 1) % 10), f"tab('{tab}')", label, id=f"dashboard.tab_{tab}", show=False)
            for i, (tab, label) in enumerate([(t[0], t[1]) for t in TABS] + MORE_TABS)
        ],
        Binding("escape", "back", "Back", id="dashboard.back"),
        # The Samples tab's own keys, from wherever focus is on that tab (the tab strip, nowhere): the panel's
        # bindings, forwarded; with the panel focused its own binding acts first. Same ids: one keymap entry.
        *[
            Binding(b.key, f"samples_key({b.action!r})", b.description, id=b.id, show=False)
            for b in SamplesPanel.BINDINGS
        ],
    ]

    def __init__(self, run_dir: Path, poll_s: float = 1.0, live_hardware: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.run = RunData(Path(run_dir))
        self.poll_s = poll_s
        self.live_hardware = live_hardware
        self.drawn: dict[str, int] = {}
        self.events_seen = 0
        self.plan_here: memory_rows.Plan | None = None  # the pre-flight's plan for this machine's device
        dtype = self.run.config.get("model", {}).get("dtype")
        self.fp16 = dtype in DTYPES and DTYPES[dtype].loss_scaling  # the loss-scale chart

    # ---- layout -----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="run-status"):
            yield Label("", id="run-title")
            yield ProgressBar(total=None, show_eta=False, id="progress")
            yield Label("", id="run-step")
        with DashboardTabs(id="tabs"):
            for tab, label, panel_ids in TABS:
                with TabPane(label, id=tab):
                    if tab in INFO_TABS:  # the lag verdict, the time split: hidden until the run has them
                        yield Static("", id=f"{tab}-info", classes="tab-info")
                    with VerticalScroll(classes="charts"):
                        for pid in panel_ids:
                            panel = PANELS[pid]
                            if panel.needs_beta and self.run.beta() <= 0:
                                continue
                            if pid in ("loss_scale", "skipped") and not self.fp16:
                                continue
                            chart = MetricChart(
                                panel.title, log=panel.log, percent=panel.percent, note=panel.note, id=f"{tab}-{pid}"
                            )
                            chart.display = not panel.gate  # shown by _draw_tab once the run has its data
                            yield chart
            with TabPane("Δlogp", id="histogram"):
                yield MetricChart("token |Δlogp| histogram", id="histogram-chart")
            with TabPane("Device", id="hardware"):
                yield Static("", id="hardware-info")
            with TabPane("Samples", id="samples"):
                yield SamplesPanel(id="samples-panel")
            with TabPane("Log", id="events"):
                # min_width 1: wrapped at the log's own width (78 by default is wider than 80 columns leave it)
                yield RichLog(id="events-log", wrap=True, markup=False, max_lines=2000, min_width=1)
            with TabPane("Doctor", id="doctor"):
                yield DoctorPanel(id="doctor-panel")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"run · {self.run.name}"
        self._fit_charts()
        self._estimate()
        self.run.drain()  # attach: read the history already on disk before the first frame
        self.refresh_data()
        self.set_interval(self.poll_s, self.refresh_data)
        if self.live_hardware:
            self.set_interval(2.0, self._hardware)

    def on_resize(self) -> None:
        self._fit_charts()
        self.query_one("#events-log", RichLog).clear()  # the log wraps again at its new width
        self.events_seen = 0

    def _fit_charts(self) -> None:
        """Two charts per row; rows share the height left beside the tab's info lines, but never below 9
        lines, nor below what a chart in the row needs to list its legend's names whole (then the tab scrolls)."""
        height = self.size.height - 6  # header, status, tab strip (2), footer
        for grid in self.query(".charts"):
            info = sum(w.outer_size.height for w in grid.parent.children if w is not grid and w.display)
            shown = [chart for chart in grid.children if chart.display]
            columns = 2 if len(shown) > 1 else 1
            grid.styles.grid_size_columns = columns
            grid.styles.grid_rows = grid_rows(shown, columns, max(9, (height - info) // max(1, -(-len(shown) // 2))))

    def on_metric_chart_needs_rows(self, event: MetricChart.NeedsRows) -> None:
        self._fit_charts()

    def _estimate(self) -> None:
        self.plan_here = memory_rows.plan_here(self.run.dir)

    # ---- refreshing -------------------------------------------------------------------------
    def refresh_data(self) -> None:
        self.run.poll()
        self._status()
        self._draw_tab(self.query_one(TabbedContent).active)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._draw_tab(event.pane.id)
        if event.pane.id == "samples":  # every visit: the table has the rows the keys move through
            self.set_focus(self.query_one("#samples-table"))

    def _draw_tab(self, tab: str | None) -> None:
        if not tab or self.drawn.get(tab) == self.run.version:
            return
        self.drawn[tab] = self.run.version
        if tab == "histogram":
            labels, values = histogram_bars(self.run.histogram)
            step = (self.run.histogram or {}).get("step")
            self.query_one("#histogram-chart", MetricChart).show_bars(
                labels, values, histogram_title(self.run.histogram) if step else "no histogram yet"
            )
        elif tab == "hardware":
            self._hardware()
        elif tab == "samples":
            self._samples()
        elif tab == "events":
            self._events()
        elif tab == "doctor":
            self.query_one(DoctorPanel).diagnose(self.run.dir)
        else:
            refit = False
            for chart in self.query_one(f"#{tab}").query(MetricChart):
                panel = PANELS[chart.id.split("-", 1)[1]]
                if chart.display != panel.present(self.run):
                    chart.display, refit = not chart.display, True
                if chart.display:
                    chart.show(
                        panel.lines(self.run),
                        panel.headline(self.run),
                        empty=self._empty(),
                        short=panel.short_headline(self.run),
                        note=panel.note_for(self.run),
                    )
            if refit:
                self._fit_charts()
            if tab in INFO_TABS:
                self._info(tab)
        if tab != "events":
            self._events()  # the log keeps up even when hidden, so nothing is missed

    def _status(self) -> None:
        run, state = self.run, self.run.state()
        total = run.total_steps
        rehearsal = run.rehearsal if not run.steps else None  # shown until the first step
        if rehearsal and rehearsal.get("phase") == "running" and state == "created":
            state = "rehearsing"
        title = Text(f"{state} · {run.dtype()}")
        title.stylize(STATE_STYLE.get(state, ""), 0, len(state))
        self.query_one("#run-title", Label).update(title)
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=total or None, progress=run.step)
        eta = run.eta_s() if state == "running" else None
        reward, k3 = run.last(metrics.REWARD), run.last(metrics.K3)
        eta_text = f"  ETA {fmt_duration(eta)}" if eta is not None else ""  # no "ETA –": room for k3 at 80 columns
        self.query_one("#run-step", Label).update(
            str(rehearsal.get("message", ""))
            if rehearsal
            else f"{run.step}/{total or '?'}{eta_text}  reward {fmt(reward)}  k3 {fmt(k3)}"
        )

    def _info(self, tab: str) -> None:
        """The Mismatch tab's lag verdict, the Perf tab's time split: each shown once the run has its metrics."""
        box = self.query_one(f"#{tab}-info", Static)
        if tab == "mismatch":
            found = lag.verdict(
                self.run.last(lag.LAG0_K3),
                self.run.last(lag.LAGGED_K3),
                self.run.last(lag.LAGGED_FRAC),
                self.run.config.get("model", {}).get("dtype", ""),
            )
            shares = lag.lag_shares(self.run.histogram)
            content = (
                None
                if found is None
                else Text.assemble((found.line, VERDICT_STYLE[found.cause]), ("\n" + shares) if shares else "")
            )
        else:
            content = perf_tables.split_table(self.run)
        height = box.outer_size.height if box.display else 0
        box.display = content is not None
        if content is not None:
            box.update(content)
        self.call_after_refresh(self._refit, box, height)

    def _refit(self, box: Static, height: int) -> None:
        if (box.outer_size.height if box.display else 0) != height:  # the info lines changed the charts' room
            self._fit_charts()

    def _empty(self) -> str:
        return empty_text(self.run)

    def _samples(self) -> None:
        self.query_one(SamplesPanel).show(self.run)

    def _events(self) -> None:
        log = self.query_one("#events-log", RichLog)
        events = list(self.run.events)
        new = events[self.events_seen :] if self.events_seen <= len(events) else events
        for e in new:
            stamp = time.strftime("%H:%M:%S", time.localtime(e.get("time") or 0))
            kind = e.get("event", "")
            line = Text.assemble(
                (stamp + " ", "dim"), (f"{kind:<12}", EVENT_STYLE.get(kind, "")), str(e.get("message", ""))
            )
            if kind == ALERT:
                line.stylize(EVENT_STYLE[ALERT])
            log.write(line)
        if self.events_seen and any(e.get("event") == ALERT for e in new):  # live alerts ring; a replay does not
            self.call_later(self.run_action, "app.bell")  # the app's bell action: App.bell
        self.events_seen = len(events)

    def _hardware(self) -> None:
        table = Table(box=None, show_header=True, expand=False, header_style="bold")
        table.add_column("device")
        table.add_column("util", justify="right")
        table.add_column("memory", justify="right")
        gpus = hardware.gpus()
        for g in gpus:
            table.add_row(f"GPU{g.index} {g.name}", f"{g.util:.0f}%", f"{g.used_gib:.1f}/{g.total_gib:.0f} GiB")
        if not gpus:
            table.add_row("GPU", "–", "no GPU detected")
        h = hardware.host()
        table.add_row(
            f"CPU ×{h['cpus']}", f"{h['cpu_percent']:.0f}%", f"RAM {h['ram_used_gib']:.1f}/{h['ram_total_gib']:.0f} GiB"
        )
        memory, note = memory_rows.rows(self.run, memory_rows.planned(self.run, self.plan_here))
        for label, value in memory:
            table.add_row(label, "", value)
        ranks = perf_tables.rank_table(self.run)  # data-parallel runs: each rank's last step
        extra = [] if ranks is None else [Text(""), ranks]
        self.query_one("#hardware-info", Static).update(Group(table, Text(note, style="dim"), *extra))

    # ---- actions ----------------------------------------------------------------------------
    def action_tab(self, tab: str) -> None:
        """Switch tabs from wherever focus is. Focus inside the pane being hidden is dropped first: left to
        Textual, a hidden focused widget hands focus to a sibling in the same hidden pane (Screen._reset_focus),
        and the focused pane takes its tab back (the Samples table and its detail box did)."""
        tabs = self.query_one(TabbedContent)
        pane = tabs.active_pane
        if self.focused is not None and pane is not None and pane in self.focused.ancestors:
            self.set_focus(None)
        tabs.active = tab

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """The Samples tab's keys act on that tab only; elsewhere the key falls through."""
        if action == "samples_key":
            return self.query_one(TabbedContent).active == "samples"
        return True

    async def action_samples_key(self, action: str) -> None:
        await self.query_one(SamplesPanel).run_action(action)

    def help_sections(self, keymap: dict[str, str]) -> list[tuple[str, list[tuple[str, str]]]]:
        """The keys help: the dashboard's keys, then the open tab's own (the Samples filters and search, the
        Doctor's fork), each key once."""
        from .keys_help import binding_rows

        tabs = self.query_one(TabbedContent)
        label = str(tabs.get_tab(tabs.active).label.plain) if tabs.active else ""
        own = TAB_KEYS.get(tabs.active, ())
        every_own = {key_id for ids in TAB_KEYS.values() for key_id in ids}
        rows = binding_rows(self, keymap, skip=lambda b: b.id in every_own or b.action.startswith("samples_key"))
        sections = [("dashboard", rows)]
        tab_rows = binding_rows(self, keymap, skip=lambda b: b.id not in own)
        if tabs.active == "samples":
            tab_rows = binding_rows(self.query_one(SamplesPanel), keymap) + [SEARCH_HELP]
        if tab_rows:
            sections.append((f"{label} tab", tab_rows))
        return sections

    def action_back(self) -> None:
        self.post_message(GoBack())

    def action_stop(self) -> None:
        self._confirm_then(
            f"Stop {self.run.name}? (checkpoint, then exit)",
            launcher.stop,
            "stop requested: the trainer checkpoints and exits after this step",
            "information",
        )

    def action_kill(self) -> None:
        self._confirm_then(
            f"KILL {self.run.name} now, without a checkpoint?",
            launcher.kill,
            f"killed {self.run.name} (no checkpoint)",
            "warning",
        )

    def _confirm_then(self, question: str, act, done_message: str, severity: str) -> None:
        """Ask, then act on the running trainer; a run that is not running gets a warning, and a process
        that is not proven to be its trainer is left alone (launcher.trainer_process says why)."""
        if self.run.state() != "running":
            self.notify("the run is not running", severity="warning")
            return

        def done(yes: bool | None) -> None:
            if not yes:
                return
            try:
                act(self.run.dir)
            except UserError as refused:
                self.notify(str(refused), severity="error")
            else:
                self.notify(done_message, severity=severity)

        self.post_message(AskUser(Confirm(question), done))

    def action_duplicate(self) -> None:
        self.post_message(DuplicateRun(self.run.dir))

    def action_fork(self) -> None:
        """Fork the run with the Doctor tab's highlighted suggestion (the app shows the diff first)."""
        finding = self.query_one(DoctorPanel).selected
        if self.query_one(TabbedContent).active != "doctor" or finding is None:
            self.notify("open the Doctor tab (0) and pick a finding to fork with its suggested change")
            return
        self.post_message(ForkRun(self.run.dir, finding.suggestion_key, finding.suggestion_value))

    def action_compare(self) -> None:
        self.post_message(ShowRuns(mark=self.run.dir))

    def action_export(self) -> None:
        self.post_message(ExportReport(self.run.dir))

    def action_export_model(self) -> None:
        self.post_message(ExportModel(self.run.dir))
