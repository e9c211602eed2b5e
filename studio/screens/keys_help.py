"""The keys help (`?` / F1): every key of the screen below and of the app, read from their live bindings
(keymap applied), so the list never drifts from the real keys. Scrolls when it does not fit; escape closes."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen
from textual.widgets import Static

KEY_NAMES = {
    "question_mark": "?",
    "escape": "esc",
    "slash": "/",
    "left_square_bracket": "[",
    "right_square_bracket": "]",
}


def key_name(key: str) -> str:
    return KEY_NAMES.get(key, key)


def binding_rows(node: DOMNode, keymap: dict[str, str], skip=None) -> list[tuple[str, str]]:
    """(keys, description) per binding of `node`, the keymap applied; keys bound to one action share a row.
    `skip(binding)`: leave that binding out (another section lists it)."""
    bindings = node._bindings.copy()
    bindings.apply_keymap(keymap)
    rows: dict[tuple[str, str], list[str]] = {}
    for key, binding in bindings:
        if not binding.system and not (skip and skip(binding)):
            rows.setdefault((binding.action, binding.description or binding.action), []).append(key_name(key))
    return [(" / ".join(keys), description) for (_, description), keys in rows.items()]


def keys_table(sections: list[tuple[str, list[tuple[str, str]]]]) -> Table:
    table = Table(box=None, show_header=False, padding=(0, 1))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for title, rows in sections:
        table.add_row(f"[u]{title}[/]", "")
        for keys, description in rows:
            table.add_row(keys, description)
    return table


class KeysHelp(ModalScreen[None]):
    BINDINGS = [Binding("escape", "close", "Close", id="help.close")]

    def __init__(self, sections: list[tuple[str, list[tuple[str, str]]]]):
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        box = VerticalScroll(id="keys-help")
        box.border_title = "keys"
        box.border_subtitle = "↑↓ scroll · esc close"
        with box:
            yield Static(keys_table(self.sections))

    def on_mount(self) -> None:
        self.query_one("#keys-help").focus()

    def action_close(self) -> None:
        self.dismiss(None)
