"""scripts/word_problems_by_kind.py without a model: every generated word problem gets one kind (checked against
the problem's own arithmetic), the number ranges, and the tally against a hand count."""

import importlib.util
import re

import pytest
from cli_helpers import ROOT

from grpo_studio.engine.prompts import tasks
from grpo_studio.engine.run.evaluation import wilson

spec = importlib.util.spec_from_file_location("word_problems_by_kind", ROOT / "scripts" / "word_problems_by_kind.py")
by_kind = importlib.util.module_from_spec(spec)
spec.loader.exec_module(by_kind)

# each kind's answer from the question's numbers in their order: the oracle the templates are checked against
ARITHMETIC = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "share": lambda total, b: total // b,
    "buy-then-give": lambda a, b, c: a + b - c,
}


def answer(row: dict) -> int:
    return int(row["answer"].rsplit("#### ", 1)[1])


@pytest.mark.parametrize(
    ("rows", "wording"),
    [(tasks.word_problems(), by_kind.HELD_OUT), (tasks.word_problems_general(), by_kind.GENERAL)],
    ids=["training-wording", "general-wording"],
)
def test_every_generated_row_has_one_kind_and_its_arithmetic(rows, wording):
    kinds = {kind: 0 for kind in by_kind.KINDS}
    for row in rows:
        found_wording, kind = by_kind.kind_of(row["question"])  # ValueError unless exactly one template matches
        numbers = [int(n) for n in re.findall(r"\d+", row["question"])]
        assert (found_wording, ARITHMETIC[kind](*numbers)) == (wording, answer(row)), row["question"]
        by_kind.range_of(row["question"])  # every question's largest number has a bin
        kinds[kind] += 1
    assert sum(kinds.values()) == len(rows) and min(kinds.values()) > len(rows) // 10  # all five, about a fifth each


def test_training_numbers_stay_in_the_first_range():
    assert {by_kind.range_of(row["question"]) for row in tasks.word_problems()} == {"<=108"}
    assert {by_kind.range_of(row["question"]) for row in tasks.word_problems_general()} == {
        "<=108",
        "109-200",
        "201-300",
    }


def test_ranges_at_their_edges():
    question = "A shop had {} tickets. It sold 5 of them. How many tickets are left in the shop?"
    assert [by_kind.range_of(question.format(n)) for n in (108, 109, 200, 201, 300)] == [
        "<=108",
        "109-200",
        "109-200",
        "201-300",
        "201-300",
    ]
    with pytest.raises(ValueError, match="301 is past the last range"):
        by_kind.range_of(question.format(301))


def test_a_question_of_no_template_is_refused():
    with pytest.raises(ValueError, match="matches 0 word-problem templates"):
        by_kind.kind_of("What is 7 + 4? Reply with only the number.")
    with pytest.raises(ValueError, match="matches 0"):  # a template's start is not enough: the whole question
        by_kind.kind_of("Ava fills 3 bags with 4 stamps each. How many stamps are in the bags altogether? Then?")


HAND = [  # split, question, right before, right after
    (by_kind.HELD_OUT, "Ava has 7 shells. Ben gives Ava 4 more. How many shells does Ava have now?", True, True),
    (by_kind.HELD_OUT, "Dan has 60 cards. Sam gives Dan 40 more. How many cards does Dan have now?", False, True),
    (by_kind.HELD_OUT, "Emma has 2 coins. Finn gives Emma 3 more. How many coins does Emma have now?", False, False),
    (by_kind.HELD_OUT, "Hugo shares 108 books equally among 9 friends. How many books does each friend get?", 0, 1),
    (by_kind.GENERAL, "A shop had 150 beads. It sold 7 of them. How many beads are left in the shop?", True, False),
    (by_kind.GENERAL, "A shop had 250 beads. It sold 9 of them. How many beads are left in the shop?", False, False),
    (by_kind.GENERAL, "Each of 12 shelves holds 3 nails. How many nails do the shelves hold in total?", False, True),
]
# the replies of HAND's rows before and after: set up right (the operation on the question's numbers) or not
REPLIES = [
    ("7 + 4 = 11", "<answer>11</answer>"),  # after: the answer alone, no set-up written
    ("60 - 40 = 20", "60+40 = 100"),  # before: a subtraction
    ("2 + 3 = 6", "3 + 2 = 6"),  # set up right, summed wrong
    ("108 * 9", "108 ÷ 9 = 12"),
    ("150 - 7 = 143", "1150 - 7 = 1143"),  # 1150 is not 150
    ("9 - 250", "250 − 9 = 231"),
    ("12 x 3 = 36", "3 × 12 = 36"),
]


@pytest.mark.parametrize(
    ("question", "reply", "right"),
    [
        ("Ava has 7 shells. Ben gives Ava 4 more. How many shells does Ava have now?", "4+7 = 12", True),
        ("Ava has 7 shells. Ben gives Ava 4 more. How many shells does Ava have now?", "17 + 4 = 21", False),
        ("Ava had 60 cards and gave 15 of them to Ben. How many cards does Ava have left?", "60 - 15 = 44", True),
        ("Ava had 60 cards and gave 15 of them to Ben. How many cards does Ava have left?", "15 - 60", False),
        ("Ava shares 108 books equally among 9 friends. How many books does each friend get?", "9 / 108", False),
        ("Isla has 7 coins, buys 2 more, then gives 8 to Sam. How many coins does Isla have now?", "7 + 2 = 9", False),
        (
            "Isla has 7 coins, buys 2 more, then gives 8 to Sam. How many coins does Isla have now?",
            "After buying, Isla has 7 + 2 = 9. After giving 8 away, 9 - 8 = 1.",
            True,
        ),
        (
            "Nora collects 41 beads on Monday and 30 on Tuesday, then loses 20. How many beads does Nora have?",
            "41 + 30 - 20 = 50",
            True,
        ),
    ],
)
def test_set_up_reads_the_operation_on_the_questions_numbers(question, reply, right):
    assert by_kind.set_up(question, reply) is right


def hand_records() -> list[dict]:
    return [
        {"split": s, "question": q, "before": bool(b), "after": bool(a), "replies": dict(zip(by_kind.PHASES, r))}
        for (s, q, b, a), r in zip(HAND, REPLIES)
    ]


def test_the_tally_against_a_hand_count():
    out = by_kind.tally(hand_records())
    counted = {
        split: {name: (c["n"], c["before"][0], c["after"][0]) for name, c in out[split].items()} for split in out
    }
    assert counted == {
        by_kind.HELD_OUT: {
            "all": (4, 1 / 4, 3 / 4),
            "add": (3, 1 / 3, 2 / 3),
            "share": (1, 0.0, 1.0),
            "<=108": (4, 1 / 4, 3 / 4),  # 108 is still training's range
            "add <=108": (3, 1 / 3, 2 / 3),
            "share <=108": (1, 0.0, 1.0),
        },
        by_kind.GENERAL: {
            "all": (3, 1 / 3, 1 / 3),
            "subtract": (2, 1 / 2, 0.0),
            "multiply": (1, 0.0, 1.0),
            "<=108": (1, 0.0, 1.0),
            "109-200": (1, 1.0, 0.0),
            "201-300": (1, 0.0, 0.0),
            "subtract 109-200": (1, 1.0, 0.0),
            "subtract 201-300": (1, 0.0, 0.0),
            "multiply <=108": (1, 0.0, 1.0),
        },
    }
    add = out[by_kind.HELD_OUT]["add"]
    assert add["before"] == [1 / 3, *wilson(1 / 3, 3)] and add["gain"] == pytest.approx(1 / 3)
    assert out[by_kind.GENERAL]["subtract"]["gain"] == -0.5
    set_ups = {
        split: {name: [c["set_up"][p][0] for p in by_kind.PHASES] for name, c in out[split].items()} for split in out
    }
    assert set_ups[by_kind.HELD_OUT]["add"] == [2 / 3, 2 / 3] and set_ups[by_kind.HELD_OUT]["share"] == [0.0, 1.0]
    assert set_ups[by_kind.GENERAL]["subtract"] == [1 / 2, 1 / 2] and set_ups[by_kind.GENERAL]["multiply"] == [1.0, 1.0]
    arithmetic = {name: {p: c[0] for p, c in cell["right_if_set_up"].items()} for name, cell in out["held-out"].items()}
    assert arithmetic["add"] == {"before": 1 / 2, "after": 1 / 2}  # 7 + 4 and 2 + 3; 60+40 and 3 + 2
    assert arithmetic["share"] == {"after": 1.0}  # none set up before


def test_the_table_and_the_curve(tmp_path):
    records = hand_records()
    tallies = {"0": by_kind.tally(records), "1": by_kind.tally(records)}
    tallies["pooled"] = by_kind.tally(records + records)
    lines = by_kind.markdown(tallies).splitlines()
    assert len(lines) == 2 + 4 + 6 + 1 + 2 + 3  # the head, its rule, a line per cell of each split; the kind x range
    assert lines[3] == (
        "| held-out | add | 3 | 33 → 67 (+33) | 33 → 67 (+33) | 33.3% [9.7, 70.0] | 66.7% [30.0, 90.3] | +33.3 |"
        " 67% → 67% | 50% → 50% |"
    )
    assert lines[1] == "|" + "---|" * 10 and lines[-4] == "|" + "---|" * 8  # as many as the heads' columns
    assert (
        lines[-1]
        == "| multiply | <=108 | 2 | 0.0% [0.0, 65.8] | 100.0% [34.2, 100.0] | +100.0 | 100% → 100% | 0% → 100% |"
    )
    by_kind.plot(tallies, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
