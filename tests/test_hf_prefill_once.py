"""The hf rollout computes each distinct prompt once and repeats its KV cache for the G samples
(engine/sampler/hf.py). Oracles: transformers' own `generate` on the same rows without the cache (the same
draws, μ equal to fp32 rounding), and a hand count of the tokens the model's forward takes."""

from __future__ import annotations

import torch

from grpo_studio.contract.config import Config
from grpo_studio.contract.precision_plan import resolve
from grpo_studio.engine.model.policy_loader import load_tokenizer
from grpo_studio.engine.sampler import Sampling
from grpo_studio.engine.sampler.hf import HFBackend

G, NEW = 4, 6


def prompts(tok) -> list[list[int]]:
    """Three chat prompts of different lengths (left padding differs per prompt)."""
    turns = ["What is 2+3?", "Natalia sold 48 clips in April and half as many in May. How many in all?", "Hi"]
    chats = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in turns]
    return [list(c["input_ids"]) if not isinstance(c, list) else c for c in chats]


def counted(model) -> list[int]:
    """Tokens through the model's forward, per call (a hook on the model's input ids)."""
    calls: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, args, kwargs: calls.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    return calls


def test_each_prompt_is_computed_once_and_the_draws_are_those_of_plain_generate(smol_tiny_model):
    tok = load_tokenizer(str(smol_tiny_model))
    sampler = HFBackend(str(smol_tiny_model), tok, resolve(Config()))
    rows = prompts(tok)
    width = max(map(len, rows))
    calls = counted(sampler.model)
    sampling = Sampling(n=G, max_tokens=NEW, min_tokens=NEW, temperature=1.0, seed=7)
    out = sampler.generate(rows, sampling)
    # the prompts less their last token once, then generate: the last prompt token of every row, then NEW - 1 steps
    assert calls == [3 * (width - 1), 3 * G * 1] + [3 * G] * (NEW - 1)

    # the oracle: transformers' generate on the same padded rows, without the cache
    sampler._prompt_cache = lambda *args: None
    calls.clear()
    plain = sampler.generate(rows, sampling)
    assert calls[0] == 3 * G * width  # every row's whole prompt, G times per prompt
    assert torch.equal(out.completion_ids, plain.completion_ids)
    assert torch.allclose(out.logprobs, plain.logprobs, atol=1e-5, rtol=0)
    assert torch.equal(out.mask, plain.mask)


def test_one_sample_per_prompt_takes_no_cache(smol_tiny_model):
    tok = load_tokenizer(str(smol_tiny_model))
    sampler = HFBackend(str(smol_tiny_model), tok, resolve(Config()))
    rows = prompts(tok)
    calls = counted(sampler.model)
    sampler.generate(rows, Sampling(n=1, max_tokens=2, min_tokens=2, seed=1))
    assert calls[0] == 3 * max(map(len, rows))
