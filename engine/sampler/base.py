"""The rollout interface: generate G completions per prompt and say what log-probs the sampler used."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from ..model.moe import Routes


@dataclass
class Sampling:
    n: int  # completions per prompt (num_generations)
    max_tokens: int  # max_completion_len
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0
    min_tokens: int = 0  # EOS suppressed before this many tokens (the rehearsal: every completion full length)

    @classmethod
    def of(cls, rollout, seed: int) -> Sampling:
        """What the config's rollout.* section samples with, under this rollout's seed."""
        return cls(
            n=rollout.num_generations,
            max_tokens=rollout.max_completion_len,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            seed=seed,
        )


class NonFiniteSampling(ArithmeticError):
    """The policy's next-token distribution holds NaN/inf (its weights or activations overflowed): this
    step cannot be sampled. The trainer skips the step and counts it (train.max_bad_steps)."""


@dataclass
class Rollout:
    """Completions for len(prompts) * n rows, grouped: rows [i*n, (i+1)*n) belong to prompt i.

    completion_ids are right-padded with pad_id; mask marks real tokens (EOS included);
    logprobs[b, t] = log μ(y_t | ...) under the sampler's processed distribution (after
    temperature/top-k/top-p), 0 where mask is 0. truncated[b] is True when no EOS was produced.
    versions[b, t] = the policy version (weight sync) that sampled token t, where a rollout server
    updates weights inside a generation (rollout.async_mode = in_flight); None: one version for all.
    support[b, t] = the vocabulary the sampler kept at that position under top-k/top-p, bit-packed
    (pack_support), the tokens μ is renormalised over; all tokens after the mask. None: the sampler did not
    record it (no truncation, algo.logprob_support = full, or a backend that cannot).
    """

    completion_ids: torch.Tensor  # [B, T] long
    mask: torch.Tensor  # [B, T] float
    logprobs: torch.Tensor  # [B, T] float32
    truncated: torch.Tensor  # [B] bool
    seconds: float = 0.0
    versions: torch.Tensor | None = None  # [B, T] long
    support: torch.Tensor | None = None  # [B, T, ceil(V / 8)] uint8
    routes: Routes | None = None  # an MoE's experts per token (engine/model/moe.py); None: dense or not recorded


class Sampler(Protocol):
    name: str

    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> Rollout: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take the trainer's current weights (HF parameter names, merged LoRA) before the next rollout."""
        ...

    def sleep(self) -> None:
        """Free rollout memory during the training phase where supported; generate() wakes it."""
        ...

    def close(self) -> None: ...


def completion_mask(ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, truncated): 1 for tokens up to and including the first EOS; truncated rows have no EOS."""
    is_eos = ids == eos_id
    has_eos = is_eos.any(dim=1)
    first = torch.where(has_eos, is_eos.int().argmax(dim=1), ids.shape[1])
    pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    return (pos <= first.unsqueeze(1)).float(), ~has_eos


def truncates(sampling: Sampling) -> bool:
    """Whether `sampling` draws from a truncated distribution (top-k or top-p on)."""
    return sampling.top_k > 0 or sampling.top_p < 1.0


_BITS = 1 << torch.arange(8, dtype=torch.uint8)  # bit j of a byte holds vocabulary entry 8·i + j


def pack_support(kept: torch.Tensor) -> torch.Tensor:
    """[..., V] bool → [..., ceil(V / 8)] uint8: a kept set in V/8 bytes (bit v % 8 of byte v // 8)."""
    pad = -kept.shape[-1] % 8
    bits = torch.nn.functional.pad(kept, (0, pad)).unflatten(-1, (-1, 8)).to(torch.uint8)
    return (bits * _BITS.to(kept.device)).sum(-1, dtype=torch.uint8)


def unpack_support(packed: torch.Tensor, vocab: int) -> torch.Tensor:
    """pack_support's inverse: [..., ceil(V / 8)] uint8 → [..., vocab] bool."""
    return (packed.unsqueeze(-1) & _BITS.to(packed.device)).bool().flatten(-2)[..., :vocab]


def rollout_from(
    ids: torch.Tensor, logprobs: torch.Tensor, eos_id: int, pad_id: int, start: float, support=None
) -> Rollout:
    """The Rollout of sampled ids [B, T] and their log-probs (and packed kept sets, or None): masked through
    the first EOS, log-probs 0, ids pad_id and every token kept after it, on the CPU, timed from
    time.perf_counter() = start."""
    mask, truncated = completion_mask(ids, eos_id)
    keep = mask.bool()
    ids = torch.where(keep, ids, torch.full_like(ids, pad_id))
    logprobs = torch.where(keep, logprobs, torch.zeros_like(logprobs))
    if support is not None:
        support = torch.where(keep.unsqueeze(-1), support, torch.full_like(support, 255)).cpu()
    return Rollout(ids.cpu(), mask.cpu(), logprobs.cpu(), truncated.cpu(), time.perf_counter() - start, support=support)
