"""Prompts: the built-in arithmetic task (more sources: see the rewards-and-data issue).

`load_rows` returns dataset rows as dicts (TRL-style columns); `PromptStream` walks them in a
seeded order, one epoch after another, with a cursor that checkpoints can save and restore.
"""

from __future__ import annotations

import random

from engine import arith
from engine.config import ConfigError, DataConfig


def load_rows(data: DataConfig, split: str) -> list[dict]:
    if data.source == "builtin:arith":
        return arith.rows(split, data.eval_size)
    raise ConfigError(f"config error: data.source = {data.source!r}: allowed: builtin:arith")


def prompt_text(row: dict, data: DataConfig) -> str:
    return str(row[data.prompt_column])


class PromptStream:
    """Seeded shuffled epochs over `rows`; `state()`/`restore()` make resume exact."""

    def __init__(self, rows: list[dict], seed: int):
        self.rows, self.seed = rows, seed
        self.epoch, self.index = 0, 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[dict]:
        batch = []
        while len(batch) < k:
            if self.index >= len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            batch.append(self.rows[self._order[self.index]])
            self.index += 1
        return batch

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, state: dict) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._shuffled(self.epoch)
