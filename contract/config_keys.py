"""One key at a time: the key table (sections, all_keys, key_info), converting a value to its key's type and
checking it against the key's bounds (set_key), and TOML text read with its nesting bounded. The keys
themselves are declared in config_schema.py and config_training.py; config.py loads whole recipes with these.

Pure python (no torch).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from typing import Any

from .config_bounds import AUTO
from .config_schema import Config
from .errors import UserError, did_you_mean, show_choices

MAX_NESTING = 8  # TOML tables and arrays inside each other: a recipe needs 3 ([section], key, list)


def toml_loads(text: str) -> dict:
    """tomllib.loads with the nesting bounded: deeper than MAX_NESTING levels raises ValueError, as does
    what tomllib itself cannot parse (a RecursionError, thousands of lines of it, for a deep enough file)."""
    try:
        data = tomllib.loads(text)
    except RecursionError:
        data = None
    stack = [(data, 1)] if data is not None else []
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            data = None
            break
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    if data is None:
        raise ValueError(f"tables and arrays nested more than {MAX_NESTING} levels deep")
    return data


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _section_fields(section: str) -> dict[str, dataclasses.Field]:
    cls = {f.name: f for f in dataclasses.fields(Config)}[section].default_factory
    return {f.name: f for f in dataclasses.fields(cls)}


def all_keys() -> list[str]:
    return [f"{s}.{k}" for s in SECTIONS for k in _section_fields(s)]


@dataclass(frozen=True)
class KeyInfo:
    """What a user may know about one key: `grpo-studio config --keys` and the setup form's tooltips."""

    key: str
    type: str  # bool | int | float | str | list
    default: Any
    choices: tuple | None
    lo: float | None
    hi: float | None
    lo_open: bool
    help: str
    auto: bool = False  # also takes the word "auto"
    item: str | None = None  # a list's item type (str | float); the bounds apply to each item

    def allowed(self) -> str:
        """The allowed values as the error messages word them: 'fp32, bf16, fp16, fp8', '>= 0', '> 0, <= 1'."""
        if self.choices is not None:
            return show_choices(self.choices)
        bounds = ["auto"] if self.auto else []
        if self.lo is not None:
            bounds.append(_lower(self.lo, self.lo_open))
        if self.hi is not None:
            bounds.append(_upper(self.hi))
        return ", ".join(bounds)


def key_info() -> list[KeyInfo]:
    """Every key in file order, with its type, default, allowed values and help."""
    defaults = Config()
    out = []
    for section in SECTIONS:
        for name, f in _section_fields(section).items():
            default = getattr(getattr(defaults, section), name)
            m = f.metadata
            kind = m["auto"] if m.get("auto") else type(default)
            out.append(
                KeyInfo(
                    f"{section}.{name}",
                    kind.__name__,
                    default,
                    tuple(m["choices"]) if m.get("choices") is not None else None,
                    m.get("lo"),
                    m.get("hi"),
                    bool(m.get("lo_open")),
                    m.get("help", ""),
                    bool(m.get("auto")),
                    m["item"].__name__ if m.get("item") else None,
                )
            )
    return out


def _coerce(key: str, value: Any, default: Any, from_text: bool) -> Any:
    """Convert `value` to the type of `default`; `from_text` is True for --set strings."""
    kind = type(default)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if from_text and str(value).lower() in ("true", "false", "1", "0", "yes", "no"):
            return str(value).lower() in ("true", "1", "yes")
        raise UserError("expected true or false", key=key, value=value)
    if kind is int:
        if isinstance(value, bool):
            raise UserError("expected an integer", key=key, value=value)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if from_text:
            try:
                return int(str(value).replace("_", ""))
            except ValueError:
                pass
        raise UserError("expected an integer", key=key, value=value)
    if kind is float:
        if isinstance(value, bool):
            raise UserError("expected a number", key=key, value=value)
        if isinstance(value, (int, float)):
            try:
                return float(value)
            except OverflowError:  # an int beyond the float range
                raise UserError("must be a finite number", key=key, value=value) from None
        if from_text:
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError("expected a number", key=key, value=value)
    if not isinstance(value, str):
        raise UserError("expected a string", key=key, value=value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: bytes from the command line that are not UTF-8
        raise UserError("not valid UTF-8 text", key=key, value=value) from None
    return value


def _coerce_list(key: str, value: Any, meta: dict, from_text: bool) -> list:
    """A list whose items are each coerced and checked like a key of type meta["item"] (str or float) with
    the key's bounds, named `key[i]` in a message; `from_text` accepts --set's '["a", "b"]' and 'a, b' forms."""
    items_from_text = False
    if from_text and not isinstance(value, list):
        text = str(value).strip()
        if text.startswith("["):
            try:
                value = toml_loads(f"v = {text}")["v"]
            except ValueError:  # TOMLDecodeError too
                raise UserError('expected a list like ["a", "b"]', key=key, value=text) from None
        else:
            value, items_from_text = [part.strip() for part in text.split(",") if part.strip()], True
    if not isinstance(value, list):
        raise UserError("expected a list", key=key, value=value)
    out = []
    for i, element in enumerate(value):
        converted = _coerce(f"{key}[{i}]", element, meta["item"](), items_from_text)
        _check(f"{key}[{i}]", converted, meta)
        out.append(converted)
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _lower(lo: float, lo_open: bool) -> str:
    return f"{'>' if lo_open else '>='} {_num(lo)}"


def _upper(hi: float) -> str:
    return f"<= {_num(hi)}"


def _check(key: str, value: Any, meta: dict) -> None:
    if isinstance(value, float) and not math.isfinite(value):  # NaN slips past every comparison below
        raise UserError("must be a finite number", key=key, value=value)
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise UserError(key=key, value=value, allowed=choices)
    lo, hi = meta.get("lo"), meta.get("hi")
    or_auto = f" or {AUTO}" if meta.get("auto") else ""  # the word such a key takes besides its numbers
    if lo is not None and (value <= lo if meta.get("lo_open") else value < lo):
        raise UserError(f"must be {_lower(lo, meta.get('lo_open'))}{or_auto}", key=key, value=value)
    if hi is not None and value > hi:
        raise UserError(f"must be {_upper(hi)}{or_auto}", key=key, value=value)


def set_key(cfg: Config, key: str, value: Any, from_text: bool = False) -> None:
    """Set a dotted key (e.g. 'train.steps') with conversion and validation."""
    section, _, name = key.partition(".")
    fields = _section_fields(section) if section in SECTIONS else {}
    if name not in fields:
        raise UserError(f"unknown key {key!r}{did_you_mean(key, all_keys())}")
    current, meta = getattr(getattr(cfg, section), name), fields[name].metadata
    if meta.get("auto") and isinstance(value, str) and value.strip().lower() == AUTO:
        setattr(getattr(cfg, section), name, AUTO)
        return
    if isinstance(current, list):
        converted = _coerce_list(key, value, meta, from_text)
    else:
        try:
            converted = _coerce(key, value, meta["auto"]() if meta.get("auto") else current, from_text)
        except UserError as err:
            if not meta.get("auto"):
                raise
            raise UserError(f"expected {AUTO} or {err.why.removeprefix('expected ')}", key=key, value=value) from None
        _check(key, converted, meta)  # a list's bounds are its items' (_coerce_list)
    setattr(getattr(cfg, section), name, converted)
