"""The fault suite's hostile cases for evaluation (benchmarks/fault_probes.py says how they run): eval splits that
do not exist or cannot be given are refused in one line naming the key; an eval of no rows, a task whose every
answer is the same, a reward that returns NaN or raises on eval, and a row with no reference give finite numbers
whose Wilson intervals hold them (engine/run/evaluation.py, engine/prompts/data.py). An explicit eval set
(data.eval_source) that is missing, empty, without a prompt column, a built-in task, a Hub dataset without its
split, or beside a data.eval_size that holds rows out too is one line; so are the Python API's eval_dataset
mistakes (a dict of them, none beside an eval_strategy); a reward that scores no eval completion writes no mean."""

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


def no_eval_reward_scored(tmp: Path) -> str | None:
    """TRL's eval reward over completions some function left unscored (None, NaN): a completion no function
    scored is left out, a function that scored nothing writes no mean (not a 0, not a NaN)."""
    from ..engine.run import evaluation

    nan = math.nan
    sums = [0.0] * len(evaluation.TALLY) + evaluation.reward_sums([[nan, nan], [1.0, nan], [3.0, nan]], [1.0, 2.0])
    out = evaluation.eval_metrics(sums, 1, 3, reward_names=["a", "b"])
    want = {"eval/reward": 2.0, "eval/rewards/a/mean": 2.0}
    got = {name: value for name, value in out.items() if "reward" in name}
    return None if got == want else f"wrote {got}, expected {want}"


def _api_refusal(make, line: str) -> str | None:
    """None when make() raises exactly the one line `line`."""
    from ..contract.errors import UserError

    try:
        make()
    except UserError as err:
        return None if str(err) == line else f"said {str(err)!r}"
    return "accepted"


def api_eval_dataset_dict(tmp: Path) -> str | None:
    from datasets import Dataset

    from .. import GRPOConfig, GRPOTrainer

    prompts = Dataset.from_dict({"prompt": ["1+1=", "2+2="]})
    args = GRPOConfig(str(tmp / "run"), num_generations=2, per_device_train_batch_size=2, eval_strategy="steps")
    return _api_refusal(
        lambda: GRPOTrainer("tiny-arith", _length, args, prompts, {"a": prompts, "b": prompts}),
        "GRPOTrainer error: eval_dataset = 'a dict of 2': grpo-studio evaluates one eval set; pass one Dataset "
        "(e.g. eval_dataset['name'])",
    )


def api_eval_strategy_without_dataset(tmp: Path) -> str | None:
    from datasets import Dataset

    from .. import GRPOConfig, GRPOTrainer

    prompts = Dataset.from_dict({"prompt": ["1+1=", "2+2="]})
    args = GRPOConfig(str(tmp / "run"), num_generations=2, per_device_train_batch_size=2, eval_strategy="steps")
    return _api_refusal(
        lambda: GRPOTrainer("tiny-arith", _length, args, prompts),
        "GRPOTrainer error: eval_dataset = None: eval_strategy = 'steps' evaluates an eval_dataset, and none was "
        "passed; pass one, or set eval_strategy to 'no'",
    )


def _length(completions, **kwargs):
    return [float(len(c)) for c in completions]


def cases() -> list:
    general = "data.general_size"
    source = "data.eval_source"
    rows = '{"prompt": "1+1=", "answer": "2"}\n'
    return [
        Case(
            CATEGORY, "an eval file that is missing", train("tiny-arith", *PLAIN, "--set", f"{source}={{tmp}}/no.jsonl")
        ),
        Case(
            CATEGORY,
            "an eval file that is empty",
            train("tiny-arith", *PLAIN, "--set", f"{source}={{tmp}}/eval.jsonl"),
            files={"eval.jsonl": ""},
        ),
        Case(
            CATEGORY,
            "an eval file without a prompt column",
            train("tiny-arith", *PLAIN, "--set", f"{source}={{tmp}}/eval.jsonl"),
            files={"eval.jsonl": '{"text": "1+1=", "answer": "2"}\n'},
        ),
        Case(
            CATEGORY,
            "an eval source beside an eval size that holds rows out",
            train("tiny-arith", *PLAIN, "--set", f"{source}={{tmp}}/eval.jsonl", "--set", "data.eval_size=10"),
            files={"eval.jsonl": rows},
        ),
        Case(
            CATEGORY,
            "an eval file given an eval split",
            train("tiny-arith", *PLAIN, "--set", f"{source}={{tmp}}/eval.jsonl", "--set", "data.eval_split=test"),
            files={"eval.jsonl": rows},
        ),
        Case(
            CATEGORY,
            "an eval source that is a built-in task",
            train("tiny-arith", *PLAIN, "--set", f"{source}=builtin:arith"),
        ),
        Case(
            CATEGORY, "a Hub eval source without its split", train("tiny-arith", *PLAIN, "--set", f"{source}=org/data")
        ),
        Probe(CATEGORY, "a reward that scores no eval completion", no_eval_reward_scored),
        Probe(CATEGORY, "the API given a dict of eval datasets", api_eval_dataset_dict),
        Probe(CATEGORY, "the API evaluating without an eval_dataset", api_eval_strategy_without_dataset),
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
