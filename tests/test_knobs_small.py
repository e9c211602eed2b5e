"""Knobs that do what they say: data.eval_size's auto default on a user's own data,
train.keep_checkpoints / train.best_metric. (rollout.colocate = false: tests/test_rollout_server.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_studio.contract.config import load
from grpo_studio.engine.prompts import data

SHORT = ["train.prompts_per_step=2", "rollout.num_generations=2", "train.save_every=0"]


def write_arith_jsonl(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"{a}+{a + 1}=", "answer": str(2 * a + 1)}) + "\n" for a in range(n)))
    return path


def events(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]


def test_builtin_arith_keeps_its_200_held_out_rows():
    cfg = load("tiny-arith")
    assert cfg.data.eval_size == -1 and data.eval_size(cfg.data) == 200
    assert len(data.load_rows(cfg.data, "eval")) == 200


def test_a_64_row_jsonl_trains_with_default_settings(tmp_path):
    from grpo_studio.engine.run.trainer import Trainer

    path = write_arith_jsonl(tmp_path / "mine.jsonl", 64)
    cfg = load("tiny-arith", [f"data.source={path}", "train.steps=2", *SHORT])
    assert cfg.train.eval_every == 10  # the recipe's: nothing to evaluate on, so a warning and no eval
    assert Trainer(cfg, tmp_path / "run").run() == "finished"
    got = events(tmp_path / "run")
    assert (got[0]["event"], got[0]["message"]) == (
        "info",
        "data: 64 training rows, no held-out rows (set data.eval_size to hold some out)",
    )
    assert (got[1]["event"], got[1]["message"]) == (
        "warning",
        "train.eval_every = 10: no rows to evaluate on, so no eval/accuracy; set data.eval_size (rows "
        "held out), data.eval_source (a file of eval rows), or data.eval_split for a Hugging Face dataset",
    )
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["data.eval_size=4"], "data: 60 training rows, 4 held out for evaluation (data.eval_size)"),
        (["data.eval_size=0"], "data: 64 training rows, no held-out rows (set data.eval_size to hold some out)"),
    ],
)
def test_the_first_event_says_what_is_held_out(tmp_path, extra, message):
    from grpo_studio.engine.run.trainer import Trainer

    path = write_arith_jsonl(tmp_path / "mine.jsonl", 64)
    cfg = load("tiny-arith", [f"data.source={path}", "train.steps=1", "train.eval_every=0", *SHORT, *extra])
    Trainer(cfg, tmp_path / "run").close()
    said = [(e["event"], e["message"]) for e in events(tmp_path / "run")]
    assert said == [("info", message), ("info", "micro-batch auto = 4 rows (the whole step)")]  # then the choice


@pytest.mark.parametrize("best_metric", ["", "reward/mean"])
def test_keep_checkpoints_keeps_the_newest_and_the_best(tmp_path, best_metric):
    from grpo_studio.engine.run.trainer import Trainer

    run = tmp_path / "run"
    cfg = load(
        "tiny-arith",
        [
            "train.steps=5",
            "train.eval_every=0",
            *SHORT,
            "train.save_every=1",
            "train.keep_checkpoints=2",
            f"train.best_metric={best_metric}",
        ],
    )
    assert Trainer(cfg, run).run() == "finished"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    expected = {4, 5}
    if best_metric:
        expected.add(max((r[best_metric], r["step"]) for r in rows)[1])
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(f"step-{s}" for s in expected)
    deleted = [s for e in events(run) if e["event"] == "checkpoints_deleted" for s in e["steps"]]
    assert sorted(deleted) == sorted({1, 2, 3} - expected)


def test_a_misspelt_best_metric_is_refused_with_the_nearest_name():
    from grpo_studio.contract import config
    from grpo_studio.contract.errors import UserError

    with pytest.raises(UserError) as err:
        config.load("tiny-arith", ["train.best_metric=reward/mena"])
    assert str(err.value) == (
        "config error: train.best_metric = 'reward/mena': not a metric the trainer writes (did you mean 'reward/mean'?)"
    )
    for name in ("reward/mean", "rewards/correctness/mean", "eval/accuracy"):
        assert config.load("tiny-arith", [f"train.best_metric={name}"]).train.best_metric == name
