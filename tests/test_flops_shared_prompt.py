"""perf/flop counts a prompt as often as it is computed (engine/train/flops.py): once per group in generation,
and in each forward and backward where the shared-prefix pass runs; by hand."""

from __future__ import annotations

import pytest
import torch

from grpo_studio.contract import config
from grpo_studio.engine.run.trainer import Trainer
from grpo_studio.engine.train import flops

N = 1000
# two groups of two rows, left-padded prompts of width 4: prompt A has 3 real tokens, prompt B 4
IDS = torch.tensor([[0, 5, 6, 7, 9, 9, 0], [0, 5, 6, 7, 8, 9, 9], [1, 2, 3, 4, 9, 0, 0], [1, 2, 3, 4, 8, 8, 8]])
ATTENTION = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
MASK = torch.tensor([[1.0, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]])  # completion spans 2, 3, 1, 3


def test_a_group_shares_its_prompt():
    once = flops.shared_prompt_tokens(IDS, ATTENTION, MASK)
    assert once.tolist() == [3 / 2 + 2, 3 / 2 + 3, 4 / 2 + 1, 4 / 2 + 3]
    assert float(once.sum()) == (3 + 4) + (2 + 3 + 1 + 3)  # each prompt once, every completion
    assert flops.real_tokens(ATTENTION, MASK).tolist() == [3 + 2, 3 + 3, 4 + 1, 4 + 3]


@pytest.mark.parametrize("shared", [True, False])
def test_step_flop_with_the_prompt_once_per_group(shared):
    once, whole = flops.shared_prompt_tokens(IDS, ATTENTION, MASK), flops.real_tokens(ATTENTION, MASK)
    got = flops.grpo_step_flop(
        N,
        once if shared else whole,
        torch.arange(4),
        sampled_here=True,
        old_logps=False,
        reference=False,
        lora=True,
        generated=once,
    )
    trained = 16 if shared else 14 + 9  # the prompts once, or each row's
    assert got == N * (2 * 16 + 4 * trained)


def test_a_run_s_first_step_reports_the_flops_it_computed(tmp_path):
    """tiny-arith, one LoRA step: generation prefills each distinct prompt once, and so does training (the
    shared-prefix pass, train.shared_prefix = auto, runs however short the prompt): each group's prompt counts
    once in both."""
    cfg = config.load("tiny-arith", ["train.steps=1", "train.prompts_per_step=4", "rollout.num_generations=4"])
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.rundir.acquire()
    row = trainer.step()
    trainer.rundir.release()
    batch, n = trainer.grpo.batch, trainer.grpo.matmul_params
    T = batch.rollout.mask.shape[1]
    prompts = {}
    for ids, att in zip(batch.input_ids[:, :-T].tolist(), batch.attention[:, :-T].tolist()):
        prompts[tuple(i for i, a in zip(ids, att) if a)] = sum(att)
    span = flops.spans(batch.rollout.mask).float()
    assert len(prompts) == 4 and batch.input_ids.shape[1] - T < 16
    generated = sum(prompts.values()) + float(span.sum())
    # zero-advantage rows are batched apart and not run (engine/train/zero_advantage.py); the others train,
    # each run group's prompt once (a group's rows share their advantage's zero or not: whole groups run)
    run = batch.inputs.advantages.cpu() != 0
    assert 0 < int(run.sum()) < 16 and all(bool(g.all() or not g.any()) for g in run.view(4, 4))
    run_prompts = {
        tuple(i for i, a in zip(batch.input_ids[r, :-T].tolist(), batch.attention[r, :-T].tolist()) if a)
        for r in run.nonzero().flatten().tolist()
    }
    trained = sum(len(p) for p in run_prompts) + float(span[run].sum())
    trainer.close()
    assert row["perf/flop"] == pytest.approx(n * (2 * generated + 4 * trained))
