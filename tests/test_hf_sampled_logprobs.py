"""The hf rollout's μ (engine/sampler/hf.py SampledLogprobs): log μ of each drawn token read one step at a time
from the scores the sampler draws from. Oracle: transformers' own generate with its temperature, top-k and top-p
warpers and output_scores (every step's processed scores kept), on the same rows and seed."""

from __future__ import annotations

import pytest
import torch

from grpo_studio.contract.config import Config
from grpo_studio.contract.precision_plan import resolve
from grpo_studio.engine.policy_loader import load_tokenizer
from grpo_studio.engine.sampler import Sampling
from grpo_studio.engine.sampler.hf import HFBackend

G, NEW = 3, 7


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 0.9)], ids=["plain", "temperature-top_k-top_p"]
)
def test_mu_is_the_log_softmax_of_the_scores_generate_draws_from(smol_tiny_model, temperature, top_k, top_p):
    tok = load_tokenizer(str(smol_tiny_model))
    sampler = HFBackend(str(smol_tiny_model), tok, resolve(Config()))
    sampler._prompt_cache = lambda *args: None  # plain generate on both sides: the same draws by construction
    turns = ["What is 2+3?", "Natalia sold 48 clips in April and half as many in May. How many in all?"]
    rows = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in turns]
    rows = [list(r["input_ids"]) if not isinstance(r, list) else r for r in rows]
    sampling = Sampling(n=G, max_tokens=NEW, temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    ours = sampler.generate(rows, sampling)

    padded = [r for r in rows for _ in range(G)]
    width = max(map(len, padded))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in padded])
    torch.manual_seed(sampling.seed)
    ref = sampler.model.generate(
        input_ids=ids,
        attention_mask=(torch.arange(width)[None] >= torch.tensor([width - len(r) for r in padded])[:, None]).long(),
        do_sample=True,
        temperature=temperature,
        top_k=top_k or None,
        top_p=top_p,
        max_new_tokens=NEW,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    drawn = ref.sequences[:, width:]
    assert torch.equal(ours.completion_ids[:, : drawn.shape[1]], drawn)
    expected = torch.stack(
        [torch.log_softmax(s.float(), -1).gather(1, drawn[:, t : t + 1]).squeeze(1) for t, s in enumerate(ref.scores)],
        dim=1,
    )
    mask = ours.mask[:, : drawn.shape[1]].bool()
    assert mask.sum() > G  # not vacuous: tokens were drawn
    assert torch.allclose(ours.logprobs[:, : drawn.shape[1]][mask], expected[mask], atol=1e-6, rtol=0)
