"""engine/model/grouped_sdpa.py: SDPA reading grouped KV heads in place must compute transformers' own `sdpa`
attention (oracle: transformers' sdpa_attention_forward, which repeats the KV heads under a mask): the same
output bit for bit, the same gradients to fp32 rounding, for a masked decode step, a masked prefill, a maskless
causal prefill; and a GQA model run through it must give the logits and greedy tokens of transformers' own."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpo_studio.engine.model.grouped_sdpa import grouped_sdpa, use_grouped_sdpa

HEADS, KV_HEADS, D = 6, 2, 16


def _inputs(q_len, kv_len, masked, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, HEADS, q_len, D, generator=g, requires_grad=True)
    k, v = (torch.randn(3, KV_HEADS, kv_len, D, generator=g, requires_grad=True) for _ in range(2))
    mask = None
    if masked:  # left padding of 0, 2 and 5 columns, causal over the last q_len keys
        causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
        mask = causal.expand(3, 1, q_len, kv_len).clone()
        for row, pad in enumerate((0, 2, 5)):
            mask[row, :, :, :pad] = False
    return q, k, v, mask


@pytest.mark.parametrize(
    "q_len, kv_len, masked", [(1, 12, True), (7, 12, True), (9, 9, False)], ids=["decode", "prefill", "causal"]
)
def test_grouped_sdpa_computes_transformers_sdpa(q_len, kv_len, masked):
    module = types.SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)
    results = []
    for attention in (sdpa_attention_forward, grouped_sdpa):
        q, k, v, mask = _inputs(q_len, kv_len, masked)
        out, _ = attention(module, q, k, v, mask, scaling=D**-0.5)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        results.append((out.detach(), grads))
    (out0, grads0), (out1, grads1) = results
    assert out1.shape == (3, q_len, HEADS, D)
    assert torch.equal(out1, out0)
    for g1, g0 in zip(grads1, grads0):  # K/V: each group's sum in a different order
        torch.testing.assert_close(g1, g0, rtol=1e-6, atol=1e-6)


def test_a_gqa_model_generates_as_with_transformers_sdpa():
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=HEADS * D,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, 64, (3, 8))
    attention = torch.ones_like(ids)
    attention[1, :3] = 0  # left padding: a mask, so transformers repeats the KV heads
    original = AttentionInterface._global_mapping["sdpa"]
    runs = []
    try:
        for register in (lambda: AttentionInterface.register("sdpa", sdpa_attention_forward), use_grouped_sdpa):
            register()
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=attention).logits
                tokens = model.generate(
                    input_ids=ids, attention_mask=attention, max_new_tokens=6, do_sample=False, pad_token_id=0
                )
            runs.append((logits, tokens))
        assert AttentionInterface._global_mapping["sdpa"] is grouped_sdpa
    finally:
        AttentionInterface.register("sdpa", original)
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=0, atol=1e-6)
    assert torch.equal(runs[1][1], runs[0][1])
