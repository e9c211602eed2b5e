"""A lookup tool over a table the model cannot know: an example environment in TRL's `environment_factory` shape.

The table is ~200 fictional people with invented names, birth years and home towns, generated from a fixed
seed (`people()`), so a model can answer the built-in task builtin:lookup only by calling the tool. Copy this
file and put your own data behind the tool to make an environment of your own.

    env.environment = "lookup"
"""

from __future__ import annotations

import random

SEED = 1847
COUNT = 200
ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "k", "l", "m", "n", "p", "qu", "r", "s", "t", "th", "v", "z", "zh"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
CODAS = ["", "", "l", "n", "r", "s", "th", "x", "m", "ck"]
TOWN_ENDS = ["moor", "wick", "ford", "haven", "dale", "mere", "stead", "holm"]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables)).title()


def people(seed: int = SEED, count: int = COUNT) -> list[dict]:
    """The table: [{"name", "year", "town"}], the same on every call (a fixed seed), names unique. (Another
    seed gives other invented people: the built-in warm-up's demonstrations use them.)"""
    rng = random.Random(seed)
    towns = sorted({_word(rng, rng.randint(1, 2)) + rng.choice(TOWN_ENDS) for _ in range(40)})
    rows, seen = [], set()
    while len(rows) < count:
        name = f"{_word(rng, 2)} {_word(rng, rng.randint(1, 2))}"
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        rows.append({"name": name, "year": rng.randint(1800, 1999), "town": rng.choice(towns)})
    return rows


def describe(person: dict) -> str:
    """What the tool answers about one person."""
    return f"{person['name']}: born {person['year']} in {person['town']}"


def _key(name: str) -> str:
    return " ".join(name.split()).lower()


class Lookup:
    """One episode's view of the table."""

    def __init__(self):
        self.table = {_key(p["name"]): p for p in people()}
        self.calls = 0

    def reset(self, **row) -> None:
        """A new episode: nothing is added to the prompt."""
        self.calls = 0

    def lookup(self, name: str) -> str:
        """Look up a person's birth year and home town by their full name.

        Args:
            name: The person's full name, e.g. "Zorvath Quell".
        """
        self.calls += 1
        person = self.table.get(_key(name))
        if person is None:
            raise ValueError(f"no person named {name.strip()!r}")
        return describe(person)
