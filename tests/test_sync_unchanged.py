"""The weight sync after a step that left LoRA's adapters as they were is skipped (engine/train/grpo_step.py
SyncedAdapters). Oracles: counts of the sampler's load_weights calls, and the sampler's weights against the
policy's exported (merged) weights, tensor by tensor, after the skipped syncs."""

from __future__ import annotations

import torch

from grpo_studio.contract import config
from grpo_studio.engine.model.weights import export_weights
from grpo_studio.engine.run.trainer import Trainer

SMALL = [
    "train.prompts_per_step=4",
    "rollout.num_generations=4",
    "rollout.max_completion_len=6",
    "train.save_every=0",
    "train.eval_every=0",
    "train.seed=3",  # its rollouts have a reward spread: every step moves the adapters
]


def steps(tmp_path, n: int, *overrides: str) -> tuple[Trainer, list[int], list[dict]]:
    trainer = Trainer(config.load("tiny-arith", [*SMALL, f"train.steps={n}", *overrides]), tmp_path)
    loads: list[int] = []
    sampler = trainer.grpo.sampler
    load = sampler.load_weights
    sampler.load_weights = lambda w: loads.append(trainer.step_no) or load(w)
    trainer.rundir.acquire()
    try:
        rows = [trainer.step() for _ in range(n)]
    finally:
        trainer.rundir.release()
    return trainer, loads, rows


def test_steps_of_zero_advantage_leave_the_adapters_and_skip_the_sync(tmp_path):
    """Every reward weighted 0: every advantage is 0, no step moves a weight; the first sync runs (nothing taken
    yet), the next two are skipped, and the sampler holds the policy's weights all the same."""
    trainer, loads, rows = steps(tmp_path / "zero", 3, "rewards.weights=[0.0, 0.0]")
    assert loads == [0]
    assert [r["policy/lag"] for r in rows] == [0.0, 0.0, 0.0]  # every rollout sampled by the current weights
    assert trainer.grpo.policy_version == 3  # numbered as if each sync ran
    held = dict(trainer.grpo.sampler.model.named_parameters())
    exported = dict(export_weights(trainer.policy))
    assert exported and all(torch.equal(held[name].float(), w.float()) for name, w in exported.items())


def test_steps_that_move_the_adapters_sync_every_time(tmp_path):
    trainer, loads, rows = steps(tmp_path / "moved", 3)
    assert all(r["perf/skipped_backward_rows"] < 16 for r in rows)  # not vacuous: each step trained rows
    assert loads == [0, 1, 2]
