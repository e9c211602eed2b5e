"""Batch layout shared by everything that scores a rollout with the trainer's forward."""

from __future__ import annotations

import torch


def join_prompt_completion(prompt_ids: list[list[int]], completion_ids: torch.Tensor, n: int, pad_id: int,
                           device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
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
