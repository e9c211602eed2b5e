"""Typed run config: TOML load/save, dotted `--set` overrides, one-line validation errors. The keys
themselves (sections, types, defaults, allowed values, help) are declared in config_schema.py and
config_training.py with opt() and the bounds of config_bounds.py, one key's conversion and check live in
config_keys.py, the rules across keys in config_rules.py; all are re-exported here, so `config.X` names every
part of the config.

Pure python (no torch), so the studio and the VRAM planner can import it.

Every user mistake raises `UserError` (contract/errors.py) whose message is one line naming
the key, the value and what is allowed. The CLI prints it and exits with code 2.
"""

from __future__ import annotations

from pathlib import Path

import tomli_w

from . import algorithms, bundled
from .config_bounds import (  # noqa: F401 - the bounds, re-exported
    ALGOS,
    AUTO,
    DTYPES,
    LOSS_TYPES,
    MAX_GENERATIONS,
    MAX_PROMPTS,
    MAX_SECONDS,
    MAX_SEQUENCES,
    MAX_STEPS,
    MAX_TOKENS,
    MAX_UPDATES,
    TRACKERS,
    opt,
)
from .config_keys import (  # noqa: F401 - one key at a time, re-exported
    MAX_NESTING,
    SECTIONS,
    KeyInfo,
    all_keys,
    key_info,
    set_key,
    toml_loads,
)
from .config_rules import check_processes, validate  # noqa: F401 - the rules, re-exported
from .config_schema import (  # noqa: F401 - the keys, re-exported
    AlertsConfig,
    Config,
    DataConfig,
    EnvConfig,
    PrecisionConfig,
    ReportConfig,
    RewardsConfig,
    WarmupConfig,
)
from .config_training import (  # noqa: F401 - the keys, re-exported
    AlgoConfig,
    ModelConfig,
    RolloutConfig,
    TrainConfig,
)
from .errors import UserError, did_you_mean, user_path


def check_tables(data: dict, source: str = "") -> None:
    """A recipe's top level holds only known [section] tables."""
    where = f" in {source}" if source else ""
    for section, body in data.items():
        if section not in SECTIONS:
            raise UserError(f"unknown section {section!r}{did_you_mean(section, SECTIONS)}{where}")
        if not isinstance(body, dict):
            raise UserError(f"must be a [{section}] table of keys{where}", key=section, value=body)


def apply_dict(cfg: Config, data: dict, source: str = "") -> None:
    check_tables(data, source)
    for section, body in data.items():
        for name, value in body.items():
            set_key(cfg, f"{section}.{name}", value)


def parse_override(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set {text!r}: expected section.key=value")
    return key.strip(), value.strip()


def choose_algorithm(cfg: Config, name: str) -> None:
    """algo.name = `name` and its preset's defaults (contract/algorithms.py), over what `cfg` held: the one place
    a preset is applied. Explicit keys come after it (a recipe's, --set, the studio's form)."""
    set_key(cfg, "algo.name", name)
    for key, value in algorithms.defaults(name).items():
        set_key(cfg, key, value)


def load(source: str | None = None, overrides: list[str] = ()) -> Config:
    """Resolve a recipe (preset name or TOML path) plus `--set` overrides into a validated Config.
    The algorithm preset fills its defaults before the explicit keys."""
    data = read_recipe(source) if source else {}
    check_tables(data, source or "")
    cfg = Config()
    algo_name = data.get("algo", {}).get("name", "grpo")
    parsed = [parse_override(o) for o in overrides]
    for key, value in parsed:
        if key == "algo.name":
            algo_name = value
    choose_algorithm(cfg, algo_name)
    apply_dict(cfg, data, source or "")
    for key, value in parsed:
        set_key(cfg, key, value, from_text=True)
    validate(cfg)
    return cfg


def read_recipe(source: str) -> dict:
    """The TOML table of a preset name or a .toml path; unreadable, not UTF-8 or not TOML: one line."""
    with user_path("recipe", source):
        path = Path(source)
        if path.suffix != ".toml":
            preset = bundled.recipe(source)
            if preset is None:
                names = bundled.recipe_names()
                raise UserError(
                    f"recipe {source!r} not found: not a .toml file or a preset "
                    f"(presets: {', '.join(names)}){did_you_mean(source, names)}"
                )
            path = preset
        if not path.is_file():
            raise UserError(f"recipe file {str(path)!r} does not exist")
        text = path.read_bytes().decode("utf-8")
    try:
        return toml_loads(text)
    except ValueError as err:  # TOMLDecodeError, or an integer of more than 4300 digits
        raise UserError(f"{path}: invalid TOML: {err}") from None


def to_toml(cfg: Config) -> str:
    return tomli_w.dumps(cfg.to_dict())


def changes(old: Config, new: Config) -> dict[str, tuple]:
    """The keys whose values differ between two configs: {key: (old value, new value)}, in schema order."""
    out = {}
    for key in all_keys():
        section, _, name = key.partition(".")
        a, b = getattr(getattr(old, section), name), getattr(getattr(new, section), name)
        if a != b:
            out[key] = (a, b)
    return out


def save(cfg: Config, path: Path) -> None:
    from .rundir import atomic_write_text

    atomic_write_text(path, to_toml(cfg))
