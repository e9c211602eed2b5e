"""The shared-prefix tests' batch: three tiny-arith prompts of different lengths, left-padded, each repeated G times
with random completions of T tokens, and a shuffled row order (micro-batches need not keep a group together)."""

from __future__ import annotations

import torch

from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path
from grpo_studio.engine.rollout.batching import join_prompt_completion


def grouped_batch(G: int, T: int, seed: int = 0):
    """(input_ids, attention, order, the generator that drew them, for what the test draws next)."""
    tokenizer = load_tokenizer(resolve_model_path("tiny-arith"))
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ("1+2=", "23+45=", "17+300=")]
    g = torch.Generator().manual_seed(seed)
    completions = torch.randint(3, tokenizer.vocab_size, (len(prompts) * G, T), generator=g)
    ids, att = join_prompt_completion(prompts, completions, G, tokenizer.pad_token_id)
    return ids, att, torch.randperm(ids.shape[0], generator=g), g
