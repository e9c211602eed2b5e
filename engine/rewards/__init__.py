"""Reward functions in TRL's signature: f(prompts, completions, **columns) -> list[float | None].

`build(names)` resolves builtin names; `score(...)` calls each function and returns an [N, F]
matrix with NaN for None ("not applicable", excluded like TRL's nansum/nanmean).
"""

from __future__ import annotations

import math
from typing import Callable

from engine.config import ConfigError
from engine.rewards import builtin

RewardFn = Callable[..., list]


def build(names: list[str]) -> list[tuple[str, RewardFn]]:
    funcs = []
    for name in names:
        fn = builtin.REGISTRY.get(name)
        if fn is None:
            allowed = ", ".join(sorted(builtin.REGISTRY))
            raise ConfigError(f"config error: rewards.funcs = {name!r}: unknown reward; allowed: {allowed} "
                              f"or 'file.py:function'")
        funcs.append((name, fn))
    return funcs


def score(funcs: list[tuple[str, RewardFn]], prompts: list[str], completions: list[str],
          columns: dict[str, list], on_error=None) -> list[list[float]]:
    """[N][F] rewards; a function that fails yields NaN for its column and reports via on_error."""
    table = [[math.nan] * len(funcs) for _ in completions]
    for j, (name, fn) in enumerate(funcs):
        try:
            values = fn(prompts=prompts, completions=completions, **columns)
        except Exception as err:  # a user's reward must never stop training
            if on_error:
                on_error(name, f"{type(err).__name__}: {err}", None)
            continue
        for i, value in enumerate(values):
            if value is not None:
                table[i][j] = float(value)
    return table
