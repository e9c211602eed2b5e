"""The chunked (recomputing) log-prob path against the materialised one: same values, same
entropies, same gradients, for LoRA and full fine-tuning (tied lm_head/embedding)."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_studio.contract import config
from grpo_studio.contract.precision_plan import resolve
from grpo_studio.engine.model.policy_loader import load_policy, load_tokenizer, resolve_model_path
from grpo_studio.engine.rollout.batching import join_prompt_completion
from grpo_studio.engine.train.chunked_logsoftmax import ChunkedLogSoftmax
from grpo_studio.engine.train.logprobs import fused_logps, token_logprobs


def _batch(tokenizer):
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ("1+2=", "23+45=", "7+30=")]
    completions = torch.tensor(
        [
            tokenizer.encode(c, add_special_tokens=False) + [tokenizer.eos_token_id] * k
            for c, k in (("<answer>3</answer>", 3), ("<answer>68</answer>", 2), ("<answer>37</answer>", 2))
        ]
    )
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
    assert_same_logps_entropy_and_grads(results, atol=1e-5)


def assert_same_logps_entropy_and_grads(results, atol: float, entropy_rtol: float = 0.0) -> None:
    """results = [(logps, entropy, grads)] of the materialised path, then the chunked one."""
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=atol)
    torch.testing.assert_close(ent1, ent0, rtol=entropy_rtol, atol=atol)
    assert g0.keys() == g1.keys() and len(g0) > 0
    for name in g0:  # fp32 rounding of a different summation order, relative to the tensor's scale
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-5 * g0[name].abs().max().item())


@pytest.mark.parametrize(
    "scale, softcap, tau, seed", [(1.0, None, 0.5, 1), (0.5, 2.0, 0.8, 4)], ids=["plain", "scaled-and-softcapped"]
)
def test_chunked_gradient_matches_autograd_of_the_formula(scale, softcap, tau, seed):
    """Oracle: autograd of log_softmax(f(h·Wᵀ)/τ)[y] in float64, f = c·tanh(s·z/c) (or s·z without a cap)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, 11, (7,), generator=g)
    upstream = torch.randn(7, dtype=torch.float64, generator=g)
    z = scale * (h @ w.t())
    z = softcap * torch.tanh(z / softcap) if softcap else z
    ref = torch.log_softmax(z / tau, dim=-1).gather(1, y[:, None]).squeeze(1)
    ref_grads = torch.autograd.grad((ref * upstream).sum(), (h, w))
    ours, _ = fused_logps(h, w, y, tau, 3, scale, softcap)
    our_grads = torch.autograd.grad((ours * upstream.float()).sum(), (h, w))
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=1e-6)
    for a, b in zip(our_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "scale, softcap, tau",
    [(1.0, None, 1.0), (0.5, None, 0.7), (0.5, 2.0, 0.8)],
    ids=["plain", "scaled", "scaled-and-softcapped"],
)
@pytest.mark.parametrize("columns", [4, 11], ids=["vocab-tiles", "one-tile"])
def test_tiled_online_logsumexp_matches_autograd_in_float64(scale, softcap, tau, columns):
    """Oracle: log_softmax(f(h·Wᵀ)/τ) in float64, its entropy and autograd gradients of h and W. Tiles of
    5 rows × 4 columns sweep 11 columns in 4 + 4 + 3 (the running max rescaled) and 7 rows in 5 + 2;
    with and without grad (π_old's and the reference's passes take the no-Jacobian branch)."""
    g = torch.Generator().manual_seed(7)
    h = torch.randn(7, 5, dtype=torch.float64, generator=g) * 3  # spread logits: the running max moves
    w = torch.randn(11, 5, dtype=torch.float64, generator=g)
    y = torch.randint(0, 11, (7,), generator=g)
    upstream = torch.randn(7, dtype=torch.float64, generator=g)
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    z = scale * (hh @ ww.t())
    logsm = torch.log_softmax((softcap * torch.tanh(z / softcap) if softcap else z) / tau, dim=-1)
    ref, ref_entropy = logsm.gather(1, y[:, None]).squeeze(1), -(logsm.exp() * logsm).sum(-1).detach()
    ref_grads = torch.autograd.grad((ref * upstream).sum(), (hh, ww))
    h32, w32 = h.float().requires_grad_(), w.float().requires_grad_()
    logps, entropy = ChunkedLogSoftmax.apply(h32, w32, y, tau, 2, scale, softcap, True, True, columns)
    grads = torch.autograd.grad((logps * upstream.float()).sum(), (h32, w32))
    with torch.no_grad():
        no_grad = ChunkedLogSoftmax.apply(h.float(), w.float(), y, tau, 2, scale, softcap, False, True, columns)
    for ours in (logps, no_grad[0]):
        torch.testing.assert_close(ours.double(), ref.detach(), rtol=0, atol=1e-5)
    for ours in (entropy, no_grad[1]):
        torch.testing.assert_close(ours.double(), ref_entropy, rtol=0, atol=1e-5)
    for ours, oracle in zip(grads, ref_grads):
        torch.testing.assert_close(ours.double(), oracle, rtol=1e-5, atol=1e-5)


def _tiny(arch: str):
    """A randomly initialised tiny model of a family whose forward transforms its final logits."""
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
    torch.manual_seed(0)
    if arch == "gemma2":  # soft cap 3.0: small enough that tanh bends the random logits
        cfg = transformers.Gemma2Config(**common, final_logit_softcapping=3.0, attn_logit_softcapping=None)
        return transformers.Gemma2ForCausalLM(cfg)
    if arch == "cohere":
        return transformers.CohereForCausalLM(transformers.CohereConfig(**common, logit_scale=0.25))
    return transformers.GraniteForCausalLM(transformers.GraniteConfig(**common, logits_scaling=4.0))


@pytest.mark.parametrize("arch", ["gemma2", "cohere", "granite"])
def test_chunked_honours_final_logit_softcapping_and_scales(arch):
    """Oracle: the model's own forward (which applies the soft cap / logit scale) through the
    materialised path; the chunked path must give the same values and gradients to 1e-6."""
    model = _tiny(arch).float()
    ids = torch.randint(1, 64, (3, 12), generator=torch.Generator().manual_seed(2))
    attn = torch.ones_like(ids)
    attn[0, :3] = 0  # left padding
    weights = torch.randn(3, 6, generator=torch.Generator().manual_seed(3))
    results = []
    for chunk in (0, 4):
        model.zero_grad()
        logps, entropy = token_logprobs(model, ids, attn, 6, temperature=0.7, with_entropy=True, logits_chunk=chunk)
        (logps * weights).sum().backward()
        results.append(
            (logps.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        )
    assert_same_logps_entropy_and_grads(results, atol=1e-6, entropy_rtol=1e-6)  # entropies ~4: fp32 rounds ~5e-7


def test_chunked_refuses_an_unknown_logit_transform():
    """A model whose lm_head output is changed by code the chunked path cannot see (a forward hook
    here) is refused in one line instead of training on wrong log-probs."""
    from grpo_studio.contract.errors import UserError

    model = _tiny("cohere").float()
    model.get_output_embeddings().register_forward_hook(lambda mod, args, out: out * 2.0)
    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(5))
    with pytest.raises(UserError) as err:
        token_logprobs(model, ids, torch.ones_like(ids), 3, logits_chunk=4)
    assert str(err.value) == (
        "config error: model.logits_chunk = 4: CohereForCausalLM transforms its logits in a "
        "way the chunked path does not reproduce; set model.logits_chunk = 0"
    )
    with pytest.raises(UserError) as err:  # the shared-prefix pass reads the head the same way, and says so
        token_logprobs(model, ids, torch.ones_like(ids), 3, shared_prefix=True)
    assert str(err.value) == (
        "config error: train.shared_prefix: CohereForCausalLM transforms its logits in a "
        "way the shared-prefix pass does not reproduce; set train.shared_prefix = off"
    )


def test_a_nan_model_is_not_mistaken_for_an_unknown_logit_transform():
    """Weights gone NaN make both logits NaN: no refusal (the trainer's bad-step handling reports it), and
    the head is checked again once the logits are finite."""
    model = _tiny("qwen3").float()
    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(5))
    saved = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(math.nan)
    logps, _ = token_logprobs(model, ids, torch.ones_like(ids), 3, shared_prefix=True)
    assert torch.isnan(logps).all() and not getattr(model, "_grpo_head_checked", False)
    model.load_state_dict(saved)
    logps, _ = token_logprobs(model, ids, torch.ones_like(ids), 3, shared_prefix=True)
    assert torch.isfinite(logps).all() and model._grpo_head_checked


@pytest.mark.parametrize("chunk, shared", [(0, True), (5, False), (5, True)], ids=["shared", "chunked", "both"])
def test_spans_score_only_each_rows_completion_span(chunk, shared):
    """token_logprobs(spans=...) on the hidden-state paths: the lm_head and log-softmax run on the positions
    inside each row's span only. Oracle: the same call without spans, at those positions (values, entropies
    and the gradient of a loss that reads only them); the positions after a span read exactly 0."""
    path = resolve_model_path("tiny-arith")
    (ids, attn), T = _batch(load_tokenizer(path))
    ids, attn = ids.repeat(2, 1), attn.repeat(2, 1)  # each prompt twice, so the shared path has groups
    lengths = torch.tensor([T, 4, 1, 6, T - 1, 2])
    inside = torch.arange(T) < lengths.unsqueeze(1)
    weights = torch.randn(ids.shape[0], T, generator=torch.Generator().manual_seed(0)) * inside
    results = []
    for spans in (None, lengths):
        torch.manual_seed(0)
        cfg = config.load("tiny-arith", ["model.lora_rank=16"])
        policy = load_policy(cfg, path, resolve(cfg))
        logps, entropy = token_logprobs(
            policy, ids, attn, T, 0.7, with_entropy=True, logits_chunk=chunk, shared_prefix=shared, spans=spans
        )
        (logps * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        results.append((logps.detach(), entropy, grads))
    (full, full_entropy, _), (cut, cut_entropy, _) = results
    assert bool((cut[~inside] == 0).all() and (cut_entropy[~inside] == 0).all())
    assert bool((full_entropy[~inside] != 0).any())  # the oracle scored them: the zeros above are not its values
    results[0] = (full * inside, full_entropy * inside, results[0][2])
    assert_same_logps_entropy_and_grads(results, atol=1e-5)
