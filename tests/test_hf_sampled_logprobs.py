"""The hf rollout's draw and μ (engine/sampler/hf.py SampledLogprobs, draw): each token drawn by inverse CDF
from the scores after the warpers, log μ of it kept.

Oracles: the model's own forward over the drawn sequences (teacher forcing), with transformers' temperature,
top-k and top-p warpers applied to each position's logits, gives log μ of every drawn token; and a hand count:
draw's frequencies over many draws from a known distribution."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_studio.contract.config import Config
from grpo_studio.contract.precision_plan import resolve
from grpo_studio.engine.model.policy_loader import load_tokenizer
from grpo_studio.engine.sampler import Sampling
from grpo_studio.engine.sampler.base import NonFiniteSampling
from grpo_studio.engine.sampler.hf import HFBackend, draw, warpers

G, NEW = 3, 7


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 0.9)], ids=["plain", "temperature-top_k-top_p"]
)
def test_mu_is_the_log_softmax_of_the_warped_scores_of_each_drawn_token(smol_tiny_model, temperature, top_k, top_p):
    tok = load_tokenizer(str(smol_tiny_model))
    sampler = HFBackend(str(smol_tiny_model), tok, resolve(Config()))
    turns = ["What is 2+3?", "Natalia sold 48 clips in April and half as many in May. How many in all?"]
    rows = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in turns]
    rows = [list(r["input_ids"]) if not isinstance(r, list) else r for r in rows]
    sampling = Sampling(n=G, max_tokens=NEW, temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    ours = sampler.generate(rows, sampling)

    padded = [r for r in rows for _ in range(G)]
    width = max(map(len, padded))
    drawn = ours.completion_ids
    ids = torch.cat([torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in padded]), drawn], dim=1)
    attention = (torch.arange(ids.shape[1])[None] >= torch.tensor([width - len(r) for r in padded])[:, None]).long()
    with torch.no_grad():
        logits = (
            sampler.model(input_ids=ids, attention_mask=attention, position_ids=(attention.cumsum(-1) - 1).clamp(min=0))
            .logits[:, width - 1 : -1]
            .float()
        )
    expected = torch.empty(drawn.shape)
    for t in range(drawn.shape[1]):
        scores = logits[:, t]
        for warp in warpers(sampling):
            scores = warp(ids[:, : width + t], scores)
        expected[:, t] = torch.log_softmax(scores, -1).gather(1, drawn[:, t : t + 1]).squeeze(1)
    mask = ours.mask.bool()
    assert mask.sum() > G  # not vacuous: tokens were drawn
    assert torch.isfinite(expected[mask]).all()  # every drawn token is inside top-k / top-p
    assert torch.allclose(ours.logprobs[mask], expected[mask], atol=2e-4, rtol=0)
    again = sampler.generate(rows, sampling)
    assert torch.equal(again.completion_ids, drawn)  # the seed fixes the draws


def test_draw_samples_the_distribution_and_never_a_zero_probability_token():
    """200,000 draws from p = (0.5, 0, 0.3, 0.2, 0): each frequency within 5 standard errors of p, none at 0."""
    p = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0])
    n = 200_000
    torch.manual_seed(0)
    counts = torch.bincount(draw(p.log().expand(n, -1)).squeeze(1), minlength=5).double() / n
    assert counts[1] == 0 and counts[4] == 0
    for freq, q in zip(counts.tolist(), p.tolist()):
        assert abs(freq - q) <= 5 * math.sqrt(q * (1 - q) / n)


def test_non_finite_scores_are_a_non_finite_sampling():
    with pytest.raises(NonFiniteSampling, match="^non-finite sampler probabilities$"):
        draw(torch.tensor([[0.0, math.nan, -1.0]]))
