"""Every key the keys help lists on the dashboard works from every tab, whatever has focus there: nothing, the tab
strip, or each focusable widget of the tab (80×24; at 120×40 and 200×60 the digits, ? and the tab's own keys from
its first focusable widget), on a running synthetic run, driven with Textual's pilot; one app, each key pressed in
turn with only what it changed put back.

The effects are written out by hand (EFFECTS): a digit opens its tab; s and k ask before stopping the running
trainer; d, e and x reach the app's duplicate, export-report and export-model; f opens the fork only from the
Doctor tab; c opens the runs list with this run marked; ? and f1 the keys help; f3 the runs list; f2 and esc go
back to setup; the Samples tab's a b w z t set its filter and / opens its search, on that tab only. The help's
key list for each tab must be exactly these keys, so a key added to the help without an effect here fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.command import CommandPalette
from textual.widgets import DataTable, Input, TabbedContent

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import config as cfgmod
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.screens.dashboard_screen import DashboardScreen
from grpo_studio.studio.screens.keys_help import KeysHelp
from grpo_studio.studio.screens.modals import Confirm
from grpo_studio.studio.screens.runs_list_screen import RunsScreen
from grpo_studio.studio.screens.setup_screen import SetupScreen
from grpo_studio.studio.widgets.samples_panel import SamplesPanel
from tests.studio_helpers import anyio_backend  # noqa: F401

# The dashboard's tabs in key order: 1 … 9, then 0.
TABS = ["overview", "training", "mismatch", "lengths", "perf", "histogram", "hardware", "samples", "events", "doctor"]
DIGITS = {tab: str((i + 1) % 10) for i, tab in enumerate(TABS)}
FILTERS = {"a": "all", "b": "best", "w": "worst", "z": "zero-variance", "t": "truncated"}
# Keys as the help names them, on every tab (dashboard + everywhere), and on the Samples tab besides.
COMMON = {*DIGITS.values(), "s", "k", "d", "c", "e", "x", "esc", "f2", "f3", "?", "f1", "ctrl+q"}
COMMON |= {"tab", "shift+tab", "ctrl+p", "ctrl+c", "super+c"}  # Textual's own: focus, command palette, copy
PAGES = {"[": -1, "]": 1}  # the Samples table's previous and next page
OWN = {"samples": {*FILTERS, *PAGES, "/", "typing"}, "doctor": {"f"}}


def help_keys(app) -> set[str]:
    """The keys the help lists for the dashboard's current tab (every key of a shared row)."""
    sections = app.screen.help_sections(app._keymap)
    from grpo_studio.studio.screens.keys_help import binding_rows

    rows = [row for _, rows in sections for row in rows] + binding_rows(app, app._keymap)
    return {key for keys, _ in rows for key in keys.split(" / ")}


class Spy:
    """The app's actions that would start processes or write files, recorded instead."""

    def __init__(self, app: StudioApp):
        self.calls: list[tuple] = []
        self.notes: list[str] = []
        for name in ("duplicate_run", "fork_run", "export_report", "export_model", "action_show_setup"):
            setattr(app, name, lambda *a, _n=name: self.calls.append((_n, *a)))
        notify = app.notify
        app.notify = lambda message, **kw: (self.notes.append(str(message)), notify(message, **kw))[1]


async def open_tab(pilot, app, spy, tab: str, focus) -> DashboardScreen:
    """The dashboard on `tab`, with focus on `focus` (None, "tabs", or a widget of the tab). Only what the last
    key changed is put back, with one pause at most: each pause lays out and paints the whole screen."""
    moved = False
    while not isinstance(app.screen, DashboardScreen):
        app.pop_screen()  # the runs list a key opened
        moved = True
    screen = app.screen
    screen.action_back = lambda: spy.calls.append(("back",))
    if screen.query_one(TabbedContent).active != tab:
        screen.query_one(TabbedContent).active = tab
        moved = True
    if moved:  # the pane shown, and a screen shown again focuses its first widget (AUTO_FOCUS) first
        await pilot.pause()
    target = None
    if focus == "tabs":
        target = screen.query_one("ContentTabs")
    elif focus is not None:
        target = focus
    if screen.focused is not target:
        screen.set_focus(target)
    assert screen.focused is target
    return screen


async def check_key(pilot, app, spy: Spy, run: Path, tab: str, focus, key: str) -> None:
    screen = await open_tab(pilot, app, spy, tab, focus)
    tabs, panel = screen.query_one(TabbedContent), screen.query_one(SamplesPanel)
    where = (tab, focus, key)
    spy.calls.clear()
    spy.notes.clear()
    if key in DIGITS.values():
        await pilot.press(key)
        assert tabs.active == TABS[(int(key) - 1) % 10], where
        assert app.screen is screen, where
    elif key in ("s", "k"):
        await pilot.press(key)
        assert isinstance(app.screen, Confirm), where
        assert ("KILL" in app.screen.question) == (key == "k"), where
        await pilot.press("n")
        assert app.screen is screen, where
    elif key in ("d", "e", "x"):
        await pilot.press(key)
        name = {"d": "duplicate_run", "e": "export_report", "x": "export_model"}[key]
        assert spy.calls == [(name, run)], where
    elif key == "f":
        await pilot.press(key)
        finding = screen.query_one("#doctor-panel").selected
        if tab == "doctor" and finding is not None:
            assert spy.calls == [("fork_run", run, finding.suggestion_key, finding.suggestion_value)], where
        else:
            assert spy.notes and spy.notes[-1].startswith("open the Doctor tab (0)"), where
    elif key == "c":
        await pilot.press(key)
        assert isinstance(app.screen, RunsScreen) and app.screen.marked == {run}, where
    elif key in ("?", "f1"):
        await pilot.press("question_mark" if key == "?" else key)
        await pilot.pause()
        assert isinstance(app.screen, KeysHelp), where
        await pilot.press("escape")
        assert app.screen is screen, where
    elif key == "f3":
        await pilot.press(key)
        assert isinstance(app.screen, RunsScreen), where
    elif key in ("f2", "esc"):  # the app's handlers recorded here; what they do: test_back_to_setup
        await pilot.press("escape" if key == "esc" else key)
        await pilot.pause()
        assert [call[0] for call in spy.calls] == ["action_show_setup" if key == "f2" else "back"], where
    elif key in FILTERS:
        panel.mode = "all" if key != "a" else "best"
        before = panel.mode
        await pilot.press(key)
        assert panel.mode == (FILTERS[key] if tab == "samples" else before), where
    elif key in PAGES:
        pages = []
        panel.action_page = lambda step: pages.append(step)  # what the panel does with it: tests/test_samples_index.py
        await pilot.press({"[": "left_square_bracket", "]": "right_square_bracket"}[key])
        del panel.action_page
        assert pages == ([PAGES[key]] if tab == "samples" else []), where
    elif key == "/":
        await pilot.press("slash")
        await pilot.pause()
        search = screen.query_one("#samples-search", Input)
        assert search.has_focus == (tab == "samples"), where
        if tab == "samples":  # typing goes to the box, esc returns to the table, and a digit then leaves
            await pilot.press("1", "2")
            await pilot.pause()
            assert search.value == "12" and tabs.active == "samples", where
            await pilot.press("escape")
            await pilot.pause()
            assert screen.query_one("#samples-table", DataTable).has_focus, where
            await pilot.press("3")
            await pilot.pause()
            assert tabs.active == "mismatch", where
            search.value = ""
    elif key in ("tab", "shift+tab"):  # the next (previous) widget of the screen's focus chain
        chain, before = screen.focus_chain, screen.focused
        step = 1 if key == "tab" else -1
        await pilot.press(key)
        if before is None:  # from nothing: some widget of the chain (Textual picks which)
            assert screen.focused in chain and app.screen is screen, where
        else:
            assert screen.focused is chain[(chain.index(before) + step) % len(chain)] and app.screen is screen, where
    elif key == "ctrl+p":
        await pilot.press(key)
        assert isinstance(app.screen, CommandPalette), where
        await pilot.press("escape")
        assert app.screen is screen, where
    elif key in ("ctrl+c", "super+c"):  # copies the selected text: nothing else changes
        await pilot.press(key)
        assert app.screen is screen and tabs.active == tab, where
    elif key == "typing":
        pass  # the help's line on the search box: checked with /
    elif key == "ctrl+q":
        pass  # quits the app: pressed once, last
    else:
        raise AssertionError(f"no effect written for {key!r}")


# Every focus and key at 80×24; at the larger sizes, where only the layout differs (the bindings and widgets are the
# same), the tab digits, the help and the tab's own keys from each tab's first focusable widget (where a swallowed
# key shows; nothing on a tab without one): a larger screen costs twice as much to paint after each key.
SIZES = [((80, 24), "every"), ((120, 40), "first"), ((200, 60), "first")]


@pytest.mark.anyio
@pytest.mark.parametrize("size, focuses", SIZES, ids=[f"{w}x{h}" for (w, h), _ in SIZES])
async def test_every_listed_key_from_every_tab_and_focus(tmp_path, size, focuses):
    run = write_run(tmp_path / "runs" / "live", steps=6, total=12, state="running")
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", tmp_path / "runs", live_hardware=False, poll_s=3600)
    spy = Spy(app)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        app.open_run(run)
        await pilot.pause()
        checked, failures = 0, []
        for tab in TABS:
            screen = await open_tab(pilot, app, spy, tab, None)
            keys = help_keys(app)
            assert keys == COMMON | OWN.get(tab, set()), (tab, keys ^ (COMMON | OWN.get(tab, set())))
            pane = screen.query_one(TabbedContent).active_pane
            # the widgets themselves: a tab's chart scroller has no id
            inside = [w for w in screen.focus_chain if pane in w.ancestors and w.id != "samples-search"]
            assert inside or tab in ("histogram", "hardware"), tab  # a tab's focusable widgets are found
            if focuses == "every":  # and the Samples and Doctor keys on every tab (that they do nothing elsewhere)
                focus_keys = [None, "tabs", *inside], keys | set(FILTERS) | set(PAGES) | {"/", "f"}
            else:  # the tab digits, the help and the tab's own keys, from its first widget
                focus_keys = inside[:1] or [None], {*DIGITS.values(), "?", *OWN.get(tab, set())}
            for focus in focus_keys[0]:
                for key in sorted(focus_keys[1]):
                    try:
                        await check_key(pilot, app, spy, run, tab, focus, key)
                    except AssertionError as failed:  # every failing (tab, focus, key) is named, not the first
                        failures.append(str(failed).splitlines()[0])
                    checked += 1
        assert not failures, f"{len(failures)} of {checked} checks failed:\n" + "\n".join(failures)
        assert checked > (600 if focuses == "every" else 100)
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert app.return_code == 0


@pytest.mark.anyio
async def test_back_to_setup(tmp_path):
    """esc and f2 leave the dashboard for the setup screen (the effect the matrix above records as a call)."""
    run = write_run(tmp_path / "runs" / "done", steps=3)
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", tmp_path / "runs", live_hardware=False, poll_s=3600)
    async with app.run_test(size=(80, 24)) as pilot:
        for key in ("escape", "f2"):
            app.open_run(run)
            await pilot.pause()
            app.screen.query_one(TabbedContent).active = "samples"
            await pilot.pause()
            assert app.screen.query_one("#samples-table").has_focus
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, SetupScreen), key
