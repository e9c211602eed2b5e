"""Episodes through the trainer with real samplers: an environment that ends on its first step trains bitwise as
plain GRPO does (the real SmolLM2-135M-Instruct, hf sampler); refusals come before weights load. Episodes through
vLLM and the rollout server: tests/test_episodes_samplers.py. The bookkeeping itself is tests/test_episodes.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_studio.contract import config
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.run.trainer import Trainer

ENVS = Path(__file__).with_name("episode_envs.py")
SMALL = [
    "model.name=smollm2-135m-instruct",
    "data.source=builtin:chat-arith",
    "rewards.funcs=['correctness']",
    "train.steps=1",
    "train.prompts_per_step=2",
    "rollout.num_generations=4",
    "rollout.max_completion_len=12",
    "rollout.backend=hf",
    "train.eval_every=0",
    "train.save_every=0",
    "train.lr=0.01",
]


def _train(run: Path, *sets: str) -> tuple[dict, dict[str, torch.Tensor]]:
    trainer = Trainer(config.load("chat-arith", [*SMALL, *sets]), run)
    trainer.run()
    trained = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    return row, trained


def test_an_environment_that_ends_on_its_first_step_trains_bitwise_as_plain_grpo(tmp_path):
    plain, plain_weights = _train(tmp_path / "plain")
    env, env_weights = _train(tmp_path / "env", f"env.environment={ENVS}:OneStep")
    assert (env["loss"], env["grad_norm"], env["reward/mean"]) == (
        plain["loss"],
        plain["grad_norm"],
        plain["reward/mean"],
    )
    assert all(torch.equal(env_weights[name], plain_weights[name]) for name in plain_weights)
    assert env["env/turns_mean"] == 1.0 and env["env/env_token_frac"] == 0.0
    assert env["completion/len_mean"] == plain["completion/len_mean"]
    samples = [json.loads(line) for line in (tmp_path / "env" / "samples.jsonl").read_text().splitlines()]
    plain_samples = [json.loads(line) for line in (tmp_path / "plain" / "samples.jsonl").read_text().splitlines()]
    assert [s["completion"] for s in samples] == [s["completion"] for s in plain_samples]
    assert {s["episode"]["stop"] for s in samples} <= {"done", "length"}


def test_refusals_come_before_weights_load(tmp_path):
    with pytest.raises(UserError, match="Broken has neither tools"):
        Trainer(config.load("chat-arith", [*SMALL, f"env.environment={ENVS}:Broken"]), tmp_path / "a")
    with pytest.raises(UserError, match="allowed with an environment: off"):
        config.load("chat-arith", [*SMALL, f"env.environment={ENVS}:Adder", "rollout.async_mode=one_step"])
    with pytest.raises(UserError, match=r"the longest episode prompt \(tools listed\) renders to \d+ tokens"):
        Trainer(
            config.load("chat-arith", [*SMALL, f"env.environment={ENVS}:Adder", "rollout.max_prompt_len=40"]),
            tmp_path / "b",
        )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # refused while loading: nothing left
