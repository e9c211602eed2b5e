"""The rollout tail both backends share (engine/sampler/base.py): mask through the first EOS, log-probs
0 and ids pad after it."""

from __future__ import annotations

import time

import torch

from grpo_studio.engine.sampler.base import rollout_from

EOS, PAD = 2, 0


def test_rollout_from_masks_after_the_first_eos_and_pads():
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 9, 9, 9]])
    logprobs = torch.tensor([[-0.5, -0.25, -3.0, -4.0], [-1.0, -1.5, -1.25, -1.75], [-2.0, -2.5, -2.25, -2.75]])
    out = rollout_from(ids, logprobs, EOS, PAD, time.perf_counter())
    assert out.completion_ids.tolist() == [[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0]]
    assert out.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert out.logprobs.tolist() == [[-0.5, -0.25, 0.0, 0.0], [-1.0, -1.5, -1.25, -1.75], [-2.0, 0.0, 0.0, 0.0]]
    assert out.truncated.tolist() == [False, True, False]
    assert out.mask.dtype == torch.float32 and 0.0 <= out.seconds < 60.0
