"""math_verify (the built-in) and TRL's reward functions by name, with exact scores.

The oracle for `trl.rewards:…` is TRL's own function called directly as TRL documents it
(completions as one assistant message each, a `solution` column)."""

from __future__ import annotations

import pytest

from grpo_studio.contract.config import load
from grpo_studio.contract.errors import UserError
from grpo_studio.rewards import build, builtin, score

pytest.importorskip("math_verify")


@pytest.mark.parametrize(
    "completion, reference, expected",
    [
        (r"<answer>\frac{1}{2}</answer>", "0.5", 1.0),  # a fraction against a decimal
        (r"The answer is \boxed{\frac{2}{4}}", r"\frac{1}{2}", 1.0),  # \boxed, unreduced
        (r"\boxed{0.5}", "1/2", 1.0),
        (r"\boxed{50\%}", "0.5", 1.0),  # percent
        (r"$\sqrt{2}/2$", r"\frac{\sqrt{2}}{2}", 1.0),  # symbolic equality
        (r"\boxed{1+x^2}", "x^2+1", 1.0),  # a bare LaTeX reference
        ("<answer>1,000</answer>", "1000", 1.0),
        ("<answer>18</answer>", "Janet sells ... #### 18", 1.0),  # GSM8K's full solution
        (r"<answer>\frac{1}{2}</answer> no wait <answer>3</answer>", "3", 1.0),  # the last answer block counts
        (r"\boxed{\frac{1}{3}}", r"\frac{1}{2}", 0.0),
        ("<answer>17</answer>", "18", 0.0),
        ("no answer here", "18", 0.0),
        ("", "18", 0.0),  # empty completion
        ("<answer>18</answer>", "", None),  # a reference it cannot read: not applicable
    ],
)
def test_math_verify_scores(completion, reference, expected):
    assert builtin.math_verify(["q"], [completion], answer=[reference]) == [expected]


def test_math_verify_through_build_and_score_with_chat_completions():
    funcs = build(["math_verify"])
    prompts = [[{"role": "user", "content": "half?"}]] * 3
    table = score(funcs, prompts, [r"\boxed{\frac{1}{2}}", r"\boxed{2}", "0.5"], {"answer": ["1/2"] * 3})
    assert table == [[1.0], [0.0], [1.0]]


def _as_messages(texts):
    return [[{"role": "assistant", "content": t}] for t in texts]


TRL_CASES = [
    (
        "accuracy_reward",
        [r"My answer is \boxed{\frac{1}{3}}", r"My answer is \boxed{\frac{1}{2}}", "no idea"],
        {"solution": [r"\frac{1}{3}"] * 3},
        [1.0, 0.0, 0.0],
    ),
    (
        "reasoning_accuracy_reward",
        [
            r"<think> hmm \boxed{2} </think> so \boxed{\frac{1}{3}}",
            r"<think> hmm \boxed{\frac{1}{3}} </think> so \boxed{2}",
            r"<think> \boxed{\frac{1}{3}} but never closed",
        ],
        {"solution": [r"\frac{1}{3}"] * 3},
        [1.0, 0.0, 0.0],
    ),
    ("think_format_reward", ["<think>\nreasoning\n</think>\nanswer", "<think>\nno end", "plain"], {}, [1.0, 0.0, 0.0]),
]


@pytest.mark.parametrize("name, texts, columns, expected", TRL_CASES, ids=[c[0] for c in TRL_CASES])
def test_trl_rewards_by_name_score_as_trl_does(name, texts, columns, expected):
    import trl.rewards

    oracle = getattr(trl.rewards, name)(completions=_as_messages(texts), **columns)
    assert oracle == expected
    funcs = build([f"trl.rewards:{name}"])
    assert [n for n, _ in funcs] == [name]
    # text prompts give string completions: the wrapper hands TRL one assistant message each
    assert score(funcs, ["q"] * 3, texts, columns) == [[v] for v in expected]
    # conversational prompts: completions arrive as messages already
    assert score(funcs, [[{"role": "user", "content": "q"}]] * 3, texts, columns) == [[v] for v in expected]


def test_trl_accuracy_reads_answer_when_the_data_has_no_solution_column():
    funcs = build(["trl.rewards:accuracy_reward"])
    assert score(funcs, ["q", "q"], [r"\boxed{72}", r"\boxed{71}"], {"answer": ["72", "72"]}) == [[1.0], [0.0]]


USABLE = "trl.rewards:accuracy_reward, trl.rewards:reasoning_accuracy_reward, trl.rewards:think_format_reward"


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            "trl.rewards:accuracy",
            f"config error: rewards.funcs = 'trl.rewards:accuracy': not a TRL reward usable by name; "
            f"usable: {USABLE} (did you mean 'accuracy_reward'?)",
        ),
        (
            "trl.rewards:get_soft_overlong_punishment",
            "config error: rewards.funcs = 'trl.rewards:get_soft_overlong_punishment': a TRL factory that needs arguments "
            f"and completion_ids, which a name cannot give; wrap it in a file.py:function, or use {USABLE}",
        ),
    ],
)
def test_trl_name_errors_are_one_line(entry, message):
    with pytest.raises(UserError) as err:
        build([entry])
    assert str(err.value) == message


def test_missing_math_verify_names_the_extra(monkeypatch):
    """Where math-verify is not installed, the reward is refused naming the extra."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
    for entry in ("math_verify", "trl.rewards:accuracy_reward"):
        with pytest.raises(UserError) as err:
            build(load("tiny-arith", [f'rewards.funcs=["{entry}"]']).rewards)
        assert (
            str(err.value)
            == f"config error: rewards.funcs = '{entry}': needs math-verify: pip install 'grpo-studio[math]'"
        )
