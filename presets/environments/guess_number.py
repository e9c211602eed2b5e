"""Guess the number: an example environment in the turn shape (it answers the model's text, no tools).

`reset(**row)` reads the row's `secret` (1..50) and returns the episode's first messages; `step(text)` reads
the last integer in the model's reply and answers "Higher." or "Lower." until the model finds it. The reward
is 1.0 on the step that finds the number and None on every other step: an episode that never finds it
(it runs out of turns or tokens) gets no reward from the environment, which the engine scores as 0.0 for a
turn-shape environment. Copy this file to make a game, a simulator or a grader of your own.

Each guess's info carries `metrics = {"range_halving": bits}`: log2 of the secrets still possible before the guess
over those possible after its answer (1 after the finding guess). A guess at the middle of the range halves it
(about 1 bit), a guess the earlier answers already ruled out narrows nothing (0 bits); the engine logs the mean over
a step's guesses as env/step/range_halving. Binary search finds any of the 50 in at most 6 guesses.

    env.environment = "guess_number"     data.source = "builtin:guess-number"
"""

from __future__ import annotations

import math
import re

LOW, HIGH = 1, 50
RULES = f"You are playing a guessing game. Guess the secret number between {LOW} and {HIGH}. Reply with just a number."
ASK = f"I am thinking of a number between {LOW} and {HIGH}. Guess it: reply with just a number."
INVALID = f"Reply with just a number between {LOW} and {HIGH}."


class GuessNumber:
    """One game: the secret, the guesses so far and the range [low, high] the answers so far leave possible."""

    def __init__(self):
        self.secret = 0
        self.guesses = 0
        self.low, self.high = LOW, HIGH

    def reset(self, **row) -> list[dict]:
        """A new game with the row's `secret`: the first messages to the model."""
        self.secret = int(row["secret"])
        self.guesses = 0
        self.low, self.high = LOW, HIGH
        return [{"role": "system", "content": RULES}, {"role": "user", "content": ASK}]

    def step(self, text: str) -> tuple[list[dict], bool, float | None, dict]:
        """The model's reply -> (messages to the model, done, reward or None, info)."""
        numbers = re.findall(r"-?\d+", text)
        guess = int(numbers[-1]) if numbers else None
        if guess is None or not LOW <= guess <= HIGH:
            return [{"role": "user", "content": INVALID}], False, None, {"valid": False}
        self.guesses += 1
        before = self.high - self.low + 1
        if guess == self.secret:
            self.low = self.high = guess
        elif guess < self.secret:
            self.low = max(self.low, guess + 1)
        else:
            self.high = min(self.high, guess - 1)
        bits = math.log2(before / (self.high - self.low + 1))
        info = {"valid": True, "guesses": self.guesses, "metrics": {"range_halving": bits}}
        if guess == self.secret:
            return [], True, 1.0, info
        hint = "Higher." if guess < self.secret else "Lower."
        return [{"role": "user", "content": hint}], False, None, info
