"""The supervised warm-up (engine/train/warmup.py) against oracles: transformers' own assistant-token mask of the
conversation, a hand computation of the cross-entropy, the trainer's first step sampled by the warmed-up
weights (mismatch k3 at fp32 rounding), and one-line refusals. SmolLM2's real tokenizer; a tiny Llama for
the training."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_studio.contract import bundled, config
from grpo_studio.contract.environments import load as load_env
from grpo_studio.contract.environments import schemas
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path
from grpo_studio.engine.prompts import tasks
from grpo_studio.engine.prompts.prompt_render import render_ids
from grpo_studio.engine.rollout import episodes
from grpo_studio.engine.run.trainer import Trainer
from grpo_studio.engine.train import warmup

TOOLS_TEMPLATE = (bundled.PRESETS / "templates" / "chatml_tools.jinja").read_text()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path("smollm2-135m-instruct"))


def _renderer(tok, template, tools):
    return lambda messages, generation: render_ids(tok, messages, template, tools, generation)


@pytest.mark.parametrize("name, env", [("builtin:tool-arith-demos", "calculator"), ("builtin:lookup-demos", "lookup")])
def test_the_trained_tokens_are_transformers_assistant_tokens_mask(tok, name, env):
    environment = load_env(env)
    tools = schemas(environment.factory(), environment)
    for row in tasks.TASKS[name]()[:5]:
        example = warmup.transcript(_renderer(tok, TOOLS_TEMPLATE, tools), row["messages"], tok.eos_token_id, name)
        oracle = tok.apply_chat_template(
            row["messages"],
            tools=tools,
            chat_template=TOOLS_TEMPLATE,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        # the whole conversation as rendered, less the "\n" after the last end-of-turn (never trained)
        assert example.ids == oracle["input_ids"][:-1] and tok.decode(oracle["input_ids"][-1:]) == "\n"
        assert example.trained == oracle["assistant_masks"][:-1]
        trained = tok.decode([t for t, m in zip(example.ids, example.trained, strict=True) if m])
        call, answer = row["messages"][1]["tool_calls"][0]["function"], row["messages"][3]["content"]
        assert trained == (
            f'<tool_call>{{"name": "{call["name"]}", "arguments": {json.dumps(call["arguments"])}}}</tool_call>'
            f"<|im_end|>{answer}<|im_end|>"
        )


def test_smollm2s_own_template_trains_each_reply_and_its_end_of_turn(tok):
    messages = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"},
        {"role": "assistant", "content": "6"},
    ]
    example = warmup.transcript(_renderer(tok, None, None), messages, tok.eos_token_id, "x")
    assert (
        example.ids == tok.apply_chat_template(messages, return_dict=False)[:-1]
    )  # the whole render, less its final "\n"
    spans = [tok.decode([t for t, m in zip(example.ids, example.trained, strict=True) if m])]
    assert spans == ["4<|im_end|>6<|im_end|>"]


def test_bad_conversations_and_sources_are_one_line(tok):
    render = _renderer(tok, "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}", None)
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(UserError, match="not prefix-preserving"):
        warmup.transcript(render, messages, tok.eos_token_id, "demos.jsonl")
    with pytest.raises(UserError, match=r"warmup.source = 'x.jsonl': a conversation has no assistant turn"):
        warmup.transcript(_renderer(tok, None, None), messages[:1], tok.eos_token_id, "x.jsonl")
    cfg = config.load("chat-arith", ["warmup.source=builtin:chat-arith"])
    with pytest.raises(UserError) as err:
        warmup.prepare(cfg, tok, None)
    assert str(err.value) == (
        "config error: warmup.source = 'builtin:chat-arith': needs a `messages` column of whole conversations; "
        "found: prompt, answer"
    )
    cfg = config.load("tool-calc", ["rollout.max_prompt_len=100", "rollout.max_completion_len=60"])
    calculator = load_env("calculator")
    tools = schemas(calculator.factory(), calculator)
    longest = max(  # each whole conversation as transformers renders it, less its final "\n"
        len(tok.apply_chat_template(d["messages"], tools=tools, chat_template=TOOLS_TEMPLATE, return_dict=False)) - 1
        for d in tasks.tool_arith_demos()
    )
    with pytest.raises(UserError) as err:
        warmup.prepare(cfg, tok, episodes.Episodes(calculator, tok, TOOLS_TEMPLATE, cfg.env, 60))
    assert str(err.value) == (
        f"config error: warmup.source = 'builtin:tool-arith-demos': the longest conversation renders to {longest} "
        "tokens; allowed: at most rollout.max_prompt_len + rollout.max_completion_len = 160"
    )
    with pytest.raises(UserError, match=r"^config error: warmup.source = 'builtin:nope': unknown built-in task"):
        warmup.prepare(config.load("chat-arith", ["warmup.source=builtin:nope"]), tok, None)


def test_warmup_keys_without_a_source_or_with_data_parallel_are_refused():
    with pytest.raises(UserError) as err:
        config.load("chat-arith", ["warmup.steps=5"])
    assert str(err.value) == (
        "config error: warmup.steps = 5: has no effect without warmup.source (the conversations to imitate); "
        "set warmup.source or leave warmup.steps at 30 (no warm-up: warmup.steps, warmup.lr and warmup.batch_size "
        "at their defaults)"
    )
    with pytest.raises(UserError, match=r"^config error: train.parallel = 'ddp': warmup.source = 'builtin:tool"):
        config.load("chat-arith", ["warmup.source=builtin:tool-arith-demos", "train.parallel=ddp"])


def test_the_loss_is_the_cross_entropy_of_the_assistant_tokens(tok, smol_tiny_model):
    model = AutoModelForCausalLM.from_pretrained(smol_tiny_model, dtype=torch.float32)
    rows = tasks.TASKS["builtin:tool-arith-demos"]()[:3]
    render = _renderer(tok, TOOLS_TEMPLATE, None)
    examples = [warmup.transcript(render, r["messages"], tok.eos_token_id, "x") for r in rows]
    ids, attention, labels = warmup.tensors(examples, tok.pad_token_id, "cpu")
    loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    # by hand: -log p(token t | tokens < t) over the trained tokens of every row, averaged over them
    terms = []
    for e in examples:
        logp = torch.log_softmax(model(input_ids=torch.tensor([e.ids])).logits[0].float(), -1)
        terms += [-logp[t - 1, e.ids[t]] for t in range(1, len(e.ids)) if e.trained[t]]
    assert torch.allclose(loss, torch.stack(terms).mean(), rtol=1e-5)
    assert not any(e.trained[0] for e in examples)


SMALL = [
    "env.environment=calculator",
    "data.source=builtin:tool-arith",
    "rewards.funcs=['correctness']",
    "warmup.source=builtin:tool-arith-demos",
    "warmup.steps=3",
    "warmup.batch_size=2",
    "warmup.lr=0.01",
    "train.steps=1",
    "train.prompts_per_step=2",
    "rollout.num_generations=2",
    "rollout.max_prompt_len=256",
    "rollout.max_completion_len=24",  # 256 + 24 holds the longest demonstration (276 tokens)
    "rollout.backend=hf",
    "train.eval_every=0",
    "train.save_every=0",
]


def test_the_run_warms_up_then_samples_its_first_step_with_the_warmed_up_weights(tmp_path, smol_tiny_model):
    cfg = config.load("chat-arith", [f"model.name={smol_tiny_model}", *SMALL])
    trainer = Trainer(cfg, tmp_path / "run")
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}
    try:
        trainer.run()
    finally:
        trainer.close()
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["event"] == "warmup"]
    assert [e["warmup_step"] for e in events if e["event"] == "warmup"] == [1, 2, 3]
    assert losses[-1] < losses[0]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    # the sampler's log-probs are the trainer's at fp32 rounding: it sampled the warmed-up weights, not the
    # loaded ones (which the warm-up moved far: lr 0.01)
    assert row["mismatch/k3"] < 1e-9
    moved = max((p.detach() - before[n]).abs().max() for n, p in trainer.policy.named_parameters() if n in before)
    assert moved > 1e-3


def test_a_step_takes_batch_size_conversations_and_moves_each_weight_by_lr(tok, smol_tiny_model):
    from grpo_studio.contract import precision_plan

    model = AutoModelForCausalLM.from_pretrained(smol_tiny_model, dtype=torch.float32)
    cfg = config.load(
        "chat-arith", ["warmup.source=builtin:tool-arith-demos", "warmup.lr=0.003", "warmup.batch_size=3"]
    )
    render = _renderer(tok, TOOLS_TEMPLATE, None)
    examples = [warmup.transcript(render, r["messages"], tok.eos_token_id, "x") for r in tasks.tool_arith_demos(6)]
    first = next(warmup.batches(examples, 3, 1, cfg.train.seed))
    assert len(first) == 3
    with torch.no_grad():
        expected = model(*warmup.tensors(first, tok.pad_token_id, "cpu")[:2], labels=warmup.tensors(first, 0, "cpu")[2])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = []
    cfg.warmup.steps = 1
    warmup.run(
        examples, model, cfg, precision_plan.resolve(cfg), tok.pad_token_id, "cpu", lambda k, loss: seen.append(loss)
    )
    assert seen == [pytest.approx(float(expected.loss), rel=1e-6)]
    # AdamW's first step moves a weight by lr · g/(|g| + eps): lr wherever its gradient is not tiny
    steps = torch.cat([(p.detach() - before[n]).abs().flatten() for n, p in model.named_parameters()])
    assert steps.max() <= 0.003 * (1 + 1e-4) and abs(float(steps.median()) - 0.003) < 0.003 * 0.01
