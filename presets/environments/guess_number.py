"""Guess the number: an example environment in the turn shape (it answers the model's text, no tools).

`reset(**row)` reads the row's `secret` (1..50) and returns the episode's first messages; `step(text)` reads
the last integer in the model's reply and answers "Higher." or "Lower." until the model finds it. The reward
is 1.0 on the step that finds the number and None on every other step: an episode that never finds it
(it runs out of turns or tokens) gets no reward from the environment, which the engine scores as 0.0 for a
turn-shape environment. Copy this file to make a game, a simulator or a grader of your own.

    env.environment = "guess_number"     data.source = "builtin:guess-number"
"""

from __future__ import annotations

import re

LOW, HIGH = 1, 50
RULES = f"You are playing a guessing game. Guess the secret number between {LOW} and {HIGH}. Reply with just a number."
ASK = f"I am thinking of a number between {LOW} and {HIGH}. Guess it: reply with just a number."
INVALID = f"Reply with just a number between {LOW} and {HIGH}."


class GuessNumber:
    """One game: the secret and the guesses so far."""

    def __init__(self):
        self.secret = 0
        self.guesses = 0

    def reset(self, **row) -> list[dict]:
        """A new game with the row's `secret`: the first messages to the model."""
        self.secret = int(row["secret"])
        self.guesses = 0
        return [{"role": "system", "content": RULES}, {"role": "user", "content": ASK}]

    def step(self, text: str) -> tuple[list[dict], bool, float | None, dict]:
        """The model's reply -> (messages to the model, done, reward or None, info)."""
        numbers = re.findall(r"-?\d+", text)
        guess = int(numbers[-1]) if numbers else None
        if guess is None or not LOW <= guess <= HIGH:
            return [{"role": "user", "content": INVALID}], False, None, {"valid": False}
        self.guesses += 1
        if guess == self.secret:
            return [], True, 1.0, {"valid": True, "guesses": self.guesses}
        hint = "Higher." if guess < self.secret else "Lower."
        return [{"role": "user", "content": hint}], False, None, {"valid": True, "guesses": self.guesses}
