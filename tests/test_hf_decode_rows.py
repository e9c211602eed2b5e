"""The hf rollout's own decode loop (engine/sampler/hf.py HFBackend._decode): a row that has ended leaves the
batch. Oracles: transformers' `generate` on the same rows, every row kept until the longest ends, with a logits
processor drawing as the sampler draws (one uniform per row a step, inverse CDF after the warpers), the way the
sampler sampled before its own loop (the same tokens, μ equal to fp32 rounding); and a hand count of the rows
each decode step's forward takes, from the completion lengths."""

from __future__ import annotations

import math

import torch
from transformers import LogitsProcessorList

from grpo_studio.contract.config import Config
from grpo_studio.contract.precision_plan import resolve
from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path
from grpo_studio.engine.prompts import arith
from grpo_studio.engine.sampler import Sampling
from grpo_studio.engine.sampler.hf import HFBackend, draw, warpers

G = 6


class GenerateDraw:
    """generate's last logits processor: draws each row's token (inverse CDF over the warped scores, one uniform
    per row a step), keeps log μ of it and marks it +inf for generate's greedy step."""

    def __init__(self):
        self.logps = []

    def __call__(self, input_ids, scores):
        logp = torch.log_softmax(scores.float(), dim=-1)
        token = draw(logp)
        self.logps.append(logp.gather(1, token).squeeze(1))
        return scores.scatter_(1, token, math.inf)


def with_generate(sampler: HFBackend, rows: list[list[int]], sampling: Sampling):
    """(completion ids [B, T], log μ [B, T]) from transformers' generate, every row kept to the end."""
    pad, eos = sampler.tokenizer.pad_token_id, sampler.tokenizer.eos_token_id
    rows = [r for r in rows for _ in range(sampling.n)]
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    attention = (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    recorder = GenerateDraw()
    torch.manual_seed(sampling.seed)
    out = sampler.model.generate(
        input_ids=ids,
        attention_mask=attention,
        do_sample=False,
        temperature=1.0,
        top_k=None,
        top_p=1.0,
        logits_processor=LogitsProcessorList([*warpers(sampling), recorder]),
        max_new_tokens=sampling.max_tokens,
        min_new_tokens=sampling.min_tokens or None,
        eos_token_id=eos,
        pad_token_id=pad,
    )[:, width:]
    return out, torch.stack(recorder.logps, dim=1)


def tiny_sampler(prompts: int) -> tuple[HFBackend, list[list[int]]]:
    """The hf sampler on the bundled tiny-arith model, and the token ids of its first `prompts` training prompts."""
    path = resolve_model_path("tiny-arith")
    tok = load_tokenizer(path)
    rows = [tok.encode(r["prompt"], add_special_tokens=False) for r in arith.rows("train")[:prompts]]
    return HFBackend(path, tok, resolve(Config())), rows


def assert_drawn_as_generate(sampler: HFBackend, rows: list[list[int]], sampling: Sampling, ours) -> None:
    """Ours' completion ids and log μ equal generate's (keeping every row) wherever ours' rows are live."""
    ids, logps = with_generate(sampler, rows, sampling)
    mask = ours.mask.bool()
    assert torch.equal(torch.where(mask, ids, sampler.tokenizer.pad_token_id), ours.completion_ids)
    assert torch.allclose(torch.where(mask, logps, 0.0), ours.logprobs, atol=1e-5, rtol=0)


def test_ended_rows_leave_the_batch_and_the_draws_are_those_of_generate():
    sampler, rows = tiny_sampler(5)
    sampling = Sampling(n=G, max_tokens=12, temperature=1.6, top_k=20, seed=5)
    batch_rows: list[int] = []
    sampler.model.register_forward_pre_hook(
        lambda _m, args, kwargs: batch_rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    ours = sampler.generate(rows, sampling)
    lengths = ours.mask.sum(1).long()
    assert len(set(lengths.tolist())) > 2  # not vacuous: rows end at several steps
    steps = ours.completion_ids.shape[1]
    # the prompts' cache (one row a prompt), then step t's forward: the rows not ended before t
    assert batch_rows == [len(rows)] + [int((lengths > t).sum()) for t in range(steps)]

    assert_drawn_as_generate(sampler, rows, sampling, ours)


def test_min_tokens_keeps_eos_out_as_generate_does():
    sampler, rows = tiny_sampler(3)
    sampling = Sampling(n=G, max_tokens=8, min_tokens=6, temperature=1.6, seed=2)
    ours = sampler.generate(rows, sampling)
    assert (ours.mask.sum(1) >= 6).all()
    assert_drawn_as_generate(sampler, rows, sampling, ours)
