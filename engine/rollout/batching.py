"""Batch layout shared by everything that scores a rollout with the trainer's forward, and the tensors a loss
reads from it (`LossInputs`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LossInputs:
    logps: Tensor  # [B, T] π_θ per-token log-probs (requires grad)
    old_logps: Tensor  # [B, T] π_old: the weights that sampled the batch (logps.detach() with one update)
    advantages: Tensor  # [B]
    mask: Tensor  # [B, T] completion mask (1 = real token), already zeroed for truncated seqs
    rollout_logps: Tensor | None = None  # [B, T] μ from the sampler
    ref_logps: Tensor | None = None  # [B, T] reference policy, when beta > 0
    entropy: Tensor | None = None  # [B, T] per-token entropy (for the metric only)


def join_prompt_completion(
    prompt_ids: list[list[int]], completion_ids: torch.Tensor, n: int, pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask): left-padded prompts, each repeated n times (rows grouped per
    prompt like Rollout), followed by the right-padded completions, as one batch for the trainer
    forward. Completion padding sits after EOS and never influences the tokens scored, so it
    stays attended (the causal mask keeps it out of every earlier position)."""
    width = max(map(len, prompt_ids))
    rows = [ids for ids in prompt_ids for _ in range(n)]
    left = torch.tensor([[pad_id] * (width - len(x)) + x for x in rows], dtype=torch.long)
    left_mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in rows], dtype=torch.long)
    input_ids = torch.cat([left, completion_ids.to(torch.long)], dim=1).to(device)
    attention = torch.cat([left_mask, torch.ones_like(completion_ids, dtype=torch.long)], dim=1).to(device)
    return input_ids, attention


def spans(mask: torch.Tensor) -> torch.Tensor:
    """Each row's completion span [B]: its columns up to its last token of mask 1. An episode's environment
    tokens inside it have mask 0 (engine/rollout/episodes.py) and are still computed; for one completion, whose mask
    runs from its first column, this is the mask's sum."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask.bool() * positions).amax(1)


def token_budget_groups(prompt_lens: torch.Tensor, completion_lens: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Row indices of each micro-batch under a token budget (verl's dynamic batch size, by padding):
    rows sorted longest first and taken greedily while rows × the micro-batch's own padded width
    (its longest prompt + its longest completion) stays within `budget`. A row wider than the
    budget on its own is a micro-batch of one; every row is in exactly one micro-batch."""
    order = torch.argsort(prompt_lens + completion_lens, descending=True, stable=True).tolist()
    groups, rows, wide_p, wide_c = [], [], 0, 0
    for i in order:
        p, c = max(wide_p, int(prompt_lens[i])), max(wide_c, int(completion_lens[i]))
        if rows and (len(rows) + 1) * (p + c) > budget:
            groups.append(torch.tensor(rows))
            rows, p, c = [], int(prompt_lens[i]), int(completion_lens[i])
        rows, wide_p, wide_c = rows + [i], p, c
    groups.append(torch.tensor(rows))
    return groups


def micro_batches(
    zero: torch.Tensor, size: int, prompt_lens=None, completion_lens=None, budget: int = 0
) -> list[torch.Tensor]:
    """Row indices of each micro-batch of B rows: `size` rows at a time in order, or under a token budget
    (token_budget_groups) when `budget`; the rows flagged in `zero` ([B] bool; all False: none) are batched
    apart from the others, after them (so no micro-batch holds both)."""
    parts = [part for part in (torch.nonzero(~zero).flatten(), torch.nonzero(zero).flatten()) if len(part)]
    if not budget:
        return [rows for part in parts for rows in part.split(size)]
    return [part[g] for part in parts for g in token_budget_groups(prompt_lens[part], completion_lens[part], budget)]


def trim(
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    completion_len: int,
    prompt_lens: torch.Tensor,
    completion_lens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The rows cut to their own widths: the left prompt padding none of them needs and the completion
    columns after the longest one's last token (kept >= 2 so a [B, T] stays per-token). Both are masked
    out of every scored position (left padding by the attention mask, positions skip it; the tail by
    causality), so the log-probs of the kept tokens are those of the full-width rows."""
    P = input_ids.shape[1] - completion_len
    keep_p, keep_c = int(prompt_lens.max()), min(completion_len, max(2, int(completion_lens.max())))
    cols = slice(P - keep_p, P + keep_c)
    return input_ids[:, cols], attention[:, cols], keep_c


def token_budget_batches(
    input_ids: torch.Tensor, attention: torch.Tensor, completion_len: int, completion_lens: torch.Tensor, budget: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]:
    """(rows, input_ids, attention, completion width) of each micro-batch under a token budget: the rows of
    token_budget_groups, cut by trim. `completion_lens` are the rows' completion tokens."""
    prompt_lens, completion_lens = attention[:, :-completion_len].sum(1).cpu(), completion_lens.cpu()
    return [
        (rows, *trim(input_ids[rows], attention[rows], completion_len, prompt_lens[rows], completion_lens[rows]))
        for rows in token_budget_groups(prompt_lens, completion_lens, budget)
    ]
