"""Where the bundled data lives, in a source checkout and after `pip install` alike."""

from __future__ import annotations

from pathlib import Path

from grpo_studio import presets

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
