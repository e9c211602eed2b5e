"""pass@1, pass@k and maj@k (train.eval_k) against hand computations: the formulas on a constructed case, then
the trainer with a scripted eval sampler whose right and wrong samples are chosen, through metrics.jsonl, the
step-0 `eval` event, the studio's series and the report; k = 1 writes eval/accuracy alone, as before."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from grpo_studio.contract import config, metrics
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.run import evaluation
from grpo_studio.engine.sampler.base import Rollout
from grpo_studio.rewards import builtin

K = 4
ENVS = Path(__file__).with_name("episode_envs.py")
SHORT = [
    "train.steps=1",
    "train.prompts_per_step=2",
    "rollout.num_generations=2",
    "rollout.max_completion_len=8",
    "rollout.backend=hf",
    "train.save_every=0",
    "train.eval_every=1",
    "train.eval_before=true",
    "data.eval_size=3",
    "data.general_size=0",
]


def tagged(answer) -> str:
    return f"<answer>{answer}</answer>"


def constructed(right: list[int]) -> tuple[list[str], list[float]]:
    """Three prompts, 4 samples each, with right answers r (correctness scores a right sample 2.0):
    A  r, r+1, r, r+2      2 of 4 right, the majority (r, 2 votes) right
    B  r+1, r+1, r, r+1    1 of 4 right, the majority (r+1) wrong
    C  r+1, r, r+2, r+2    0 of 4 right (the bare r has no <answer>: no answer), the majority (r+2) wrong"""
    a, b, c = right
    texts = [
        *map(tagged, (a, a + 1, a, a + 2)),
        *map(tagged, (b + 1, b + 1, b, b + 1)),
        tagged(c + 1),
        str(c),
        tagged(c + 2),
        tagged(c + 2),
    ]
    scores = [2.0, 0, 2.0, 0] + [0, 0, 2.0, 0] + [0, 0, 0, 0]
    return texts, scores


# by hand: pass@1 = (2/4 + 1/4 + 0/4) / 3; pass@4 = (1 + 1 + 0) / 3; maj@4 = (1 + 0 + 0) / 3; the answer alone
# (the last number, tags or not) = (2/4 + 1/4 + 1/4) / 3: C's bare "3" is right, though no reward finds it
SHARES = {
    metrics.EVAL_ACCURACY: 0.25,
    metrics.EVAL_ANSWER: 1 / 3,
    metrics.EVAL_PASS_AT_K: 2 / 3,
    metrics.EVAL_MAJ_AT_K: 1 / 3,
}
HAND = {}
for _name, _share in SHARES.items():  # each with its Wilson interval over the 3 prompts (test_evals_honest.py)
    HAND.update({_name: _share, **dict(zip(metrics.interval(_name), evaluation.wilson(_share, 3)))})
# TRL's eval numbers over the 12 samples, tiny-arith's two rewards at weight 1: correctness 2.0 on the 3 right
# ones (A twice, B once) = 6/12; format 0.5 on the 11 tagged ones = 5.5/12; eval/reward = their sum
REWARDS = {"eval/rewards/correctness/mean": 6 / 12, "eval/rewards/format/mean": 5.5 / 12, "eval/reward": 11.5 / 12}


def test_the_constructed_case_by_hand():
    texts, scores = constructed([7, 5, 3])
    sums = evaluation.tally(scores, texts, K, builtin.DEFAULT, ["7", "5", "3"])
    assert sums == [0.75, 2.0, 1.0, 11.0, 1.0]  # 11 of 12 samples have an answer
    assert evaluation.eval_metrics(sums, 3, K) == HAND


def test_pass_at_k_is_chens_estimator():
    assert evaluation.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert [evaluation.pass_at_k(4, c, 4) for c in range(5)] == [0.0, 1.0, 1.0, 1.0, 1.0]  # n = k: any right
    assert evaluation.pass_at_k(4, 1, 1) == 0.25  # pass@1 = c/n


def test_majority_ties_go_to_the_first_answer_and_numbers_vote_by_value():
    assert evaluation.majority(["4", "6", "6", "4"]) == 0
    assert evaluation.majority(["6", "4", "4", "6"]) == 0
    assert evaluation.majority([None, "1,000", "7", "1000.0", "7 "]) == 1  # 1000 twice, then 7 twice: 1000 first
    assert evaluation.majority(["Paris", "paris ", "Rome"]) == 0
    assert evaluation.majority([None, None]) is None


def test_maj_at_k_is_not_written_when_no_sample_has_an_answer():
    sums = evaluation.tally([2.0, 0.0, 0.0, 0.0], ["7", "8", "7", "9"], K, builtin.DEFAULT)
    assert {k: v for k, v in evaluation.eval_metrics(sums, 1, K).items() if not k.endswith(("_lo", "_hi"))} == {
        metrics.EVAL_ACCURACY: 0.25,
        metrics.EVAL_ANSWER: 0.0,  # no reference given: nothing to compare the answer with
        metrics.EVAL_PASS_AT_K: 1.0,
    }


def test_eval_k_is_bounded_in_one_line():
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", ["train.eval_k=0"])
    assert "train.eval_k" in str(err.value) and "0" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", ["train.eval_k=4", "train.eval_every=0"])
    assert str(err.value) == (
        "config error: train.eval_k = 4: has no effect with train.eval_every = 0 (no evaluation); set "
        "train.eval_every or leave train.eval_k at 1"
    )


def scripted(trainer, calls: list):
    """The eval sampler: the constructed texts for the eval rows' answers; other calls go to the real one."""
    generate = trainer.grpo.sampler.generate
    tok = trainer.tokenizer

    def script(prompt_ids, sampling):
        if sampling.seed != evaluation.SEED:
            return generate(prompt_ids, sampling)
        calls.append((len(prompt_ids), sampling))
        texts, _ = constructed([int(row["answer"]) for row in trainer.eval_rows])
        ids = [tok(text, add_special_tokens=False).input_ids for text in texts]
        width = max(map(len, ids))
        padded = torch.tensor([row + [tok.pad_token_id] * (width - len(row)) for row in ids])
        mask = torch.tensor([[1.0] * len(row) + [0.0] * (width - len(row)) for row in ids])
        return Rollout(padded, mask, torch.zeros_like(mask), torch.zeros(len(ids), dtype=torch.bool))

    return script


def test_the_trainer_writes_the_hand_numbers_everywhere(tmp_path, monkeypatch):
    from grpo_studio.engine.run.trainer import Trainer
    from grpo_studio.studio import report
    from grpo_studio.studio.panels import PANELS
    from grpo_studio.studio.rundata import RunData

    run_dir = tmp_path / "run"
    trainer = Trainer(config.load("tiny-arith", [*SHORT, f"train.eval_k={K}"]), run_dir)
    calls = []
    monkeypatch.setattr(trainer.grpo.sampler, "generate", scripted(trainer, calls))
    try:
        assert trainer.run() == "finished"
    finally:
        trainer.close()
    # one sampler call per eval: every eval row, k samples each, the run's temperature
    assert [(n, s.n, s.temperature) for n, s in calls] == [(3, K, trainer.cfg.rollout.temperature)] * 2
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {k: v for k, v in row.items() if k.startswith("eval/")} == pytest.approx({**HAND, **REWARDS}, abs=1e-12)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (before,) = [e for e in events if e["event"] == "eval"]
    assert (before["step"], before["accuracy"], before["pass_at_k"], before["maj_at_k"]) == (0, 0.25, 2 / 3, 1 / 3)
    run = RunData(run_dir)
    run.drain()
    for key, value in HAND.items():
        assert run.series(key) == ([0, 1], [value, value])
    labels = ["accuracy", "answer_accuracy", "pass_at_k", "maj_at_k", *["accuracy 95% CI"] * 2]  # lo, hi: faint
    assert [line.label for line in PANELS["eval"].lines(run)] == labels
    assert PANELS["eval"].present(run)
    assert (report.export(run_dir) / "eval.png").stat().st_size > 0


def test_k_1_writes_eval_accuracy_alone_from_one_sample_per_prompt(tmp_path, monkeypatch):
    """As before train.eval_k: one sampler call with n = 1, seed 10007, and the share of right samples."""
    from grpo_studio.engine.run.trainer import Trainer

    run_dir = tmp_path / "run"
    trainer = Trainer(config.load("tiny-arith", SHORT), run_dir)
    generate, seen = trainer.grpo.sampler.generate, []

    def spy(prompt_ids, sampling):
        out = generate(prompt_ids, sampling)
        if sampling.seed == 10_007:
            seen.append((sampling.n, trainer.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)))
        return out

    monkeypatch.setattr(trainer.grpo.sampler, "generate", spy)
    try:
        trainer.run()
    finally:
        trainer.close()
    by_hand = []
    for n, texts in seen:
        found = [re.search(r"<answer>\s*(-?\d+)\s*</answer>", text) for text in texts]
        right = [bool(f) and int(f.group(1)) == int(r["answer"]) for f, r in zip(found, trainer.eval_rows)]
        assert (n, len(texts)) == (1, 3)
        by_hand.append(sum(right) / 3)
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = {k: v for k, v in row.items() if k.startswith("eval/")}
    shares = (metrics.EVAL_ACCURACY, metrics.EVAL_ANSWER)
    assert set(evals) == {*shares, *(bound for name in shares for bound in metrics.interval(name)), *REWARDS}
    assert evals[metrics.EVAL_ACCURACY] == by_hand[1]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (before,) = [e for e in events if e["event"] == "eval"]
    fields = {k: before[k] for k in before if k not in ("time", "message")}
    assert (fields.pop("event"), fields.pop("step"), fields["accuracy"]) == ("eval", 0, by_hand[0])
    assert set(fields) == {name.removeprefix("eval/") for name in evals}


def test_an_environment_that_ends_on_its_first_step_evaluates_as_plain_sampling(tmp_path):
    """Episodes (env.environment) sample eval_k per row too, in the same order, scoring their last model turn."""
    from grpo_studio.engine.run.trainer import Trainer

    sets = [
        "model.name=smollm2-135m-instruct",
        "data.source=builtin:chat-arith",
        "rewards.funcs=['correctness']",
        "rollout.max_completion_len=12",
        "rollout.backend=hf",
        "data.eval_size=4",
        "data.general_size=4",
        f"train.eval_k={K}",
    ]
    seen = []
    for name, extra in (("plain", []), ("env", [f"env.environment={ENVS}:OneStep"])):
        trainer = Trainer(config.load("chat-arith", [*sets, *extra]), tmp_path / name)
        try:
            seen.append(trainer.eval_metrics())
        finally:
            trainer.close()
    own = ("eval/rewards/OneStep/mean", "eval/general/rewards/OneStep/mean")  # the environment's own reward column
    assert seen[0] == {k: v for k, v in seen[1].items() if k not in own} and set(own) <= set(seen[1])
    assert set(seen[0]) >= {metrics.EVAL_ACCURACY, metrics.EVAL_PASS_AT_K, metrics.general(metrics.EVAL_PASS_AT_K)}
