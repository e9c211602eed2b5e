"""Model FLOPs of a GRPO step and the matmul peak they are measured against (MFU).

FLOPs are counted as in Kaplan et al. 2020 (C ≈ 6·N per trained token) and PaLM's MFU (Chowdhery et al.
2022, appendix B): N = the weights of the model's matmuls (every nn.Linear, lm_head included, a LoRA
adapter's own matrices not); attention's sequence-length term is left out. Per real token (padding is
waste, not work):

  generation           2·N  (one forward: the sampler's prefill and decode)
  forward, no grad     2·N  (π_old, the reference model)
  training, full       6·N  (forward 2N, backward 4N: the input gradient 2N and the weight gradient 2N)
  training, LoRA       4·N  (the frozen weights need the input gradient, 2N, not their own)

Activation recomputation (gradient checkpointing) is not counted: MFU counts the model's FLOPs, not the
hardware's. The peak is the best of a few bursts of square torch.mm on the device, in the run's dtype.
"""

from __future__ import annotations

import functools
import time

import torch

from grpo_studio.engine.batching import spans

GEN, FORWARD, TRAIN_FULL, TRAIN_LORA = 2, 2, 6, 4  # FLOPs per matmul weight per token


def matmul_params(model: torch.nn.Module) -> int:
    """N: the weights of every nn.Linear of `model` (lm_head included: a tied lm_head is still a matmul;
    LoRA's lora_A / lora_B left out, they are a rounding error of the frozen layer they adapt)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return sum(
        m.weight.numel() for name, m in base.named_modules() if isinstance(m, torch.nn.Linear) and "lora_" not in name
    )


def step_flop(
    n_params: int, *, generated: float = 0.0, forward: float = 0.0, trained: float = 0.0, lora: bool = False
) -> float:
    """Model FLOPs of a step that generated (prompt + completion) tokens, ran `forward` tokens through
    no-grad forwards and trained on `trained` tokens (with LoRA or the full model)."""
    train = TRAIN_LORA if lora else TRAIN_FULL
    return float(n_params) * (GEN * generated + FORWARD * forward + train * trained)


def real_tokens(attention: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """[B] real tokens per row of a trainer batch: its prompt's (the attended part of the left-padded
    prompt columns) plus its completion span through EOS (an episode's environment tokens included; the padding
    after EOS is attended, not real)."""
    prompt_cols = attention.shape[1] - completion_mask.shape[1]
    return attention[:, :prompt_cols].sum(1).cpu().float() + spans(completion_mask).cpu().float()


def grpo_step_flop(
    n_params: int,
    tokens: torch.Tensor,
    rows: torch.Tensor,
    *,
    sampled_here: bool,
    old_logps: bool,
    reference: bool,
    lora: bool,
) -> float:
    """Model FLOPs of one trainer step on a rollout whose rows hold `tokens` real tokens each ([B]): its
    generation when this process sampled it on this step (an in-process sampler, the rollout's first
    step), π_old over the whole rollout when computed on this step, and this step's `rows` trained on
    (plus their reference forward when algo.beta > 0)."""
    mine = float(tokens[rows].sum())
    everything = float(tokens.sum())
    return step_flop(
        n_params,
        generated=everything if sampled_here else 0.0,
        forward=(everything if old_logps else 0.0) + (mine if reference else 0.0),
        trained=mine,
        lora=lora,
    )


@functools.cache
def matmul_peak(
    device: str = "cpu", dtype: torch.dtype = torch.float32, size: int = 1024, repeats: int = 5, burst_s: float = 0.1
) -> float:
    """FLOP/s of the best of `repeats` bursts (≈ burst_s each) of size×size torch.mm on `device` in `dtype`:
    the peak MFU divides by. Measured once per process and device/dtype (≈ repeats × burst_s seconds)."""
    dev = torch.device(device)
    a, b = torch.randn(size, size, device=dev, dtype=dtype), torch.randn(size, size, device=dev, dtype=dtype)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    a @ b  # first call: kernel selection, lazy init
    sync()
    best = 0.0
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < burst_s:
            a @ b
            n += 1
        sync()
        best = max(best, n * 2 * size**3 / (time.perf_counter() - t0))
    return best
