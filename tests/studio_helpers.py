"""Helpers for the studio's Pilot tests: keyboard-only field editing and waiting on real files."""

from __future__ import annotations

import time


async def focus_field(pilot, widget_id: str, limit: int = 60) -> None:
    """Tab through the form until `widget_id` has focus (keyboard only, like a user)."""
    for _ in range(limit):
        if pilot.app.focused is not None and pilot.app.focused.id == widget_id:
            return
        await pilot.press("tab")
    raise AssertionError(f"never reached #{widget_id} with tab; focused: {pilot.app.focused}")


async def type_into(pilot, widget_id: str, text: str) -> None:
    await focus_field(pilot, widget_id)
    await pilot.press("end", *["backspace"] * 40, *list(text))
    await pilot.pause()


async def wait_until(pilot, predicate, timeout: float = 240.0, step: float = 0.25) -> None:
    """Let the app run until predicate() holds (a deadline for a hung test, not a speed assert)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout:.0f}s")
        await pilot.pause(step)


def tiny_model_name(request) -> str:
    """The bundled tiny model (kept as a function so a test can point it elsewhere)."""
    return "tiny-arith"


import pytest  # noqa: E402


@pytest.fixture
def anyio_backend():
    """Pilot tests run on asyncio through anyio's pytest plugin."""
    return "asyncio"


def visible_text(widget) -> str:
    """The characters a widget currently shows on screen, one line per row."""
    from textual.geometry import Region

    strips = widget.render_lines(Region(0, 0, widget.size.width, widget.size.height))
    return "\n".join(strip.text.rstrip() for strip in strips)


def screen_text(app) -> str:
    """The characters the app's top screen shows, one line per terminal row."""
    return "\n".join(strip.text.rstrip() for strip in app.screen._compositor.render_strips())
