"""The built-in task: two-number integer addition with the answer in tags.

    prompt      "23+45="
    completion  "<answer>68</answer>"   (then EOS)

Seeded, with a held-out eval split that never overlaps the training pairs. Pure python.
"""

from __future__ import annotations

import random
import re

MAX_OPERAND = 49  # a, b in [0, 49]: 2,500 pairs, answers 0..98
EVAL_SEED = 1234
ANSWER_RE = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def all_pairs() -> list[tuple[int, int]]:
    return [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]


def split_pairs(eval_size: int = 200) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, eval): a fixed random `eval_size` pairs are held out for evaluation."""
    pairs = all_pairs()
    held = set(random.Random(EVAL_SEED).sample(range(len(pairs)), eval_size))
    train = [p for i, p in enumerate(pairs) if i not in held]
    evals = [p for i, p in enumerate(pairs) if i in held]
    return train, evals


def prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def completion(answer: int) -> str:
    return f"<answer>{answer}</answer>"


def rows(split: str, eval_size: int = 200) -> list[dict]:
    """Dataset rows with TRL-style columns: `prompt` (text) and `answer` (string)."""
    train, evals = split_pairs(eval_size)
    pairs = train if split == "train" else evals
    return [{"prompt": prompt(a, b), "answer": str(a + b)} for a, b in pairs]


def extract_answer(text: str) -> str | None:
    match = ANSWER_RE.search(text)
    return match.group(1) if match else None
