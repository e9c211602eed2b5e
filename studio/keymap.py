"""User keymap: every binding has an id (e.g. `setup.launch`, `dashboard.stop`); a TOML file
remaps them. Looked up at $GRPO_STUDIO_KEYMAP, else ~/.config/grpo-studio/keymap.toml:

    [keys]
    "setup.launch" = "f5"
    "dashboard.stop" = "ctrl+x"
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path


def keymap_path() -> Path:
    env = os.environ.get("GRPO_STUDIO_KEYMAP")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME", "~/.config")).expanduser()
    return base / "grpo-studio" / "keymap.toml"


def load_keymap(path: Path | None = None) -> tuple[dict[str, str], str]:
    """(binding id -> keys, error line or ""). A missing file is an empty keymap."""
    path = path or keymap_path()
    if not path.is_file():
        return {}, ""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        return {}, f"keymap error: {path}: {err}"
    keys = data.get("keys", data)
    bad = [k for k, v in keys.items() if not isinstance(v, str)]
    if bad:
        return {}, f'keymap error: {path}: {bad[0]} must be a string like "ctrl+x"'
    return dict(keys), ""
