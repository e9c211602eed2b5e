"""The setup screen's selected rewards are always visible at 80×24: the 7th reward, selected from the
6-row list, is named on the summary line, and the list scrolls to the highlighted item."""

from __future__ import annotations

import pytest
from textual.widgets import Static

from grpo_studio.contract import config as cfgmod
from grpo_studio.studio import hardware
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.rewards_info import builtin_rewards
from tests.studio_helpers import anyio_backend, focus_field, screen_text, visible_text  # noqa: F401


@pytest.mark.anyio
async def test_the_seventh_reward_shows_on_the_summary_line(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "gpus", lambda: [])
    names = [name for name, _ in builtin_rewards()]
    seventh = names[6]
    cfg = cfgmod.load("tiny-arith", [f"rewards.funcs={names[0]}"])
    app = StudioApp(cfg, "tiny-arith", tmp_path / "runs", live_hardware=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        summary = app.screen.query_one("#rewards-summary", Static)
        assert visible_text(summary).startswith(f"rewards: {names[0]} (1 of {len(names)} built-in)")
        await focus_field(pilot, "f-rewards-funcs")
        await pilot.press(*["down"] * 6, "space")
        await pilot.pause()
        assert app.screen.cfg.rewards.funcs == [names[0], seventh]
        shown = " ".join(visible_text(summary).split())
        assert shown == f"rewards: {names[0]}, {seventh} (2 of {len(names)} built-in)"
        on_screen = screen_text(app)
        assert all(line in on_screen for line in visible_text(summary).splitlines())  # scrolled into view
        listed = visible_text(app.screen.query_one("#f-rewards-funcs"))
        assert f"☑▌ {seventh}:" in listed  # the list scrolled to the highlighted, now selected, item
