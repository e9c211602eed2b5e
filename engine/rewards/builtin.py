"""Built-in reward functions (TRL signature)."""

from __future__ import annotations

import re

from engine.arith import extract_answer

TAGGED = re.compile(r"^\s*<answer>\s*-?\d+\s*</answer>\s*$")


def correctness(prompts, completions, answer, **_) -> list[float]:
    """+2.0 when the answer in <answer>…</answer> equals the reference, else 0.0."""
    return [2.0 if extract_answer(c) == str(a).strip() else 0.0 for c, a in zip(completions, answer)]


def format(prompts, completions, **_) -> list[float]:  # noqa: A001 - the reward's public name
    """+0.5 when the completion is exactly one <answer>N</answer>, else 0.0."""
    return [0.5 if TAGGED.match(c) else 0.0 for c in completions]


REGISTRY = {"correctness": correctness, "format": format}
