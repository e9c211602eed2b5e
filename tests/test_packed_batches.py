"""train.micro_batch_tokens: length-sorted micro-batches under a token budget, each cut to its own longest
row (engine/rollout/batching.py), against the oracle of one whole padded batch (train.micro_batch_tokens = 0):
the same loss and the same gradient of every trained parameter to 1e-5 (fp32), for every loss_type's
normalisation, on policy and off policy with the KL term; and the same π on every completion token."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import run_cli

from grpo_studio.contract import config
from grpo_studio.engine.rollout.batching import token_budget_groups
from grpo_studio.engine.run.trainer import Trainer

TOL = 1e-5
BUDGET = 40  # token slots per forward: 2-4 rows of the tiny task (prompts 4-6 tokens, completions up to 8)


def test_groups_hold_every_row_once_longest_first_within_the_budget():
    # lengths 7, 6, 8, 6 (prompt + completion); by hand: row 2 alone (2+3 rows' width 3+6 = 9, 2×9 > 16),
    # row 0 alone (with row 1: 2 × (5+4) > 16), rows 1 and 3 together (2 × (5+2) = 14)
    groups = token_budget_groups(torch.tensor([3, 5, 2, 4]), torch.tensor([4, 1, 6, 2]), budget=16)
    assert [g.tolist() for g in groups] == [[2], [0], [1, 3]]
    # a row wider than the budget is a micro-batch of its own
    assert [g.tolist() for g in token_budget_groups(torch.tensor([3, 5]), torch.tensor([4, 1]), budget=4)] == [[0], [1]]
    # a budget above the whole batch: one micro-batch, longest first
    assert [g.tolist() for g in token_budget_groups(torch.tensor([3, 5]), torch.tensor([4, 1]), budget=100)] == [[0, 1]]


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    """One real rollout of the bundled model (16 rows) and a trainer to score it."""
    cfg = config.load(
        "tiny-arith",
        [
            "train.prompts_per_step=4",
            "rollout.num_generations=4",
            "train.steps=1",
            "train.save_every=0",
            "train.eval_every=0",
            "algo.loss_type=grpo",
            "train.score_zero_advantage=true",  # every row run, in the budget's own layout
        ],
    )
    trainer = Trainer(cfg, tmp_path_factory.mktemp("packed") / "run")
    batch = trainer.grpo.rollouts.next(0, 0)
    lengths = batch.rollout.mask.sum(1)
    assert len(set(lengths.tolist())) > 1 and len(set(batch.attention[:, :-8].sum(1).tolist())) > 1  # both vary
    return trainer, batch, lengths


def _accumulate(trainer, batch, lengths, budget, inputs):
    trainer.grpo.cfg.train.micro_batch_tokens = budget
    groups = []
    real_logps = trainer.grpo._logps
    trainer.grpo._logps = lambda model, ids, *a, **k: groups.append(ids.shape) or real_logps(model, ids, *a, **k)
    try:
        passed = trainer.grpo._accumulate(batch.input_ids, batch.attention, inputs, batch.num_items, lengths)
    finally:
        del trainer.grpo._logps
    grads = {n: p.grad.clone() for n, p in trainer.policy.named_parameters() if p.grad is not None}
    return passed.logps, passed.loss, grads, groups


@pytest.mark.parametrize("off_policy", [False, True], ids=["on-policy", "off-policy+kl"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_token_budget_gives_the_whole_batch_loss_and_gradients(rollout, loss_type, off_policy):
    trainer, batch, lengths = rollout
    trainer.grpo.cfg.algo.loss_type = loss_type
    trainer.grpo.cfg.algo.beta = 0.04 if off_policy else 0.0
    inputs = batch.inputs
    if off_policy:  # π_old away from π so the clip acts, and the reference pass (adapters off) runs
        with torch.no_grad():
            pi = trainer.grpo._logps(trainer.policy, batch.input_ids, batch.attention, inputs.mask.shape[1], lengths)[0]
        noise = 0.3 * torch.randn(pi.shape, generator=torch.Generator().manual_seed(3))
        inputs = type(inputs)(**{**vars(inputs), "old_logps": pi + noise})
    try:
        logps0, loss0, grads0, whole = _accumulate(trainer, batch, lengths, 0, inputs)
        logps1, loss1, grads1, parts = _accumulate(trainer, batch, lengths, BUDGET, inputs)
    finally:
        trainer.grpo.cfg.train.micro_batch_tokens, trainer.grpo.cfg.algo.beta = 0, 0.0

    # the budget really split and cut the batch: several forwards, fewer token slots than the padded one
    B, width = batch.input_ids.shape
    policy_calls = parts[::2] if off_policy else parts  # with the KL each policy forward has a reference one
    assert whole[0] == (B, width) and len(policy_calls) > 3
    assert all(rows * cols <= BUDGET for rows, cols in policy_calls)
    assert sum(rows * cols for rows, cols in policy_calls) < B * width
    assert sum(rows for rows, _ in policy_calls) == B

    assert loss1 == pytest.approx(loss0, abs=TOL, rel=0)
    assert grads0 and grads0.keys() == grads1.keys()
    assert max(g.abs().max().item() for g in grads0.values()) > 1e-4  # a real gradient, not zeros
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], atol=TOL, rtol=0)
    tokens = batch.rollout.mask.bool()
    torch.testing.assert_close(logps1[tokens], logps0[tokens], atol=TOL, rtol=0)


CLI_CASES = [
    (["--set", "train.micro_batch_tokens=-1"], "config error: train.micro_batch_tokens = -1: must be >= 0"),
    (
        ["--set", "train.micro_batch_tokens=512", "--set", "train.micro_batch_size=4"],
        (
            "config error: train.micro_batch_tokens = 512 with train.micro_batch_size = 4: micro-batches are cut by one "
            "of them; set the other to 0"
        ),
    ),
]


@pytest.mark.parametrize("args,message", CLI_CASES, ids=["negative", "with-micro_batch_size"])
def test_bad_token_budget_is_one_line_with_exit_2(args, message, tmp_path):
    proc = run_cli("train", "tiny-arith", *args, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [message]


def test_old_logps_under_a_token_budget_equal_the_fixed_chunks(rollout):
    """π_old (several updates per rollout) in _accumulate's token-budget micro-batches: oracle, the same
    rollout scored in fixed row chunks padded to the longest (train.micro_batch_tokens = 0), to 1e-6."""
    trainer, batch, _ = rollout
    fixed = trainer.grpo._old_logps(batch)
    shapes = []
    real_logps = trainer.grpo._logps
    trainer.grpo._logps = lambda model, ids, *a, **k: shapes.append(ids.shape) or real_logps(model, ids, *a, **k)
    trainer.grpo.cfg.train.micro_batch_tokens = BUDGET
    try:
        budgeted = trainer.grpo._old_logps(batch)
    finally:
        trainer.grpo.cfg.train.micro_batch_tokens = 0
        del trainer.grpo._logps
    B, width = batch.input_ids.shape
    assert len(shapes) > 3 and all(rows * cols <= BUDGET for rows, cols in shapes)
    assert sum(rows for rows, _ in shapes) == B and sum(rows * cols for rows, cols in shapes) < B * width
    tokens = batch.rollout.mask.bool()
    assert budgeted.shape == fixed.shape and fixed[tokens].abs().max() > 0.1
    torch.testing.assert_close(budgeted[tokens], fixed[tokens], atol=1e-6, rtol=0)
