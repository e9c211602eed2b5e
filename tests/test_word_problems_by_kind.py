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


def test_the_tally_against_a_hand_count():
    records = [{"split": s, "question": q, "before": bool(b), "after": bool(a)} for s, q, b, a in HAND]
    out = by_kind.tally(records)
    counted = {
        split: {name: (c["n"], c["before"][0], c["after"][0]) for name, c in out[split].items()} for split in out
    }
    assert counted == {
        by_kind.HELD_OUT: {
            "all": (4, 1 / 4, 3 / 4),
            "add": (3, 1 / 3, 2 / 3),
            "share": (1, 0.0, 1.0),
            "<=108": (4, 1 / 4, 3 / 4),  # 108 is still training's range
        },
        by_kind.GENERAL: {
            "all": (3, 1 / 3, 1 / 3),
            "subtract": (2, 1 / 2, 0.0),
            "multiply": (1, 0.0, 1.0),
            "<=108": (1, 0.0, 1.0),
            "109-200": (1, 1.0, 0.0),
            "201-300": (1, 0.0, 0.0),
        },
    }
    add = out[by_kind.HELD_OUT]["add"]
    assert add["before"] == [1 / 3, *wilson(1 / 3, 3)] and add["gain"] == pytest.approx(1 / 3)
    assert out[by_kind.GENERAL]["subtract"]["gain"] == -0.5


def test_the_table_and_the_curve(tmp_path):
    records = [{"split": s, "question": q, "before": bool(b), "after": bool(a)} for s, q, b, a in HAND]
    tallies = {"0": by_kind.tally(records), "1": by_kind.tally(records)}
    tallies["pooled"] = by_kind.tally(records + records)
    lines = by_kind.markdown(tallies).splitlines()
    assert len(lines) == 2 + 4 + 6  # the head, its rule, a line per cell of each split
    assert lines[3] == (
        "| held-out | add | 3 | 33 → 67 (+33) | 33 → 67 (+33) | 33.3% [9.7, 70.0] | 66.7% [30.0, 90.3] | +33.3 |"
    )
    by_kind.plot(tallies, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
