"""Alert rules: the small grammar of `alerts.rules`, its one-line errors, and the crossing logic.

Pure python (no torch), so `config.validate` refuses a bad rule before anything loads and the studio's
setup form shows the same line. The trainer evaluates the rules on each metrics row (engine/out/alerts.py
delivers the firings). docs/alerts.md is the user's page.

    <metric> <op> <number> [for <N> steps]     op: >  >=  <  <=
    <metric> is nan [for <N> steps]            not a finite number: NaN, ±inf (null in metrics.jsonl)
    defaults                                   the DEFAULT_RULES below

A rule fires when it becomes true (its condition held on N rows in a row) and re-arms when it becomes
false: once per crossing, never on every row of a long excursion. A row without the metric (mismatch/*
off a rollout's first step, eval/accuracy between evaluations) leaves a rule as it was.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from . import metrics
from .errors import UserError, did_you_mean

GRAMMAR = (
    "'<metric> <op> <number> [for <N> steps]' (op: >, >=, <, <=), '<metric> is nan [for <N> steps]', or 'defaults'"
)
DEFAULTS = "defaults"
# The seeds' failure modes (docs/alerts.md says why each threshold).
DEFAULT_RULES = (
    "mismatch/k3 > 1e-3",  # rollout/trainer drift: BF16 vs FP16 (arXiv 2510.26788)
    "entropy < 0.05 for 5 steps",  # entropy collapse: the policy stops exploring
    "completion/truncated_frac > 0.5 for 5 steps",  # completions keep hitting rollout.max_completion_len
    "loss is nan for 3 steps",  # a NaN streak, before train.max_bad_steps ends the run
)
EVENTS = ("finished", "crashed", "stopped", "diverged", "collapsed")  # the run events `alerts.on` may name
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
MAX_FOR = 1_000_000

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_RULE = re.compile(
    rf"^\s*(?P<metric>\S+?)\s*(?:(?P<op>>=|<=|>|<)\s*(?P<value>{_NUMBER})|\s+is\s+(?P<nan>nan))"
    rf"(?:\s+for\s+(?P<n>\d+)\s+steps?)?\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Rule:
    text: str  # as the user wrote it: alerts name their rule by it
    metric: str
    op: str  # one of OPS, or "is nan"
    threshold: float | None
    steps: int = 1  # rows in a row the condition must hold

    def holds(self, value: float) -> bool:
        if self.op == "is nan":
            return not math.isfinite(value)
        return OPS[self.op](value, self.threshold)  # NaN compares false: a NaN row is not "above"


def parse(text: str, key: str = "alerts.rules", reward_funcs: list[str] = ()) -> Rule:
    """One rule, or a UserError naming `key`, the rule and the grammar (an unknown metric: "did you mean")."""
    match = _RULE.match(text)
    if not match:
        raise UserError(f"not an alert rule; write {GRAMMAR}", key=key, value=text)
    name, known = match["metric"], metrics.names(list(reward_funcs))
    if name not in known:
        raise UserError(f"{name!r} is not a metric the trainer writes{did_you_mean(name, known)}", key=key, value=text)
    steps = int(match["n"]) if match["n"] else 1
    if not 1 <= steps <= MAX_FOR:
        raise UserError(f"'for N steps' needs 1 <= N <= {MAX_FOR}", key=key, value=text)
    if match["nan"]:
        return Rule(text.strip(), name, "is nan", None, steps)
    threshold = float(match["value"])
    if not math.isfinite(threshold):
        raise UserError("the threshold must be a finite number", key=key, value=text)
    return Rule(text.strip(), name, match["op"], threshold, steps)


def parse_all(texts: list[str], reward_funcs: list[str] = ()) -> list[Rule]:
    """alerts.rules as rules, 'defaults' expanded in place; each entry named alerts.rules[i] in an error."""
    rules = []
    for i, text in enumerate(texts):
        key = f"alerts.rules[{i}]"
        if text.strip().lower() == DEFAULTS:
            rules += [parse(default, key, reward_funcs) for default in DEFAULT_RULES]
        else:
            rules.append(parse(text, key, reward_funcs))
    return rules


class Crossings:
    """Which rules fire on each row: a rule fires when its condition has held on `steps` rows in a row, and
    re-arms once it is false again (once per crossing)."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self.streak = [0] * len(rules)
        self.armed = [True] * len(rules)

    def update(self, row: dict) -> list[tuple[Rule, float]]:
        fired = []
        for i, rule in enumerate(self.rules):
            if rule.metric not in row:
                continue
            value = row[rule.metric]
            value = math.nan if value is None else float(value)  # null: a non-finite number written to JSON
            if not rule.holds(value):
                self.streak[i], self.armed[i] = 0, True
                continue
            self.streak[i] += 1
            if self.armed[i] and self.streak[i] >= rule.steps:
                self.armed[i] = False
                fired.append((rule, value))
        return fired
