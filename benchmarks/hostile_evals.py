"""The fault suite's hostile cases for evaluation (benchmarks/fault_probes.py says how they run): eval splits that
do not exist or cannot be given are refused in one line naming the key; an eval of no rows, a task whose every
answer is the same, a reward that returns NaN or raises on eval, and a row with no reference give finite numbers
whose Wilson intervals hold them (engine/run/evaluation.py, engine/prompts/data.py)."""

from __future__ import annotations

import math
from pathlib import Path

from .fault_cases import Case, train
from .fault_probes import Probe

CATEGORY = "evals"
PLAIN = ("--set", "train.steps=1")


def _finite_with_bounds(values: dict) -> str | None:
    """None when every eval/* value is finite and inside its own Wilson interval, within [0, 1]."""
    from ..contract import metrics

    metrics.check_row(values)
    for name, value in values.items():
        if not (isinstance(value, float) and math.isfinite(value) and 0.0 <= value <= 1.0):
            return f"{name} = {value!r}"
        if not name.endswith(("_lo", "_hi")):
            lo, hi = (values[bound] for bound in metrics.interval(name))
            if not lo <= value <= hi:
                return f"{name} = {value} outside its interval [{lo}, {hi}]"
    return None


def no_eval_rows(tmp: Path) -> str | None:
    """A split of 0 rows: no eval/* at all (not a division by zero, not a 0% accuracy)."""
    from ..engine.run import evaluation

    out = evaluation.eval_metrics([0.0] * len(evaluation.TALLY), 0, 4)
    return None if out == {} else f"wrote {out}"


def every_answer_equal(tmp: Path) -> str | None:
    """Every reference '7' and every sample '7': accuracy 1 with its upper bound exactly 1, maj@k right."""
    from ..engine.run import evaluation
    from ..rewards import builtin

    k, prompts = 4, 5
    sums = evaluation.tally(
        [2.0] * (k * prompts), ["<answer>7</answer>"] * (k * prompts), k, builtin.DEFAULT, ["7"] * 5
    )
    out = evaluation.eval_metrics(sums, prompts, k)
    if (out["eval/accuracy"], out["eval/accuracy_hi"], out["eval/maj_at_k"]) != (1.0, 1.0, 1.0):
        return f"wrote {out}"
    return _finite_with_bounds(out)


def nan_reward_on_eval(tmp: Path) -> str | None:
    """A reward that scores NaN counts the sample wrong: finite accuracies, no NaN in the row."""
    from ..engine.run import evaluation
    from ..rewards import builtin

    sums = evaluation.tally(
        [math.nan, 2.0, math.nan, math.nan], ["7", "<answer>7</answer>", "x", "8"], 2, builtin.DEFAULT
    )
    out = evaluation.eval_metrics(sums, 2, 2)
    if out["eval/accuracy"] != 0.25:
        return f"accuracy {out['eval/accuracy']}, expected 0.25 (one right sample of four)"
    return _finite_with_bounds(out)


def no_reference(tmp: Path) -> str | None:
    """Rows without an answer column: the answer alone is never right, nothing raises."""
    from ..engine.run import evaluation
    from ..rewards import builtin

    out = evaluation.eval_metrics(evaluation.tally([0.0, 0.0], ["7", "8"], 1, builtin.DEFAULT, [None, None]), 2, 1)
    return _finite_with_bounds(out) or (None if out["eval/answer_accuracy"] == 0.0 else f"wrote {out}")


def odd_texts(tmp: Path) -> str | None:
    """Replies no number parser expects (a lone minus, '.', digits beyond a float, non-ASCII digits) score wrong."""
    from ..engine.run import evaluation
    from ..rewards import builtin

    texts = ["-", ".", "9" * 400, "٧", "7e3", "\x00", ""]
    right = [evaluation.answer_right(text, "7", builtin.DEFAULT) for text in texts]
    return None if not any(right) else f"scored right: {[t[:20] for t, r in zip(texts, right) if r]}"


def cases() -> list:
    general = "data.general_size"
    return [
        Case(
            CATEGORY,
            "an eval split that does not exist",
            train("tiny-arith", *PLAIN, "--set", "data.eval_split=general"),
        ),
        Case(CATEGORY, "a generalisation split the task has not", train("tool-calc", *PLAIN, "--set", f"{general}=5")),
        Case(
            CATEGORY,
            "a generalisation split larger than the task's",
            train("chat-arith", *PLAIN, "--set", f"{general}=883"),
        ),
        Case(CATEGORY, "a negative generalisation split", train("tiny-arith", *PLAIN, "--set", f"{general}=-2")),
        Case(CATEGORY, "every row held out", train("chat-arith", *PLAIN, "--set", "data.eval_size=441")),
        Probe(CATEGORY, "an eval of 0 rows", no_eval_rows),
        Probe(CATEGORY, "a task with every answer equal", every_answer_equal),
        Probe(CATEGORY, "a reward returning NaN on eval", nan_reward_on_eval),
        Probe(CATEGORY, "rows with no reference", no_reference),
        Probe(CATEGORY, "replies no number parser expects", odd_texts),
    ]
