"""engine/train/flops.py: the model FLOPs of a step counted by hand on tiny models, and the trainer's perf/mfu,
perf/flop and perf/idle_s rows consistent with each other and with the run's own files."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from grpo_studio.contract import config
from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path
from grpo_studio.engine.prompts import prompt_render
from grpo_studio.engine.train import flops

# hidden 16, 2 layers, 4 query heads and 2 KV heads of 8 dims, MLP 24, vocabulary 40, lm_head tied
H, LAYERS, HEADS, KV, D, I, V = 16, 2, 4, 2, 8, 24, 40
PER_LAYER = H * HEADS * D + 2 * H * KV * D + HEADS * D * H + 3 * H * I  # q, k, v, o; gate, up, down
HAND_N = LAYERS * PER_LAYER + V * H  # + lm_head (tied to the embedding: still a matmul)


def tiny_qwen3() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(
        Qwen3Config(
            hidden_size=H,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=KV,
            head_dim=D,
            intermediate_size=I,
            vocab_size=V,
            tie_word_embeddings=True,
        )
    )


def test_matmul_weights_by_hand_with_and_without_lora():
    from peft import LoraConfig, get_peft_model

    model = tiny_qwen3()
    assert flops.matmul_params(model) == HAND_N == 2 * (512 + 2 * 256 + 512 + 3 * 384) + 640
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    assert flops.matmul_params(lora) == HAND_N  # the adapters' own matrices are not counted


def test_real_tokens_count_prompt_attention_and_completion_mask_not_padding():
    # 2 rows: prompt width 3 (row 0 left-padded by 1), completions of width 4 (row 1 stops after 2 tokens)
    attention = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    completion_mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    assert flops.real_tokens(attention, completion_mask).tolist() == [2 + 4, 3 + 2]


@pytest.mark.parametrize(
    "sampled_here,old_logps,reference,lora,per_token",
    [
        (True, False, False, True, {"all": 2, "mine": 4}),  # generate all, LoRA-train mine
        (True, True, True, False, {"all": 2 + 2, "mine": 2 + 6}),  # + π_old of all, reference of mine, full train
        (False, False, False, True, {"all": 0, "mine": 4}),  # a later step of the rollout, or a rollout server
    ],
    ids=["first-step-lora", "pi-old-ref-full", "later-step"],
)
def test_step_flop_by_hand(sampled_here, old_logps, reference, lora, per_token):
    tokens, rows = torch.tensor([6.0, 5.0, 9.0, 4.0]), torch.tensor([1, 3])
    got = flops.grpo_step_flop(
        HAND_N, tokens, rows, sampled_here=sampled_here, old_logps=old_logps, reference=reference, lora=lora
    )
    assert got == HAND_N * (per_token["all"] * 24 + per_token["mine"] * 9)


@pytest.mark.parametrize(("lora", "train"), [(True, 4), (False, 6)])
def test_rows_whose_backward_was_skipped_count_as_a_forward(lora, train):
    """engine/train/zero_advantage.py: row 3 of the step's rows 1 and 3 only went forward (2N per token)."""
    tokens, rows = torch.tensor([6.0, 5.0, 9.0, 4.0]), torch.tensor([1, 3])
    got = flops.grpo_step_flop(
        HAND_N, tokens, rows, sampled_here=False, old_logps=False, reference=False, lora=lora, untrained=rows[1:]
    )
    assert got == HAND_N * (train * 5 + 2 * 4)


def test_trainer_rows_carry_mfu_from_their_own_numbers(tmp_path, monkeypatch):
    """Two steps on one rollout (steps_per_generation 2): the first generates it and computes π_old over it,
    each trains on its half with LoRA, so their FLOPs add up to 2·N per generated token (a prompt once per
    group) and (2 + 4)·N per real token of the rollout, the prompt tokens re-counted from samples.jsonl. perf/mfu = perf/flop / perf/step_s / perf/peak_flop_s.
    Zero-advantage skipping is off, so every row is trained (the skipped rows' count: the test above)."""
    from grpo_studio.engine.run.trainer import Trainer
    from grpo_studio.engine.train import zero_advantage

    monkeypatch.setenv("GRPO_STUDIO_CACHE", str(tmp_path / "cache"))  # the peak measured here, not a cached one
    monkeypatch.setattr(zero_advantage, "skippable", lambda *_: False)
    P, G = 2, 2
    cfg = config.load(
        "tiny-arith",
        [
            "train.steps=2",
            f"train.prompts_per_step={P}",
            f"rollout.num_generations={G}",
            "train.steps_per_generation=2",
            "train.save_every=0",
            "model.lora_rank=8",
        ],
    )
    trainer = Trainer(cfg, tmp_path)
    assert trainer.run() == "finished"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    tok = load_tokenizer(resolve_model_path(cfg.model.name))
    prompt_tokens = sum(
        map(len, prompt_render.encode_prompts(tok, [s["prompt"] for s in samples], cfg.rollout.max_prompt_len))
    )
    assert len(samples) == 2 * P * G  # the one rollout: both steps' prompts, G completions each
    completion_tokens = rows[0]["completion/len_mean"] * len(samples)
    n = flops.matmul_params(trainer.policy)
    generated = prompt_tokens / G + completion_tokens  # each prompt prefilled once for its G completions
    trained = prompt_tokens / G + completion_tokens  # the shared-prefix pass: each group's prompt run once
    assert sum(r["perf/flop"] for r in rows) == pytest.approx(2 * n * generated + (2 + 4) * n * trained)
    assert rows[1]["perf/flop"] < rows[0]["perf/flop"] / 2  # no generation, no π_old on the second step
    for r in rows:
        assert r["perf/peak_flop_s"] == trainer.grpo.peak.flop_s > 0
        assert r["perf/mfu"] == pytest.approx(r["perf/flop"] / r["perf/step_s"] / r["perf/peak_flop_s"])
        assert 0 <= r["perf/idle_s"] <= r["perf/step_s"] - r["perf/trainer_wait_s"] - r["perf/sync_s"]
    assert rows[0]["perf/sync_s"] == 0 < rows[1]["perf/sync_s"]  # the weights go to the sampler after the last
