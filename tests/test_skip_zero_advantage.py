"""Micro-batches whose rows all have advantage 0 are not trained (engine/train/zero_advantage.py): their backward is
skipped, and by default their forward too, with such rows batched apart from the others, after them; the update is
bitwise the one without skipping.

Oracle: the same run with skipping switched off (zero_advantage.skippable patched to False, the micro-batches
kept): after every step each trained parameter is torch.equal to the oracle's. With train.score_zero_advantage (forwards kept) the
metrics row is the same but for perf/* and mem/* (timings, memory; perf/skipped_backward_rows counts what was
skipped); without it the loss and grad norm are, and the mismatch telemetry is the oracle's over the rows run.
Each case trains one rollout with two updates (train.num_iterations = 2: π_old) on the bundled tiny-arith model
in fp32, with a reward that is constant on about half of the prompts (their groups' advantages are all 0) and
varies on the others, so some micro-batches are skipped and some are not."""

from __future__ import annotations

import copy
import math
import zlib
from types import SimpleNamespace

import pytest
import torch

from grpo_studio.contract import config, precision_plan
from grpo_studio.engine.rollout.batching import micro_batches
from grpo_studio.engine.run.trainer import Trainer
from grpo_studio.engine.train import grpo_step, zero_advantage

STEPS, P, G = 2, 4, 4
SETTINGS = [
    f"train.steps={STEPS}",
    "train.num_iterations=2",
    f"train.prompts_per_step={P}",
    f"rollout.num_generations={G}",
    "train.save_every=0",
    "train.eval_every=0",
    "train.lr=0.01",
    "train.weight_decay=0.1",
    "train.seed=3",
]
MICRO = ["train.micro_batch_size=4"]  # one group per micro-batch
BUDGET = ["train.micro_batch_tokens=40"]  # rows sorted by length, one or two per micro-batch
CASES = {
    "grpo": ["algo.loss_type=grpo", *MICRO],
    "bnpo": ["algo.loss_type=bnpo", *MICRO],
    "dr_grpo": ["algo.name=dr_grpo", *MICRO],
    "dapo": ["algo.name=dapo", *MICRO],
    "bnpo-tokens": ["algo.loss_type=bnpo", *BUDGET],
    "dapo-tokens-full": ["algo.name=dapo", "model.lora_rank=0", *BUDGET],
    "gspo-token_is": ["algo.name=gspo", "algo.is_level=token", *MICRO],
    "pg_seq_is": ["algo.name=pg_seq_is", *MICRO],
    "one-update": ["train.num_iterations=1", *MICRO],  # no π_old: the step's π feeds the mismatch telemetry
    "shuffled-halves": ["train.steps_per_generation=2", "train.micro_batch_size=2"],
}


def half_constant(prompts, completions, **_):
    """1 on every completion of about half of the prompts (no signal); elsewhere a score of the text."""
    return [
        1.0 if zlib.crc32(str(p).encode()) % 2 else float(zlib.crc32(str(c).encode()) % 5)
        for p, c in zip(prompts, completions)
    ]


def constant(prompts, completions, **_):
    return [1.0] * len(completions)


def nothing(prompts, completions, **_):
    return [0.0] * len(completions)


def train(tmp_path, settings, reward, skip: bool, seen: list | None = None):
    """The rows of STEPS steps and the trained parameters after each; `seen` gets the (μ, π, mask) of each
    mismatch measurement."""
    cfg = config.load("tiny-arith", [*SETTINGS, *settings])
    trainer = Trainer(cfg, tmp_path)
    trainer.grpo.rollouts.reward_fns = [("correctness", reward), ("format", nothing)]
    with pytest.MonkeyPatch.context() as patch:
        if not skip:  # the same micro-batches, none of them skipped
            layout = zero_advantage.packable(cfg, trainer.grpo.run.dist, trainer.grpo.model.plan)
            patch.setattr(zero_advantage, "packable", lambda *_: layout)
            patch.setattr(zero_advantage, "skippable", lambda *_: False)
        if seen is not None:
            measure = grpo_step.mismatch_metrics
            patch.setattr(grpo_step, "mismatch_metrics", lambda *args: seen.append(args) or measure(*args))
        trainer.rundir.acquire()
        try:
            start = [p.detach().clone() for p in trainer.grpo.params]
            rows, params = [], []
            for _ in range(STEPS):
                rows.append(trainer.step())
                params.append([p.detach().clone() for p in trainer.grpo.params])
        finally:
            trainer.rundir.release()
    return rows, params, start


def same_row(row: dict) -> dict:
    """A row less what may differ between equal updates (timings, memory); NaN made comparable."""
    keep = {k: v for k, v in row.items() if not k.startswith(("perf/", "mem/")) and k != "time"}
    return {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in keep.items()}


def assert_same_updates(ours, theirs, whole_row=True):
    (rows, params, _), (their_rows, their_params, _) = ours, theirs
    for k in range(STEPS):
        if whole_row:
            assert same_row(rows[k]) == same_row(their_rows[k]), f"step {k + 1}"
        assert (rows[k]["loss"], rows[k]["grad_norm"]) == (their_rows[k]["loss"], their_rows[k]["grad_norm"])
        for p, q in zip(params[k], their_params[k]):
            assert torch.equal(p, q), f"step {k + 1}"
        assert their_rows[k]["perf/skipped_backward_rows"] == 0.0


def assert_mismatch_over_the_rows_run(ours, theirs):
    """Each mismatch measurement sees the oracle's μ, and its π and mask on the rows run (a row not run has
    a mask of 0 there)."""
    assert len(ours) == len(theirs) > 0
    for (mu, pi, mask), (their_mu, their_pi, their_mask) in zip(ours, theirs):
        assert torch.equal(mu, their_mu)
        left_out = (mask.sum(1) == 0) & (their_mask.sum(1) > 0)
        assert torch.equal(mask, their_mask * ~left_out[:, None])
        run = mask.bool()
        assert torch.equal(pi[run], their_pi[run])


@pytest.mark.parametrize("case", CASES)
def test_skipping_zero_advantage_micro_batches_is_bitwise_exact(tmp_path, case):
    scoring = [*CASES[case], "train.score_zero_advantage=true"]  # the micro-batches as without skipping
    scored = train(tmp_path / "score", scoring, half_constant, skip=True)
    assert_same_updates(scored, train(tmp_path / "score-full", scoring, half_constant, skip=False))
    skipped = sum(r["perf/skipped_backward_rows"] for r in scored[0])
    assert 0 < skipped < STEPS * P * G, "some micro-batches skipped, some trained"
    assert sum(r["perf/skipped_forward_rows"] for r in scored[0]) == 0

    seen, their_seen = [], []  # the default: zero-advantage rows gathered, and not run
    ours = train(tmp_path / "skip", CASES[case], half_constant, skip=True, seen=seen)
    full = train(tmp_path / "full", CASES[case], half_constant, skip=False, seen=their_seen)
    assert_same_updates(ours, full, whole_row=False)
    assert (
        0
        < sum(r["perf/skipped_forward_rows"] for r in ours[0])
        <= sum(r["perf/skipped_backward_rows"] for r in ours[0])
    )
    assert_mismatch_over_the_rows_run(seen, their_seen)


def test_every_micro_batch_skipped_still_steps_adamw(tmp_path):
    """A constant reward: every advantage is 0, no backward runs, and AdamW still takes its step (weight decay
    on zero gradients) exactly as with the backward of zeros."""
    settings = ["model.lora_rank=0", *MICRO]
    ours = train(tmp_path / "skip", settings, constant, skip=True)
    assert_same_updates(ours, train(tmp_path / "full", settings, constant, skip=False), whole_row=False)
    rows, params, start = ours
    assert [r["perf/skipped_backward_rows"] for r in rows] == [float(P * G)] * STEPS
    assert [r["perf/skipped_forward_rows"] for r in rows] == [float(P * G - 4)] * STEPS  # the first one runs
    assert all(r["grad_norm"] == 0.0 for r in rows)
    assert any(not torch.equal(p, q) for p, q in zip(params[-1], start)), "weight decay moved the weights"


def test_a_parameter_only_a_skipped_loss_reaches_gets_a_zero_grad():
    """As a backward of zeros would give it (AdamW steps a zero .grad, skips a None): a mixture-of-experts
    expert only the skipped micro-batch was routed to. A parameter no loss reaches keeps None."""
    torch.manual_seed(0)
    ours = [torch.nn.Linear(3, 3) for _ in range(3)]  # trained, reached only by the skipped loss, unused
    theirs = copy.deepcopy(ours)
    x = torch.randn(2, 3)

    def losses(trained, only_skipped, _unused):
        return trained(x).sum(), (only_skipped(trained(x)) * torch.zeros(2, 1)).sum()

    live, zero = losses(*ours)
    live.backward()
    skipped = zero_advantage.Skipped()
    skipped.add(zero, rows=torch.tensor([4, 7]))
    skipped.fill()
    for loss in losses(*theirs):
        loss.backward()
    for mine, other in zip(ours, theirs):
        for p, q in zip(mine.parameters(), other.parameters()):
            assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad))
    assert ours[2].weight.grad is None and torch.equal(ours[1].weight.grad, torch.zeros(3, 3))
    assert skipped.rows().tolist() == [4, 7]


@pytest.mark.parametrize(
    ("settings", "world", "skips"),
    [([], 1, True), (["algo.beta=0.04"], 1, False), (["model.dtype=fp16"], 1, False), ([], 2, False)],
    ids=["fp32", "kl-to-reference", "fp16-loss-scaling", "data-parallel"],
)
def test_skipping_is_off_where_it_would_not_be_exact(settings, world, skips):
    cfg = config.load("tiny-arith", settings)
    assert zero_advantage.skippable(cfg, SimpleNamespace(world=world), precision_plan.resolve(cfg)) is skips


def test_zero_gradient_needs_every_advantage_and_the_loss_zero():
    assert zero_advantage.zero_gradient(torch.tensor([0.0, -0.0]), -0.0)
    assert not zero_advantage.zero_gradient(torch.tensor([0.0, 1e-30]), 0.0)
    assert not zero_advantage.zero_gradient(torch.tensor([0.0, math.nan]), 0.0)
    assert not zero_advantage.zero_gradient(torch.zeros(2), math.nan)  # 0·inf IS weight: the step is skipped


def test_zero_advantage_rows_fill_micro_batches_of_their_own():
    """Hand-made: rows 1, 2 and 4 have advantage 0. By size 2: the others [0, 3], [5], then [1, 2], [4]. Under a
    budget of 12 tokens (rows longest first, each micro-batch's rows × its widest prompt + completion within it),
    each part packed on its own, the zero rows last. With no zero rows: size rows at a time, in order."""
    zero = torch.tensor([0.5, 0.0, 0.0, -1.0, 0.0, 2.0]) == 0
    assert [g.tolist() for g in micro_batches(zero, 2)] == [[0, 3], [5], [1, 2], [4]]
    prompts, completions = torch.tensor([2] * 6), torch.tensor([1, 4, 2, 3, 1, 2])
    by_tokens = micro_batches(zero, 0, prompts, completions, budget=12)
    assert [g.tolist() for g in by_tokens] == [[3, 5], [0], [1, 2], [4]]
    assert [g.tolist() for g in micro_batches(torch.zeros(6, dtype=torch.bool), 4)] == [[0, 1, 2, 3], [4, 5]]


@pytest.mark.parametrize(
    ("settings", "world", "packs"),
    [
        (["algo.loss_type=grpo"], 1, True),
        (["algo.loss_type=dapo"], 1, True),
        (["algo.loss_type=dr_grpo"], 1, True),
        (["algo.loss_type=bnpo", "train.micro_batch_size=4"], 1, False),
        (["algo.loss_type=bnpo", "train.micro_batch_tokens=40"], 1, True),
        (["algo.beta=0.04"], 1, False),
        (["algo.loss_type=dapo"], 2, False),
        (["model.dtype=fp16"], 1, False),  # not skipped: a micro-batch of their own would run all the same
    ],
    ids=[
        "grpo",
        "dapo",
        "dr_grpo",
        "bnpo-micro-batch-mean",
        "bnpo-token-budget",
        "kl-to-reference",
        "two-ranks",
        "fp16-loss-scaling",
    ],
)
def test_zero_advantage_rows_are_gathered_only_where_the_update_stays_the_same(settings, world, packs):
    cfg = config.load("tiny-arith", settings)
    dist = SimpleNamespace(world=world)
    assert zero_advantage.packable(cfg, dist, precision_plan.resolve(cfg)) is packs
    scoring = config.load("tiny-arith", [*settings, "train.score_zero_advantage=true"])
    assert not zero_advantage.packable(scoring, dist, precision_plan.resolve(scoring))


def test_one_micro_batch_runs_when_every_one_could_be_skipped():
    zero, signal = torch.zeros(4), torch.tensor([0.0, 1.0, 0.0, 0.0])
    parts = [torch.tensor([0, 1]), torch.tensor([2, 3])]
    assert zero_advantage.unscored(parts, zero, skip=True, score=False) == [False, True]
    assert zero_advantage.unscored(parts, signal, skip=True, score=False) == [False, True]
    assert zero_advantage.unscored(parts, zero, skip=True, score=True) == [False, False]
    assert zero_advantage.unscored(parts, zero, skip=False, score=False) == [False, False]
