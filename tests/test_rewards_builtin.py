"""Every built-in reward against hand-picked completions, with the exact scores expected."""

from __future__ import annotations

import pytest

from grpo_studio.contract.config import load
from grpo_studio.contract.errors import UserError
from grpo_studio.rewards import build, builtin, describe
from grpo_studio.rewards.builtin import Options

GOOD = "<reasoning>\nJanet has 16 eggs. 16 - 3 - 4 = 9. 9 * 2 = 18.\n</reasoning>\n<answer>\n18\n</answer>\n"
UNICODE = "<reasoning>\n😀 ünïcödé 計算: 9 × 2 = 18\n</reasoning>\n<answer>\n18\n</answer>"
GSM8K_REF = (
    "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18"
)


def one(fn, completion, opts=builtin.DEFAULT, **cols):
    return fn(["q"], [completion], opts=opts, **{k: [v] for k, v in cols.items()})[0]


@pytest.mark.parametrize(
    "completion, reference, expected",
    [
        (GOOD, "18", 2.0),
        (GOOD, GSM8K_REF, 2.0),  # GSM8K's full solution as the reference
        ("<answer>17</answer>", "18", 0.0),
        ("", "18", 0.0),  # empty completion
        ("18", "18", 0.0),  # no answer block, no ####
        (UNICODE, "18", 2.0),
        ("<answer>١٨</answer>", "18", 0.0),  # Arabic-Indic digits are not ASCII numbers
        ("<answer>3</answer> no wait <answer>18</answer>", "18", 2.0),  # several answers: the last one counts
        ("<answer>18</answer> no wait <answer>3</answer>", "18", 0.0),
        ("<answer>-7</answer>", "-7", 2.0),
        ("<answer>\u22127</answer>", "-7", 2.0),  # unicode minus sign
        ("<answer>2.50</answer>", "2.5", 2.0),  # decimals compare by value
        ("<answer>$1,234</answer>", "1234", 2.0),
        ("<answer>123456789012345678901234567890</answer>", "123456789012345678901234567890", 2.0),
        (
            "<answer>123456789012345678901234567891</answer>",
            "123456789012345678901234567890",
            0.0,
        ),  # floats would say equal
        ("The total is 18.\n#### 18", "18", 2.0),  # GSM8K-style '#### N' in the completion
        ("<answer>18", "18", 0.0),  # unterminated block (truncated), no ####
        ("<answer> Paris </answer>", "paris", 2.0),  # non-numeric: trimmed, case-folded text
        ("<answer>68</answer>", 68, 2.0),  # integer column values
    ],
)
def test_correctness(completion, reference, expected):
    assert one(builtin.correctness, completion, answer=reference) == expected


def test_correctness_accepts_chat_messages():
    msgs = [{"role": "assistant", "content": GOOD}]
    assert builtin.correctness([[{"role": "user", "content": "q"}]], [msgs], answer=["18"]) == [2.0]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>18</answer>", 0.5),
        ("<answer>-3</answer>", 0.5),
        ("<answer>1,000</answer>", 0.5),
        ("<answer>2.5</answer>", 0.0),
        ("<answer>eighteen</answer>", 0.0),
        ("", 0.0),
        ("18", 0.0),
        ("<answer>١٨</answer>", 0.0),
        ("<answer>99999999999999999999999999</answer>", 0.5),
        (GOOD, 0.5),
    ],
)
def test_int(completion, expected):
    assert one(builtin.int_answer, completion) == expected


@pytest.mark.parametrize(
    "completion, expected",
    [
        (GOOD, 0.5),
        ("<reasoning>x</reasoning> <answer>18</answer>", 0.5),  # any whitespace
        ("\n  <reasoning>x</reasoning><answer>18</answer> trailing", 0.5),
        ("<answer>18</answer>", 0.0),  # no reasoning block
        ("Sure! <reasoning>x</reasoning><answer>18</answer>", 0.0),
        ("<reasoning>x<answer>18</answer>", 0.0),
        ("", 0.0),
        (UNICODE, 0.5),
    ],
)
def test_soft_format(completion, expected):
    assert one(builtin.soft_format, completion) == expected


@pytest.mark.parametrize(
    "completion, expected",
    [
        (GOOD, 0.5),
        (GOOD.rstrip("\n"), 0.5),  # the final newline is optional
        ("<reasoning>\na\nb\n</reasoning>\n<answer>\n18\n</answer>", 0.5),  # multi-line reasoning
        ("<reasoning>x</reasoning>\n<answer>\n18\n</answer>", 0.0),  # newlines inside tags required
        ("<reasoning>\nx\n</reasoning><answer>\n18\n</answer>", 0.0),
        (GOOD + "extra", 0.0),
        (" " + GOOD, 0.0),
        ("", 0.0),
        (UNICODE, 0.5),
    ],
)
def test_strict_format(completion, expected):
    assert one(builtin.strict_format, completion) == expected


@pytest.mark.parametrize(
    "completion, expected",
    [
        (GOOD, 0.5),
        (GOOD + "trailing!", 0.491),  # 9 characters after </answer>
        ("<answer>18</answer>", 0.0),
        ("<reasoning>\nx\n</reasoning>\n<answer>18</answer>", 0.25),
        (GOOD + GOOD, 0.0),  # every tag twice
        ("", 0.0),
        (UNICODE, 0.5),
    ],
)
def test_xmlcount(completion, expected):
    assert one(builtin.xmlcount, completion) == expected


@pytest.mark.parametrize(
    "guess, reference, expected",
    [
        ("10", "10", 2.0),
        ("9", "10", 1 - 2 * 0.1),  # 9 for 10 beats 3 for 10
        ("11", "10", 1 - 2 * 0.1),
        ("3", "10", 1 - 2 * 0.7),
        ("25", "10", -1.0),  # outlier: the floor
        ("-9", "-10", 1 - 2 * 0.1),
        ("2.25", "2.5", 1 - 2 * 0.1),
        ("0.5", "0", 0.0),  # |ref| < 1 -> absolute error
        ("1000000000000000000000000000001", "1000000000000000000000000000000", 1.0),  # close, not exact
        ("", "10", -1.0),
        ("abc", "10", -1.0),
    ],
)
def test_proximity(guess, reference, expected):
    completion = f"<answer>{guess}</answer>" if guess else ""
    assert one(builtin.proximity, completion, answer=reference) == pytest.approx(expected, abs=1e-12)


def test_proximity_orders_neighbours_and_skips_non_numeric_references():
    scores = builtin.proximity(
        ["q"] * 4,
        ["<answer>10</answer>", "<answer>9</answer>", "<answer>3</answer>", "<answer>40</answer>"],
        answer=["10"] * 4,
    )
    assert scores[0] > scores[1] > scores[2] > scores[3] == -1.0
    assert one(builtin.proximity, "<answer>Paris</answer>", answer="Paris") is None


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>68</answer>", 0.5),
        (" <answer> 68 </answer>\n", 0.5),
        ("<answer>-3.5</answer>", 0.5),
        ("<answer>68</answer>x", 0.0),
        ("<answer>abc</answer>", 0.0),
        ("", 0.0),
        ("68", 0.0),
        (GOOD, 0.5),  # reasoning block optional by default
    ],
)
def test_format_default_is_the_arithmetic_task(completion, expected):
    assert one(builtin.format, completion) == expected


UNSLOTH = Options(
    reasoning_start="<start_working_out>",
    reasoning_end="<end_working_out>",
    solution_start="<SOLUTION>",
    solution_end="</SOLUTION>",
    format_require_reasoning=True,
)


@pytest.mark.parametrize(
    "completion, fmt, correct",
    [
        ("<start_working_out>6*7<end_working_out><SOLUTION>42</SOLUTION>", 0.5, 2.0),
        ("<start_working_out>\nthink\n<end_working_out>\n<SOLUTION> 42 </SOLUTION>\n", 0.5, 2.0),
        ("<SOLUTION>42</SOLUTION>", 0.0, 2.0),  # reasoning required by this template
        ("<start_working_out>x<end_working_out><SOLUTION>41</SOLUTION>", 0.5, 0.0),
        ("<start_working_out>x<end_working_out>42", 0.0, 0.0),
    ],
)
def test_custom_reasoning_template(completion, fmt, correct):
    assert one(builtin.format, completion, UNSLOTH) == fmt
    assert one(builtin.correctness, completion, UNSLOTH, answer="42") == correct


def test_answer_regex_extraction_takes_the_last_match():
    opts = Options(answer_regex=r"[Tt]he answer is (-?\d+)")
    assert one(builtin.correctness, "The answer is 7. No: the answer is 8.", opts, answer="8") == 2.0
    assert one(builtin.correctness, "The answer is 8. No: the answer is 7.", opts, answer="8") == 0.0
    assert one(builtin.correctness, "<answer>8</answer>", opts, answer="8") == 0.0


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("x" * 15, 0.0),
        ("x" * 10, 0.0),
        ("x" * 20, 0.0),
        ("x" * 30, -0.5),
        ("x" * 100, -1.0),
        ("x" * 5, -0.5),
        ("", -1.0),
        ("é" * 15, 0.0),  # characters, not bytes
    ],
)
def test_length_penalty(completion, expected):
    assert one(builtin.length_penalty, completion, Options(length_min=10, length_max=20)) == expected


EMAIL = "Dear Bob,\n\nthe MEETING moved to 3 pm.\n\nBest regards,\nAlice"


def test_keyword_email_example():
    opts = Options(keywords=("Dear", "Regards", "meeting"))
    assert one(builtin.keyword, EMAIL, opts) == 1.0
    assert one(builtin.keyword, "Dear Bob, see you.", opts) == pytest.approx(1 / 3)
    assert one(builtin.keyword, "", opts) == 0.0
    # a per-row 'keywords' column overrides the configured list; no keywords at all -> not applicable
    assert builtin.keyword(["q", "q"], [EMAIL, EMAIL], opts, keywords=["dear, alice", ["zebra"]]) == [1.0, 0.0]
    assert one(builtin.keyword, EMAIL) is None


def test_regex_match():
    opts = Options(regex=r"^Dear \w+,")
    assert [one(builtin.regex_match, c, opts) for c in (EMAIL, "Hi Bob,", "")] == [1.0, 0.0, 0.0]


def test_build_binds_config_and_keeps_names():
    cfg = load(
        "tiny-arith",
        [
            'rewards.funcs=["correctness","format","proximity"]',
            "rewards.solution_start=<SOLUTION>",
            "rewards.solution_end=</SOLUTION>",
        ],
    )
    funcs = build(cfg.rewards)
    assert [n for n, _ in funcs] == ["correctness", "format", "proximity"]
    scores = [fn(["q"], ["<SOLUTION>5</SOLUTION>"], answer=["5"])[0] for _, fn in funcs]
    assert scores == [2.0, 0.5, 2.0]


def test_build_errors_are_one_line():
    cfg = load("tiny-arith", ['rewards.funcs=["corectness"]'])
    with pytest.raises(UserError) as err:
        build(cfg.rewards)
    assert str(err.value).startswith("config error: rewards.funcs = 'corectness': unknown reward; allowed: correctness")
    assert str(err.value).endswith("or 'file.py:function' (did you mean 'correctness'?)")
    cfg = load("tiny-arith", ['rewards.funcs=["regex_match"]'])
    with pytest.raises(UserError, match=r"^config error: rewards.regex = '': the regex_match reward needs a pattern"):
        build(cfg.rewards)
    cfg = load("tiny-arith", ["rewards.answer_regex=(unclosed"])
    with pytest.raises(UserError, match=r"^config error: rewards.answer_regex = '\(unclosed': not a valid regular"):
        build(cfg.rewards)


def test_listing_names_every_builtin_with_a_range():
    from grpo_studio.cli.main import main

    names = [n for n, _, _ in describe()]
    assert names == [
        "correctness",
        "int",
        "soft_format",
        "strict_format",
        "xmlcount",
        "proximity",
        "format",
        "length_penalty",
        "keyword",
        "regex_match",
        "code_exec",
        "math_verify",
    ]
    assert all(about and span for _, about, span in describe())
    assert main(["rewards", "--json"]) == 0
