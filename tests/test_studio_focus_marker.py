"""Focus shows without colour: read as plain characters (no styles), the focused widget's left edge is a
heavy bar ┃ and the same widget's edge is blank once focus moves on, on the setup form and the runs list."""

from __future__ import annotations

import pytest

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import config as cfgmod
from grpo_studio.studio import hardware
from grpo_studio.studio.app import StudioApp
from tests.studio_helpers import anyio_backend, screen_text  # noqa: F401

MARK = "┃"


def left_edge(app, widget) -> str:
    """The character at the widget's top-left cell on screen (a space past a line's end)."""
    x, y = widget.region.x, widget.region.y
    line = screen_text(app).splitlines()[y]
    return line[x] if x < len(line) else " "


@pytest.mark.anyio
async def test_focus_moves_the_left_edge_mark(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "gpus", lambda: [])
    write_run(tmp_path / "runs" / "a", steps=3)
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", tmp_path / "runs", live_hardware=False, poll_s=3600)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        kinds = set()
        for _ in range(8):  # the form, then its fields one by one
            before = app.focused
            assert left_edge(app, before) == MARK, before
            await pilot.press("tab")
            await pilot.pause()
            assert app.focused is not before
            assert left_edge(app, app.focused) == MARK, app.focused
            if before.region.height and before.region.y < app.size.height:  # still on screen
                assert left_edge(app, before) != MARK, before
            kinds.add(type(before).__name__)
        assert {"VerticalScroll", "Select", "Input"} <= kinds
        await pilot.press("f3")
        await pilot.pause()
        table = app.screen.query_one("#runs-table")
        assert app.focused is table and left_edge(app, table) == MARK
        table.blur()
        await pilot.pause()
        assert left_edge(app, table) == " "
