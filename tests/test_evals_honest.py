"""Evals that cannot flatter: held-out rows disjoint from training by construction (a + b with its mirror b + a),
a generalisation split of phrasings and ranges training never shows (data.general_size), the answer scored alone,
Wilson 95% intervals checked by hand, and the step-0 eval kept by a run stopped before its first in-run eval."""

from __future__ import annotations

import json
import re

import pytest

from grpo_studio.contract import config, metrics
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.prompts import arith, data, tasks
from grpo_studio.engine.run import evaluation
from grpo_studio.rewards import builtin


def test_wilson_interval_by_hand():
    # 47/128, z = 1.96: p = 0.3671875; centre (p + z²/256) / (1 + z²/128) = 0.3821932 / 1.0300114;
    # half-width z·sqrt(p(1-p)/128 + z²/65536) / 1.0300114 = 0.0848449 / 1.0300114
    lo, hi = evaluation.wilson(47 / 128, 128)
    assert (round(lo, 4), round(hi, 4)) == (0.2887, 0.4534)
    assert evaluation.wilson(0.0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))  # 0 of 10: z²/(n + z²)
    assert evaluation.wilson(1.0, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    lo, hi = evaluation.wilson(0.3, 50)
    assert (lo, hi) == pytest.approx(tuple(1 - b for b in reversed(evaluation.wilson(0.7, 50))))  # symmetric


def test_arith_holds_out_each_pair_with_its_mirror():
    train, evals = arith.split_pairs()
    assert len(evals) == 200
    held = {frozenset(p) for p in evals}
    assert not [p for p in train if frozenset(p) in held]
    mirrors_trained_before = [p for p in arith.all_pairs() if p not in evals and (p[1], p[0]) in evals]
    assert len(train) == 2500 - 200 - len(mirrors_trained_before)  # only the mirrors left training


def _operands(prompt: str) -> frozenset:
    return frozenset(int(n) for n in re.findall(r"\d+", prompt))


def test_chat_arith_holds_out_whole_questions():
    cfg = config.load("chat-arith")
    train, evals = data.load_rows(cfg.data, "train"), data.load_rows(cfg.data, "eval")
    assert len(evals) == 200
    assert not {_operands(r["prompt"]) for r in train} & {_operands(r["prompt"]) for r in evals}
    assert len(train) + len(evals) in (440, 441)  # at most one row (a mirror cut off by the size) on neither side
    prompts = {r["prompt"] for r in evals}
    mirror = lambda p: re.sub(r"(\d+) \+ (\d+)", r"\2 + \1", p)  # noqa: E731
    assert len([p for p in prompts if mirror(p) not in prompts]) <= 1  # only the group the size cut in two


def test_word_problems_hold_out_no_question_twice():
    cfg = config.load("word-problems")
    train, evals = data.load_rows(cfg.data, "train"), data.load_rows(cfg.data, "eval")
    text = lambda r: r["prompt"][-1]["content"]  # noqa: E731
    assert not {text(r) for r in train} & {text(r) for r in evals}
    general = data.load_rows(cfg.data, "general")
    assert len(general) == 200
    names = "|".join(tasks.NAMES + tasks.OTHER_NAMES + tasks.THINGS + tasks.OTHER_THINGS)
    wording = lambda r: re.sub(rf"\d+|\b({names})\b", "_", text(r))  # noqa: E731  the question less its values
    assert not {wording(r) for r in general} & {wording(r) for r in train}  # worded as no training question is
    assert not {n for r in general for n in re.findall(r"[A-Z][a-z]+", text(r))} & set(tasks.NAMES)
    numbers = lambda rows: max(int(n) for r in rows for n in re.findall(r"\d+", text(r)))  # noqa: E731
    assert numbers(train) <= 108 < numbers(general) <= 300


def test_the_generalisation_split_is_what_training_never_shows():
    cfg = config.load("chat-arith")
    train, general = data.load_rows(cfg.data, "train"), data.load_rows(cfg.data, "general")
    assert len(general) == 200  # auto
    seen = {r["prompt"] for r in train}
    assert not [r for r in general if r["prompt"] in seen or "Reply with only the number" in r["prompt"]]
    beyond = [r for r in general if max(_operands(r["prompt"])) > 20]
    assert len(beyond) == 100 and max(max(_operands(r["prompt"])) for r in beyond) <= 60
    for phrasing in tasks.GENERAL_PHRASINGS:  # every phrasing in both ranges
        head = phrasing.split("{")[0]
        used = [r for r in general if r["prompt"].startswith(head) and r["prompt"][len(head) : len(head) + 1].isdigit()]
        assert {max(_operands(r["prompt"])) > 20 for r in used} == {True, False}
    assert all(int(r["answer"]) == sum(int(n) for n in re.findall(r"\d+", r["prompt"])) for r in general)
    tiny = data.load_rows(config.load("tiny-arith").data, "general")
    arith_seen = {r["prompt"] for r in data.load_rows(config.load("tiny-arith").data, "train")}
    assert len(tiny) == 200 and not [r for r in tiny if r["prompt"] in arith_seen]
    assert sum(" " in r["prompt"] for r in tiny) == 100  # "a + b =" half, an operand of 50..99 the other half


def test_general_size_is_refused_in_one_line_where_it_cannot_act():
    with pytest.raises(UserError) as err:
        data.load_rows(config.load("tool-calc", ["data.general_size=10"]).data, "general")
    assert str(err.value) == (
        "config error: data.general_size = 10: builtin:tool-arith has no generalisation split; allowed: 0 or "
        "-1 (auto), or a data.source of builtin:arith, builtin:chat-arith, builtin:word-problems"
    )
    with pytest.raises(UserError) as err:
        data.load_rows(config.load("chat-arith", ["data.general_size=883"]).data, "general")
    assert str(err.value) == (
        "config error: data.general_size = 883: builtin:chat-arith's generalisation split has 882 rows; "
        "allowed: 0 to 882"
    )
    assert data.load_rows(config.load("tool-calc").data, "general") == []  # auto: none


@pytest.mark.parametrize(
    ("text", "reference", "right"),
    [
        ("<answer>7</answer>", "7", True),
        ("The answer is 7.", "7", True),  # no tags: the format rewards' business, not the answer's
        ("so 12 - 5 = 7\n#### 7", "He ... #### 7", True),
        ("It is 1,000", "1000", True),
        ("11, no wait, 12", "11", False),  # the last number
        ("no number at all", "7", False),
        ("Paris.", "paris", True),  # not a number: the rewards' extractor (here the whole reply)
    ],
)
def test_the_answer_alone(text, reference, right):
    opts = builtin.Options(answer_regex=r"\A\s*(.*?)[.\s]*\Z") if reference == "paris" else builtin.DEFAULT
    assert evaluation.answer_right(text, reference, opts) is right


def test_general_metrics_are_named_and_declared():
    sums = [47.0, 0.0, 0.0, 128.0, 50.0]
    out = evaluation.eval_metrics(sums, 128, 1, metrics.GENERAL)
    assert out["eval/general/accuracy"] == 47 / 128
    assert (round(out["eval/general/accuracy_lo"], 4), round(out["eval/general/accuracy_hi"], 4)) == (0.2887, 0.4534)
    assert out["eval/general/answer_accuracy"] == 50 / 128
    metrics.check_row(out)  # every name in the schema


def test_step_0_eval_is_kept_when_the_run_stops_before_its_first_eval(tmp_path):
    from grpo_studio.cli.main import main
    from grpo_studio.studio import report
    from grpo_studio.studio.panels import PANELS
    from grpo_studio.studio.rundata import RunData

    run_dir = tmp_path / "run"
    sets = ["train.steps=1", "train.eval_every=5", "train.eval_before=true", "data.eval_size=8", "data.general_size=8"]
    assert main(["train", "tiny-arith", "--run-dir", str(run_dir), *[a for s in sets for a in ("--set", s)]]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert not [k for row in rows for k in row if k.startswith("eval/")]  # no in-run eval
    (before,) = [json.loads(e) for e in (run_dir / "events.jsonl").read_text().splitlines() if '"eval"' in e]
    run = RunData(run_dir)
    run.drain()
    assert run.series(metrics.EVAL_ACCURACY) == ([0], [before["accuracy"]])
    assert run.series(metrics.interval(metrics.general(metrics.EVAL_ACCURACY))[1]) == (
        [0],
        [before["general/accuracy_hi"]],
    )
    assert PANELS["eval"].present(run)
    assert (report.export(run_dir) / "eval.png").stat().st_size > 0
