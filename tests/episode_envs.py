"""Environments the episode tests load by path (tests/test_episodes.py), one per behaviour under test."""

from __future__ import annotations

import time


class Adder:
    """TRL's environment_factory shape: one tool, and a reward that counts the calls."""

    def reset(self, **row):
        self.calls = []
        return row.get("note")

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first
            b: the second
        """
        self.calls.append((a, b))
        return a + b

    def get_reward(self) -> float:
        return float(len(self.calls))


class Faulty(Adder):
    """Tools that fail: one raises, one hangs."""

    def boom(self, x: int) -> int:
        """Raise.

        Args:
            x: anything
        """
        raise RuntimeError("kaboom")

    def hang(self, x: int) -> int:
        """Sleep past any small timeout.

        Args:
            x: anything
        """
        time.sleep(3)
        return x


class Counter:
    """The turn shape: answers 'more' until `limit` steps, rewarding each step with 0.5."""

    limit = 100

    def reset(self, **row):
        self.steps = []
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.steps.append(text)
        done = len(self.steps) >= self.limit
        return ([] if done else [{"role": "user", "content": "more"}]), done, 0.5, {}


class OneStep(Counter):
    """Ends on its first step without a reward: a one-turn rollout, as plain GRPO's."""

    def step(self, text):
        self.steps.append(text)
        return [], True, None, {}


class BadStep(Counter):
    def step(self, text):
        return "not a tuple"


class Broken:
    """No tools and no step: refused before the first step."""

    def reset(self, **row):
        return None
