"""The chunked (recomputing) log-prob path against the materialised one: same values, same
entropies, same gradients, for LoRA and full fine-tuning (tied lm_head/embedding)."""

from __future__ import annotations

import pytest
import torch

from grpo_studio.engine.contract import config
from grpo_studio.engine.batching import join_prompt_completion
from grpo_studio.engine.logprobs import ChunkedLogSoftmax, token_logprobs
from grpo_studio.engine.contract.precision import resolve
from grpo_studio.engine.policy_loader import load_policy, load_tokenizer, resolve_model_path


def _batch(tokenizer):
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ("1+2=", "23+45=", "7+30=")]
    completions = torch.tensor([tokenizer.encode(c, add_special_tokens=False) + [tokenizer.eos_token_id] * k
                                for c, k in (("<answer>3</answer>", 3), ("<answer>68</answer>", 2),
                                             ("<answer>37</answer>", 2))])
    return join_prompt_completion(prompts, completions, 1, tokenizer.pad_token_id), completions.shape[1]


@pytest.mark.parametrize("lora_rank", [16, 0])
def test_chunked_matches_materialised_values_and_gradients(lora_rank):
    path = resolve_model_path("tiny-arith")
    tokenizer = load_tokenizer(path)
    (ids, attn), T = _batch(tokenizer)
    weights = torch.randn(ids.shape[0], T, generator=torch.Generator().manual_seed(0))
    results = []
    for chunk in (0, 5):  # 5 does not divide 3×7 = 21 tokens: a ragged last chunk
        torch.manual_seed(0)
        cfg = config.load("tiny-arith", [f"model.lora_rank={lora_rank}"])
        policy = load_policy(cfg, path, resolve(cfg))
        logps, entropy = token_logprobs(policy, ids, attn, T, temperature=0.7, with_entropy=True, logits_chunk=chunk)
        (logps * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        results.append((logps.detach(), entropy, grads))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-5)
    assert g0.keys() == g1.keys() and len(g0) > 0
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-6)


def test_chunked_gradient_matches_autograd_of_the_formula():
    """Oracle: autograd through log_softmax(h·Wᵀ/τ)[y] on a small random problem, in float64."""
    g = torch.Generator().manual_seed(1)
    h = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, 11, (7,), generator=g)
    upstream = torch.randn(7, dtype=torch.float64, generator=g)
    ref = torch.log_softmax(h @ w.t() / 0.5, dim=-1).gather(1, y[:, None]).squeeze(1)
    ref_grads = torch.autograd.grad((ref * upstream).sum(), (h, w))
    ours, _ = ChunkedLogSoftmax.apply(h, w, y, 0.5, 3)
    our_grads = torch.autograd.grad((ours * upstream.float()).sum(), (h, w))
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=1e-6)
    for a, b in zip(our_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
