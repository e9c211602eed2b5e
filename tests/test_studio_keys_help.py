"""`?` and F1 open the keys help on every screen at 80×24, 120×40 and 200×60: every key of the screen and
of the app, with its description, is on screen (scrolling the help when it does not fit); escape closes it."""

from __future__ import annotations

import pytest

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import config as cfgmod
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.screens.dashboard_screen import TAB_KEYS
from grpo_studio.studio.screens.keys_help import KeysHelp, key_name
from tests.studio_helpers import anyio_backend, screen_text  # noqa: F401

SIZES = [(80, 24), (120, 40), (200, 60)]


def expected(screen, app) -> list[tuple[str, str]]:
    """(key, description) of every non-system binding, straight from the classes' BINDINGS; the dashboard's
    forwarded Samples keys are that tab's own (tests/test_studio_keys_every_tab.py), not listed on the others."""
    pairs = []
    for binding in [*type(screen).BINDINGS, *type(app).BINDINGS]:
        tab_own = binding.id in {key_id for ids in TAB_KEYS.values() for key_id in ids}  # the Doctor's f
        if not binding.system and not binding.action.startswith("samples_key") and not tab_own:
            pairs += [(key_name(key.strip()), binding.description) for key in binding.key.split(",")]
    return pairs


async def read_help(pilot) -> str:
    """The help's text from top to bottom, scrolling it one page at a time."""
    box = pilot.app.screen.query_one("#keys-help")
    seen = [screen_text(pilot.app)]
    while box.scroll_y < box.max_scroll_y:
        await pilot.press("pagedown")
        await pilot.pause()
        seen.append(screen_text(pilot.app))
    return "\n".join(seen)


async def check_help(pilot, key: str) -> None:
    screen = pilot.app.screen
    await pilot.press(key)
    await pilot.pause()
    assert isinstance(pilot.app.screen, KeysHelp)
    text = await read_help(pilot)
    for name, description in expected(screen, pilot.app):
        found = any(f" {name} " in f" {ln} " and description in ln for ln in text.splitlines())
        assert found, (type(screen).__name__, name, description, text)
    await pilot.press("escape")
    await pilot.pause()
    assert pilot.app.screen is screen


@pytest.mark.anyio
@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_keys_help_on_every_screen(tmp_path, size):
    runs = tmp_path / "runs"
    write_run(runs / "a", steps=6)
    write_run(runs / "b", steps=6, dtype="fp16")
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", runs, live_hardware=False, poll_s=3600)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for key in ("question_mark", "f1"):
            await check_help(pilot, key)  # setup
        await pilot.press("f3")
        await pilot.pause()
        for key in ("question_mark", "f1"):
            await check_help(pilot, key)  # runs list
        await pilot.press("space", "space", "c")
        await pilot.pause()
        await check_help(pilot, "question_mark")  # compare
        await pilot.press("escape", "enter")
        await pilot.pause()
        for key in ("question_mark", "f1"):
            await check_help(pilot, key)  # dashboard
