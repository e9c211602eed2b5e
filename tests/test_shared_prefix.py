"""Shared-prefix log-probs (train.shared_prefix, engine/train/logprobs.py `_shared_prefix_hidden`): each distinct
prompt run once and its KV cache indexed out to its G completions must give the plain path's log-probs,
entropies and gradients (oracle: the plain single-pass forward), fp32 to 1e-5, with left-padded prompts of
different lengths, shuffled rows, LoRA and full fine-tune, materialised and chunked heads; and be refused in
one line where it cannot be exact."""

from __future__ import annotations

import pytest
import torch
from prompt_groups import grouped_batch

from grpo_studio.contract import config
from grpo_studio.contract.precision_plan import resolve
from grpo_studio.engine.model.policy_loader import load_policy, resolve_model_path
from grpo_studio.engine.train.logprobs import prefix_groups, shared_prefix_refusal, token_logprobs

G, T = 3, 9


@pytest.fixture(scope="module")
def batch():
    ids, att, order, g = grouped_batch(G, T)
    return ids[order], att[order], torch.randn(ids.shape[0], T, generator=g)


def _run(lora_rank, shared, chunk, batch):
    ids, att, upstream = batch
    torch.manual_seed(0)
    cfg = config.load("tiny-arith", [f"model.lora_rank={lora_rank}"])
    policy = load_policy(cfg, resolve_model_path("tiny-arith"), resolve(cfg))
    shapes = []
    policy.get_input_embeddings().register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    logps, entropy = token_logprobs(
        policy, ids, att, T, temperature=0.8, with_entropy=True, logits_chunk=chunk, shared_prefix=shared
    )
    width = ids.shape[1] - T  # shared: the 3 distinct prompts once, then the 9 completions on their cache
    assert [s for s in shapes if s != (1, ids.shape[1])] == ([(3, width), (9, T)] if shared else [(9, ids.shape[1])])
    (logps * upstream).sum().backward()
    return logps.detach(), entropy, {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


def test_batch_has_repeated_left_padded_prompts_of_different_lengths(batch):
    ids, att, _ = batch
    unique, rows = prefix_groups(ids, att, T)
    assert unique.shape[0] == 3 and torch.bincount(rows).tolist() == [G] * 3
    assert sorted(set(att[:, :-T].sum(1).tolist())) == [4, 6, 7]


@pytest.mark.parametrize("lora_rank, chunk", [(16, 0), (0, 0), (16, 5)], ids=["lora", "full", "lora-chunked"])
def test_shared_prefix_equals_plain_values_and_gradients(batch, lora_rank, chunk):
    plain, shared = _run(lora_rank, False, chunk, batch), _run(lora_rank, True, chunk, batch)
    # fp32 rounding of two summation orders: on this VM's CPU one log-prob of magnitude 35 differs by 1.5e-5
    # (4 ulps, 4.4e-7 relative), so 1e-5 absolute plus 1e-6 relative; a wrong position or mask is far larger
    torch.testing.assert_close(shared[0], plain[0], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(shared[1], plain[1], rtol=1e-6, atol=1e-5)
    assert plain[2].keys() == shared[2].keys() and len(plain[2]) > 0
    if lora_rank:
        assert all("lora_" in n for n in plain[2])
    else:
        assert "model.embed_tokens.weight" in plain[2]  # gradients reach the prompt pass's embeddings
    for name, grad in plain[2].items():
        torch.testing.assert_close(shared[2][name], grad, rtol=1e-5, atol=1e-5 * grad.abs().max().item())


def _tiny(arch: str, **kw):
    import transformers

    common = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
    )
    if arch == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**common, sliding_window=8, **kw))
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, **kw))


@pytest.mark.parametrize(
    "model, line",
    [
        (lambda: _tiny("qwen3"), None),
        (
            lambda: _tiny("qwen3", attn_implementation="flex_attention"),
            "attention implementation 'flex_attention' (supported: eager, sdpa)",
        ),
        (
            lambda: _tiny(
                "qwen3", layer_types=["full_attention", "sliding_attention"], use_sliding_window=True, sliding_window=8
            ),
            "layer types ['sliding_attention'] (supported: full_attention only)",
        ),
    ],
)
def test_refusal_names_what_cannot_be_shared(model, line):
    assert shared_prefix_refusal(model()) == line


def test_on_is_refused_in_one_line_where_it_cannot_be_exact():
    from grpo_studio.contract.errors import UserError
    from grpo_studio.engine.train.logprobs import use_shared_prefix

    model = _tiny("qwen3", attn_implementation="flex_attention")
    ids = torch.ones(2, 20, dtype=torch.long)
    with pytest.raises(UserError) as err:
        use_shared_prefix("on", model, ids, torch.ones_like(ids), 4)
    assert str(err.value) == (
        "config error: train.shared_prefix = 'on': Qwen3ForCausalLM has attention implementation "
        "'flex_attention' (supported: eager, sdpa); set train.shared_prefix = auto or off"
    )
    assert use_shared_prefix("auto", model, ids, torch.ones_like(ids), 4) is False


def test_on_with_gradient_checkpointing_exits_2_with_one_line(tmp_path, capsys):
    from grpo_studio.cli.main import main

    rc = main(
        [
            "train",
            "tiny-arith",
            "--set",
            "train.shared_prefix=on",
            "--set",
            "model.gradient_checkpointing=true",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert (rc, capsys.readouterr().err) == (
        2,
        "config error: train.shared_prefix = 'on': with "
        "model.gradient_checkpointing = true transformers turns the prompt "
        "pass's KV cache off; set auto or off\n",
    )


@pytest.mark.parametrize(
    "prompt_len, repeats, expected",
    [(16, 2, True), (1, 2, True), (16, 1, False)],
    ids=["long-repeated", "one-token-repeated", "no-repeats"],
)
def test_auto_is_on_where_a_prompt_repeats(prompt_len, repeats, expected):
    from grpo_studio.engine.train.logprobs import use_shared_prefix

    prompts = torch.arange(3 * prompt_len).view(3, prompt_len).repeat_interleave(repeats, 0)
    ids = torch.cat([prompts, torch.zeros(prompts.shape[0], 4, dtype=torch.long)], 1)
    assert use_shared_prefix("auto", _tiny("qwen3"), ids, torch.ones_like(ids), 4) is expected
    assert use_shared_prefix("off", _tiny("qwen3"), ids, torch.ones_like(ids), 4) is False


def test_shared_prefix_runs_in_the_trainer(tmp_path, monkeypatch):
    """Its numbers equal the plain path's (above); here: the trainer takes it for every log-prob pass (zero-advantage
    skipping off, so each pass has every row)."""
    from grpo_studio.engine.run.trainer import Trainer
    from grpo_studio.engine.train import logprobs, zero_advantage

    monkeypatch.setattr(zero_advantage, "skippable", lambda *_: False)
    calls = []
    shared = logprobs._shared_prefix_hidden
    monkeypatch.setattr(logprobs, "_shared_prefix_hidden", lambda *a: calls.append(a[1].shape[0]) or shared(*a))
    trainer = Trainer(
        config.load(
            "tiny-arith",
            [
                "train.steps=1",
                "train.prompts_per_step=2",
                "rollout.num_generations=4",
                "train.eval_every=0",
                "train.save_every=0",
                "rollout.backend=hf",
                "train.shared_prefix=on",
            ],
        ),
        tmp_path / "run",
    )
    trainer.run()
    trainer.close()
    assert calls and all(rows == 8 for rows in calls)  # 2 prompts × 4 completions per pass
