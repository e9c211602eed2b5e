"""The built-in task: two-number integer addition with the answer in tags.

    prompt      "23+45="
    completion  "<answer>68</answer>"   (then EOS)

Seeded, with a held-out eval split disjoint from training by construction: a held-out a+b takes its mirror b+a
out of training too. (The held-out pairs are the ones scripts/make_tiny_model.py never pretrained on; that
pretraining predates the mirror rule and saw some of their mirrors.) The generalisation split asks what
training never shows: "a + b =" spaced out, or an operand from 50 to 99. Pure python.
"""

from __future__ import annotations

import random
import re

MAX_OPERAND = 49  # a, b in [0, 49]: 2,500 pairs, answers 0..98
GENERAL_MAX = 99  # the generalisation split's operands: up to 99, answers up to 198
EVAL_SEED = 1234
GENERAL_SEED = 4321
ANSWER_RE = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def all_pairs() -> list[tuple[int, int]]:
    return [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]


def split_pairs(eval_size: int = 200) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, eval): a fixed random `eval_size` pairs are held out for evaluation, and no pair whose mirror is
    held out is trained on."""
    pairs = all_pairs()
    evals = [pairs[i] for i in sorted(random.Random(EVAL_SEED).sample(range(len(pairs)), eval_size))]
    held = {frozenset(p) for p in evals}
    return [p for p in pairs if frozenset(p) not in held], evals


def general_pairs() -> list[tuple[str, int]]:
    """The generalisation split's (prompt, answer) pool in a seeded order, alternating a phrasing training never
    shows ("a + b =", operands 0..49) and a range it never shows ("a+b=", an operand from 50 to 99)."""
    rng = random.Random(GENERAL_SEED)
    spaced = [(f"{a} + {b} =", a + b) for a, b in all_pairs()]
    wide = [(prompt(a, b), a + b) for a in range(GENERAL_MAX + 1) for b in range(GENERAL_MAX + 1) if max(a, b) > 49]
    rng.shuffle(spaced), rng.shuffle(wide)
    return [row for two in zip(spaced, wide) for row in two]


def prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def completion(answer: int) -> str:
    return f"<answer>{answer}</answer>"


def rows(split: str, eval_size: int = 200) -> list[dict]:
    """Dataset rows with TRL-style columns: `prompt` (text) and `answer` (string); split 'train', 'eval', or
    'general' (`eval_size` rows of the generalisation split)."""
    if split == "general":
        return [{"prompt": text, "answer": str(answer)} for text, answer in general_pairs()[:eval_size]]
    train, evals = split_pairs(eval_size)
    pairs = train if split == "train" else evals
    return [{"prompt": prompt(a, b), "answer": str(a + b)} for a, b in pairs]


def extract_answer(text: str) -> str | None:
    match = ANSWER_RE.search(text)
    return match.group(1) if match else None
