"""Completions of one prompt packed side by side into shared rows for the shared-prefix pass (train.shared_prefix).

A group's completions end at different lengths, and a micro-batch padded to its longest computes the padding:
on the GSM8K-shaped workload (issue 27) about a fifth of the completion positions. Here each prompt's
completions are packed first-fit decreasing into rows of the micro-batch's completion width, each one a segment
that attends its prompt (the prompt pass's KV cache, as unpacked) and itself causally, at the positions it has
unpacked: the same queries over the same keys, so the same values up to the attention kernel's summation order.
verl's `use_remove_padding` and OpenRLHF's packing do this with varlen flash attention; here a 4-D mask over the
cache and the packed row carries it, on either kernel shared_prefix_refusal allows (eager, sdpa).

A row needs the inputs that predict its scored tokens: the prompt's last position predicts its first completion
token, so a completion span of n tokens needs its first n - 1 tokens run.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Packing:
    """The packed completion pass of B rows of completion width T into S rows."""

    slot_prompt: torch.Tensor  # [S] the prompt (prefix_groups' index) each packed row attends
    ids: torch.Tensor  # [S, T] the segments' tokens, 0 after the last one
    positions: torch.Tensor  # [S, T] each token's position in its unpacked row
    segment: torch.Tensor  # [S, T] the row each position belongs to; -1 after the last segment
    gather: torch.Tensor  # [B, T] row r's input j at flat index gather[r, j] of [S·T] (j < its need; else 0)


def first_fit(prompt_of_row: list[int], needs: list[int], width: int) -> list[list[int]]:
    """Rows of each packed row: per prompt, its rows longest first into the first packed row with room
    (first-fit decreasing), at most `width` inputs each; a row that needs none is in none."""
    slots: list[list[int]] = []
    room: list[int] = []
    for prompt in sorted(set(prompt_of_row)):
        start = len(slots)
        rows = sorted((r for r, p in enumerate(prompt_of_row) if p == prompt and needs[r]), key=lambda r: -needs[r])
        for r in rows:
            k = next((k for k in range(start, len(slots)) if room[k] >= needs[r]), None)
            if k is None:
                slots.append([])
                room.append(width)
                k = len(slots) - 1
            slots[k].append(r)
            room[k] -= needs[r]
    return slots


def pack(completion_ids: torch.Tensor, prompt_of_row: torch.Tensor, prompt_lens: torch.Tensor, spans: torch.Tensor):
    """The Packing of rows [B, T] whose completion spans are `spans`, or None where it saves no row or no row
    needs an input (every span at most 1 token: the prompt pass predicts them all; the unpacked pass runs)."""
    B, T = completion_ids.shape
    needs = (spans - 1).clamp(min=0).tolist()
    slots = first_fit(prompt_of_row.tolist(), needs, T)
    if not slots or len(slots) >= B:
        return None
    S = len(slots)
    ids = completion_ids.new_zeros(S, T)
    segment = torch.full((S, T), -1, dtype=torch.long)
    local = torch.zeros(S, T, dtype=torch.long)
    gather = torch.zeros(B, T, dtype=torch.long)
    for s, rows in enumerate(slots):
        offset = 0
        for r in rows:
            n = needs[r]
            ids[s, offset : offset + n] = completion_ids[r, :n]
            segment[s, offset : offset + n] = r
            local[s, offset : offset + n] = torch.arange(n)
            gather[r, :n] = s * T + offset + torch.arange(n)
            offset += n
    slot_prompt = prompt_of_row.cpu()[torch.tensor([rows[0] for rows in slots])]
    positions = prompt_lens.cpu()[slot_prompt].unsqueeze(1) + local
    device = completion_ids.device
    return Packing(slot_prompt.to(device), ids, positions.to(device), segment.to(device), gather.to(device))


def attention_mask(packing: Packing, prompt_mask: torch.Tensor, eager_dtype: torch.dtype | None) -> torch.Tensor:
    """[S, 1, T, P + T]: each packed position sees its prompt's tokens (not its left padding) and the positions
    of its own segment up to itself; a position after the last segment sees the prompt only, so no query is
    without a key. Boolean for sdpa (True: attends); additive in `eager_dtype` for eager attention."""
    segment = packing.segment
    T = segment.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=segment.device).tril()
    own = (segment.unsqueeze(2) == segment.unsqueeze(1)) & (segment.unsqueeze(1) >= 0) & causal
    prompt = prompt_mask[packing.slot_prompt].bool().unsqueeze(1).expand(-1, T, -1)
    allowed = torch.cat([prompt, own], dim=2).unsqueeze(1)
    if eager_dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=eager_dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(eager_dtype).min
    )
