"""algo.logprob_support: with top-k/top-p the hf sampler records each position's kept tokens, and the trainer's
log-probs, entropy and gradients are those of the same truncated, renormalised distribution (docs/mismatch.md,
"Truncated sampling"). Oracles: log_softmax over the kept logits alone, computed by hand; transformers' own
top-k/top-p warpers; the mismatch k3 of the bundled model in fp32 (7.9e-14 measured against 8.7e-4 on the full
vocabulary, issue 41's research)."""

from __future__ import annotations

import re

import pytest
import torch

from grpo_studio.contract import config, precision_plan
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.model import policy_loader
from grpo_studio.engine.precision.mismatch import mismatch_metrics
from grpo_studio.engine.rollout.batching import join_prompt_completion
from grpo_studio.engine.sampler import Sampling, make_sampler
from grpo_studio.engine.sampler.base import pack_support, unpack_support
from grpo_studio.engine.sampler.hf import warpers
from grpo_studio.engine.train.chunked_logsoftmax import ChunkedLogSoftmax
from grpo_studio.engine.train.logprobs import materialised_logps, position_ids, token_logprobs


def _hand(logits: torch.Tensor, kept: torch.Tensor, y: torch.Tensor):
    """log p_S(y) and the entropy of p_S, one position at a time: log_softmax of the kept logits alone."""
    logps, entropy = [], []
    for z, s, t in zip(logits.reshape(-1, logits.shape[-1]), kept.reshape(-1, kept.shape[-1]), y.reshape(-1)):
        ids = s.nonzero().squeeze(1)
        logp = torch.log_softmax(z[ids].double(), -1)
        logps.append(logp[(ids == t).nonzero().item()])
        entropy.append(-(logp.exp() * logp).sum())
    return torch.stack(logps).view(y.shape), torch.stack(entropy).view(y.shape)


def _sets(B: int, V: int, seed: int):
    """Random kept sets [B, V] holding target y [B] (the sampled token is always kept)."""
    g = torch.Generator().manual_seed(seed)
    kept = torch.rand(B, V, generator=g) < 0.3
    y = torch.randint(0, V, (B,), generator=g)
    kept[torch.arange(B), y] = True
    return kept, y


@pytest.mark.parametrize("vocab", [8, 13, 61])
def test_packing_round_trips_any_vocabulary_size(vocab):
    kept = torch.rand(3, 5, vocab, generator=torch.Generator().manual_seed(vocab)) < 0.5
    packed = pack_support(kept)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5, (vocab + 7) // 8)
    assert torch.equal(unpack_support(packed, vocab), kept)
    assert pack_support(torch.tensor([True, False, True, True, False, False, False, False, True])).tolist() == [13, 1]


def test_materialised_log_probs_entropy_and_gradient_are_those_of_the_kept_set():
    B, T, V = 2, 3, 29
    kept, y = _sets(B * T, V, 0)
    kept, y = kept.view(B, T, V), y.view(B, T)
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(1), dtype=torch.float64).float()
    logits.requires_grad_(True)
    logps, entropy = materialised_logps(logits, y, 0.7, chunk_rows=1, with_entropy=True, support=pack_support(kept))
    want, want_h = _hand(logits.detach() / 0.7, kept, y)
    assert torch.allclose(logps.double(), want, atol=1e-6) and torch.allclose(entropy.double(), want_h, atol=1e-6)
    logps.sum().backward()
    # d log p_S(y)/dz = (onehot(y) − p_S)/τ on the kept tokens, 0 outside them
    p = torch.where(kept, torch.softmax((logits.detach() / 0.7).masked_fill(~kept, -torch.inf), -1), 0.0)
    grad = (torch.nn.functional.one_hot(y, V) - p) / 0.7
    assert torch.allclose(logits.grad, grad, atol=1e-6)


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("columns", [5, 16])  # tiles that cut the packed bytes, and tiles on them
def test_the_chunked_path_takes_the_same_kept_sets(softcap, columns):
    N, H, V, tau, scale = 7, 6, 37, 0.8, 1.3
    g = torch.Generator().manual_seed(2)
    h = torch.randn(N, H, generator=g, requires_grad=True)
    w = torch.randn(V, H, generator=g, requires_grad=True)
    kept, y = _sets(N, V, 3)
    z = scale * h @ w.t()
    z = softcap * torch.tanh(z / softcap) if softcap else z
    want, want_h = materialised_logps(
        z[:, None], y[:, None], tau, with_entropy=True, support=pack_support(kept)[:, None]
    )
    grads = torch.autograd.grad(want.sum(), (h, w))
    logps, entropy = ChunkedLogSoftmax.apply(h, w, y, tau, 2, scale, softcap, True, True, columns, pack_support(kept))
    assert torch.allclose(logps, want[:, 0], atol=1e-5) and torch.allclose(entropy, want_h[:, 0], atol=1e-5)
    ours = torch.autograd.grad(logps.sum(), (h, w))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ours, grads))
    hand, _ = _hand(z.detach() / tau, kept, y)
    assert torch.allclose(logps.double(), hand, atol=1e-5)


@pytest.fixture(scope="module")
def tiny():
    cfg = config.load("tiny-arith", ["rollout.num_generations=8", "rollout.max_completion_len=8"])
    path = policy_loader.resolve_model_path(cfg.model.name)
    return cfg, path, policy_loader.load_tokenizer(path)


def _sample_and_score(tiny, keys: list[str]):
    """The hf sampler's rollout of the first prompts under `keys` and π of its tokens by the trainer's path."""
    from grpo_studio.benchmarks.mismatch_bench import prompts_for

    _, path, tok = tiny
    cfg = config.load("tiny-arith", ["rollout.num_generations=8", "rollout.max_completion_len=8", *keys])
    plan = precision_plan.resolve(cfg)
    prompt_ids = prompts_for(cfg, 4, 0)
    r = cfg.rollout
    sampler = make_sampler(cfg, path, tok, plan)
    out = sampler.generate(prompt_ids, Sampling(r.num_generations, r.max_completion_len, 1.0, r.top_p, r.top_k, 5))
    policy = policy_loader.load_policy(cfg, path, plan)
    ids, attention = join_prompt_completion(prompt_ids, out.completion_ids, r.num_generations, tok.pad_token_id)
    with torch.no_grad(), policy_loader.autocast(plan):
        pi, _ = token_logprobs(policy, ids, attention, out.completion_ids.shape[1], support=out.support)
    return cfg, sampler, out, pi, ids, attention


@pytest.mark.parametrize("truncation", [["rollout.top_k=5"], ["rollout.top_p=0.9"]])
def test_the_hf_sampler_records_the_warpers_kept_set_at_every_token(tiny, truncation):
    cfg, sampler, out, _, ids, attention = _sample_and_score(tiny, truncation)
    kept = unpack_support(out.support, 64)
    real = out.mask.bool()
    assert kept[real].gather(1, out.completion_ids[real].unsqueeze(1)).all()  # each drawn token was kept
    assert kept[~real].all()  # after EOS: every token
    # the oracle: transformers' warpers on the sampler's own logits at each position
    T = out.completion_ids.shape[1]
    with torch.no_grad():
        logits = sampler.model(input_ids=ids, attention_mask=attention, position_ids=position_ids(attention)).logits
    logits = logits[:, -(T + 1) : -1]
    want = torch.ones_like(kept)
    for t in range(logits.shape[1]):
        scores = logits[:, t].clone()
        for warp in warpers(Sampling(8, 8, 1.0, cfg.rollout.top_p, cfg.rollout.top_k)):
            scores = warp(ids, scores)
        want[:, t] = torch.isfinite(scores)
    assert torch.equal(kept[real], want[real])


@pytest.mark.parametrize("truncation", [["rollout.top_p=0.9"], ["rollout.top_k=5"]])
def test_fp32_mismatch_is_rounding_on_the_sampler_support_and_the_truncated_mass_on_the_full_one(tiny, truncation):
    _, _, out, pi, _, _ = _sample_and_score(tiny, truncation)
    k3 = mismatch_metrics(out.logprobs, pi, out.mask)["mismatch/k3"]
    assert k3 < 1e-9
    _, _, full, pi_full, _, _ = _sample_and_score(tiny, [*truncation, "algo.logprob_support=full"])
    assert full.support is None
    assert torch.equal(full.completion_ids, out.completion_ids)  # the same draws: only π's support differs
    assert mismatch_metrics(full.logprobs, pi_full, full.mask)["mismatch/k3"] > 1e-5


def test_rollout_correction_runs_on_the_sampler_support_and_is_refused_on_the_full_one():
    assert config.load("tiny-arith", ["rollout.top_p=0.9", "algo.is_level=token"]).algo.logprob_support == "sampler"
    with pytest.raises(UserError, match=r"^config error: rollout.top_p = 0.9: algo.is_level = 'token' corrects"):
        config.load("tiny-arith", ["rollout.top_p=0.9", "algo.is_level=token", "algo.logprob_support=full"])


@pytest.mark.parametrize(
    "keys, why",
    [
        (["rollout.backend=vllm"], r"vLLM \S+ returns them only from its Model Runner V2"),
        (["rollout.backend=vllm", "rollout.colocate=false", "rollout.server=http://127.0.0.1:1"], "a rollout server"),
    ],
)
def test_a_sampler_that_cannot_return_its_kept_sets_is_refused_in_one_line(keys, why):
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", ["rollout.top_k=20", *keys])
    line = str(err.value)
    assert "\n" not in line and line.startswith(
        "config error: algo.logprob_support = 'sampler': with rollout.top_k = 20 pi is taken on the tokens the "
        "sampler kept at each position, and "
    )
    assert line.endswith("; allowed: full (pi on the whole vocabulary), or rollout.backend = 'hf' colocated")
    assert re.search(why, line)
    config.load("tiny-arith", ["rollout.top_k=20", *keys, "algo.logprob_support=full", "algo.is_level=none"])


@pytest.mark.parametrize(
    "path", [dict(shared_prefix=True), dict(logits_chunk=3), dict(shared_prefix=True, logits_chunk=5)]
)
def test_every_log_prob_path_takes_the_kept_sets(tiny, path):
    """The hidden-state paths (train.shared_prefix, model.logits_chunk) give the materialised path's π and entropy
    on the sampler's kept sets, and the sampler's μ to fp32 rounding."""
    cfg, _, out, pi, ids, attention = _sample_and_score(tiny, ["rollout.top_p=0.8"])
    policy = policy_loader.load_policy(cfg, tiny[1], precision_plan.resolve(cfg))
    T, spans = out.completion_ids.shape[1], out.mask.sum(1).long()
    with torch.no_grad():
        whole, h = token_logprobs(policy, ids, attention, T, with_entropy=True, spans=spans, support=out.support)
        ours, h_ours = token_logprobs(
            policy, ids, attention, T, with_entropy=True, spans=spans, support=out.support, **path
        )
    real = out.mask.bool()
    assert torch.allclose(ours[real], whole[real], atol=1e-5) and torch.allclose(h_ours[real], h[real], atol=1e-5)
    assert (ours[real] - out.logprobs[real]).abs().max() < 1e-4
