"""Where the bundled data lives, in a source checkout and after `pip install` alike; and `user_cache()`, where
the studio keeps what it makes once (converted models, the measured matmul peak)."""

from __future__ import annotations

import os
from pathlib import Path

from .. import presets

PRESETS = Path(presets.__file__).resolve().parent
RECIPES = PRESETS / "recipes"
MODELS = PRESETS / "models"
CARDS = PRESETS / "cards"
DEFAULT_RECIPE = "tiny-arith"  # what the studio, `grpo-studio train` and the benchmarks use without a recipe


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.toml"))


def recipe(name: str) -> Path | None:
    path = RECIPES / f"{name}.toml"
    return path if path.is_file() else None


def bundled_model(name: str) -> Path | None:
    path = MODELS / name
    return path if (path / "config.json").is_file() else None


def user_cache() -> Path:
    """$GRPO_STUDIO_CACHE, by default ~/.cache/grpo-studio."""
    return Path(os.environ.get("GRPO_STUDIO_CACHE") or "~/.cache/grpo-studio").expanduser()
