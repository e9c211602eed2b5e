"""Completions packed side by side under their shared prompt (engine/train/completion_packing.py, used by
train.shared_prefix when the rows' completion spans are known).

Oracles: a hand-packed plan (first-fit decreasing per prompt), and the plain single-pass forward, whose
log-probs, entropies and gradients at every scored position (inside each row's span) the packed pass must give,
fp32 to 1e-5, on sdpa and eager attention, LoRA and full fine-tune, with left-padded prompts of different
lengths and shuffled rows."""

from __future__ import annotations

import pytest
import torch
from prompt_groups import grouped_batch

from grpo_studio.contract import config
from grpo_studio.contract.precision_plan import resolve
from grpo_studio.engine.model.policy_loader import load_policy, resolve_model_path
from grpo_studio.engine.train.completion_packing import first_fit, pack
from grpo_studio.engine.train.logprobs import token_logprobs

G, T = 3, 9
# per prompt, spans whose needs (span - 1) pack 3 rows into 2: 8 | 4 + 2, 8 | 5 + 3, 6 | 6 (and 1 needs nothing)
SPANS = [9, 5, 3, 9, 6, 4, 7, 7, 1]


def test_first_fit_packs_each_prompts_rows_longest_first():
    """Prompt 0's rows 0, 1, 2 need 5, 3, 2 inputs: 5 + 3 fill a row of 8, 2 starts the next; prompt 1's two
    rows of 4 share one; row 5 needs none and is in none; rows of different prompts never share."""
    assert first_fit([0, 0, 0, 1, 1, 0], [5, 3, 2, 4, 4, 0], 8) == [[0, 1], [2], [3, 4]]
    assert first_fit([0, 1], [2, 2], 8) == [[0], [1]]


def test_rows_that_save_nothing_or_need_no_input_are_not_packed():
    """None (the unpacked pass) where packing saves no row, and where every completion is one token, whose
    log-prob the prompt's last position gives (a rollout of immediate EOS)."""
    ids, prompts, prompt_lens = torch.zeros(4, 8, dtype=torch.long), torch.tensor([0, 0, 1, 1]), torch.tensor([3, 5])
    assert pack(ids, prompts, prompt_lens, torch.tensor([1, 1, 1, 1])) is None
    assert pack(ids, prompts, prompt_lens, torch.tensor([8, 8, 8, 8])) is None
    packed = pack(ids, prompts, prompt_lens, torch.tensor([4, 5, 8, 1]))
    assert packed.slot_prompt.tolist() == [0, 1] and packed.segment[0, :7].tolist() == [1] * 4 + [0] * 3
    assert packed.positions[0, :7].tolist() == [3, 4, 5, 6, 3, 4, 5] and packed.positions[1, :7].tolist() == list(
        range(5, 12)
    )


@pytest.fixture(scope="module")
def batch():
    ids, att, order, g = grouped_batch(G, T)
    return ids[order], att[order], torch.tensor(SPANS)[order], torch.randn(ids.shape[0], T, generator=g)


def _run(lora_rank, attention, packed, batch):
    ids, att, spans, upstream = batch
    torch.manual_seed(0)
    cfg = config.load("tiny-arith", [f"model.lora_rank={lora_rank}"])
    policy = load_policy(cfg, resolve_model_path("tiny-arith"), resolve(cfg))
    policy.set_attn_implementation(attention)
    shapes = []
    policy.get_input_embeddings().register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    logps, entropy = token_logprobs(
        policy,
        ids,
        att,
        T,
        temperature=0.8,
        with_entropy=True,
        logits_chunk=4 if packed else 0,
        shared_prefix=packed,
        spans=spans if packed else None,
    )
    scored = torch.arange(T) < spans.unsqueeze(1)
    if packed:  # the 3 prompts once, then 9 completions in 6 rows; nothing outside the spans
        assert [s for s in shapes if s != (1, ids.shape[1])] == [(3, ids.shape[1] - T), (6, T)]
        assert not logps[~scored].any() and not entropy[~scored].any()
    (logps * upstream * scored).sum().backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    return logps[scored].detach(), entropy[scored], grads


@pytest.mark.parametrize(
    "lora_rank, attention", [(16, "sdpa"), (16, "eager"), (0, "sdpa")], ids=["lora-sdpa", "lora-eager", "full-sdpa"]
)
def test_packed_completions_equal_the_plain_pass(batch, lora_rank, attention):
    plain, packed = _run(lora_rank, attention, False, batch), _run(lora_rank, attention, True, batch)
    torch.testing.assert_close(packed[0], plain[0], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(packed[1], plain[1], rtol=1e-6, atol=1e-5)
    assert plain[2].keys() == packed[2].keys() and len(plain[2]) > 0
    for name, grad in plain[2].items():
        torch.testing.assert_close(packed[2][name], grad, rtol=1e-5, atol=1e-5 * grad.abs().max().item())
