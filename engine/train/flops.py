"""Model FLOPs of a GRPO step and the matmul peak they are measured against (MFU).

FLOPs are counted as in Kaplan et al. 2020 (C ≈ 6·N per trained token) and PaLM's MFU (Chowdhery et al.
2022, appendix B): N = the weights of the model's matmuls (every nn.Linear, lm_head included, a LoRA
adapter's own matrices not); attention's sequence-length term is left out. Per real token (padding is
waste, not work):

  generation           2·N  (one forward: the sampler's prefill and decode)
  forward, no grad     2·N  (π_old, the reference model)
  training, full       6·N  (forward 2N, backward 4N: the input gradient 2N and the weight gradient 2N)
  training, LoRA       4·N  (the frozen weights need the input gradient, 2N, not their own)
  backward skipped     2·N  (a row of a zero-advantage micro-batch: engine/train/zero_advantage.py)

A prompt is counted as often as it is computed. Generation computes each distinct prompt once for its G
completions (the hf sampler prefills each distinct prompt once, engine/sampler/hf.py; vLLM's prefix cache), and
so does each forward and backward where the shared-prefix pass runs (train.shared_prefix, engine/train/logprobs.py);
so a row's tokens there are its completion span plus its prompt ÷ the rows sharing that prompt
(shared_prompt_tokens). Where the pass does not run (off, fsdp, gradient checkpointing, no repeated prompt of 16
tokens) every row counts its whole prompt (real_tokens). Per step, with P_g a distinct prompt's tokens and c_i a
row's completion span:

  generation     Σ_g P_g + Σ_i c_i
  each pass      the same over its rows when the prompt is shared, else Σ_i (P_i + c_i)
  perf/flop      N·(2·generation + 2·(π_old + π_ref + backward-skipped rows) + (4 LoRA | 6 full)·trained)

A step that trains part of a group (train.steps_per_generation > 1) is charged that part's share of the prompt.

Activation recomputation (gradient checkpointing) is not counted: MFU counts the model's FLOPs, not the
hardware's. The peak is the best rate of a few bursts of square torch.mm and F.linear (what nn.Linear runs)
on the device, in the run's dtype, at a few sizes: on a CPU the fp16 torch.mm kernel runs at a small fraction
of F.linear's, so torch.mm alone made MFU read 200-380% on fp16 runs. It is cached per machine in
$GRPO_STUDIO_CACHE (default ~/.cache/grpo-studio)/matmul_peak.json with the conditions it was measured under,
and measured again once when a step beats it (Peak).
"""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F

from ...contract import bundled
from ...contract.run_files import atomic_write_text
from ..rollout.batching import spans

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


def shared_prompt_tokens(input_ids: torch.Tensor, attention: torch.Tensor, completion_mask: torch.Tensor):
    """[B] tokens per row where each distinct prompt is computed once: the row's completion span plus its
    prompt's real tokens ÷ the rows holding the same prompt (so a group's rows sum to P + Σ c_i)."""
    prompt_cols = attention.shape[1] - completion_mask.shape[1]
    prompts = torch.cat([input_ids[:, :prompt_cols], attention[:, :prompt_cols].to(input_ids.dtype)], dim=1)
    _, which, count = torch.unique(prompts.cpu(), dim=0, return_inverse=True, return_counts=True)
    prompt = attention[:, :prompt_cols].sum(1).cpu().float()
    return prompt / count[which].float() + spans(completion_mask).cpu().float()


def grpo_step_flop(
    n_params: int,
    tokens: torch.Tensor,
    rows: torch.Tensor,
    *,
    sampled_here: bool,
    old_logps: bool,
    reference: bool,
    lora: bool,
    untrained: torch.Tensor | None = None,
    unrun: torch.Tensor | None = None,
    generated: torch.Tensor | None = None,
) -> float:
    """Model FLOPs of one trainer step on a rollout whose rows hold `tokens` tokens each ([B]) in each forward
    and backward (shared_prompt_tokens where the prompt pass is shared, else real_tokens) and `generated` each
    in its generation (default `tokens`): its generation when this process sampled it on this step (an
    in-process sampler, the rollout's first step), π_old over the whole rollout when computed on this step, and
    this step's `rows` trained on (plus their reference forward when algo.beta > 0); those of them in
    `untrained` only went forward (their backward skipped: engine/train/zero_advantage.py), and those in
    `unrun` not at all."""
    mine = float(tokens[rows].sum()) - (float(tokens[unrun].sum()) if unrun is not None else 0.0)
    skipped = float(tokens[untrained].sum()) if untrained is not None else 0.0
    everything = float(tokens.sum())
    return step_flop(
        n_params,
        generated=float((tokens if generated is None else generated).sum()) if sampled_here else 0.0,
        forward=(everything if old_logps else 0.0) + (mine if reference else 0.0) + skipped,
        trained=mine - skipped,
        lora=lora,
    )


SIZES = {"cuda": (2048, 4096, 8192), "cpu": (256, 512, 1024)}  # square matmul sizes tried per device type
TRIALS, BURST_S, MAX_CALL_S = 3, 0.05, 0.25


def measure_peak(device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s: the best of TRIALS bursts (≈ BURST_S each) of torch.mm and of F.linear at each size of
    SIZES, in `dtype` on `device`. A size whose one call would take over MAX_CALL_S at the op's rate on the size
    below is skipped: a kernel that slow is not the peak (CPU fp16 torch.mm: ≈ 3 s at 1024)."""
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    best = 0.0
    for op in (torch.mm, F.linear):
        rate = None
        for size in SIZES.get(dev.type, SIZES["cpu"]):
            if rate is not None and 2 * size**3 / rate > MAX_CALL_S:
                break
            a, b = torch.randn(size, size, device=dev, dtype=dtype), torch.randn(size, size, device=dev, dtype=dtype)
            op(a, b)  # first call: kernel selection, lazy init
            sync()
            rate = 0.0
            for _ in range(TRIALS):
                n, t0 = 0, time.perf_counter()
                while n == 0 or time.perf_counter() - t0 < BURST_S:
                    op(a, b)
                    n += 1
                sync()
                rate = max(rate, n * 2 * size**3 / (time.perf_counter() - t0))
            best = max(best, rate)
    return best


def peak_file() -> Path:
    return bundled.user_cache() / "matmul_peak.json"


def peak_conditions(device: str, dtype: torch.dtype) -> dict:
    """What a measured peak depends on: the machine, the device and its name, the dtype, torch and its threads."""
    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    return {
        "host": platform.node(),
        "device": str(dev),
        "device_name": name,
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def matmul_peak(device: str = "cpu", dtype: torch.dtype = torch.float32, *, fresh: bool = False) -> float:
    """FLOP/s MFU divides by: the cached peak under the same conditions (peak_conditions), else measured
    (measure_peak) and cached. fresh: measure again; the cache keeps the best of the old and the new. A CPU
    peak measured while the CPUs were busy (1-minute load ≥ cores: another run, a niced test) is used, not
    cached."""
    conditions = peak_conditions(device, dtype)
    key = " | ".join(str(v) for v in conditions.values())
    path = peak_file()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    old = cached.get(key, {}).get("flop_s")
    if old and not fresh:
        return float(old)
    load = os.getloadavg()[0]
    flop_s = max(measure_peak(device, dtype), float(old or 0.0))
    if torch.device(device).type == "cpu" and load >= (os.cpu_count() or 1):
        return flop_s
    when = datetime.now(UTC).isoformat(timespec="seconds")
    cached[key] = {
        **conditions,
        "flop_s": flop_s,
        "date": when,
        "load_1min": round(load, 2),
        "trials": TRIALS,
        "sizes": SIZES.get(torch.device(device).type, SIZES["cpu"]),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(cached, indent=1))
    except OSError:  # also a concurrent writer's rename taking the same temporary file
        pass  # a read-only cache: measured again next time
    return flop_s


class Peak:
    """A run's matmul peak (matmul_peak). A step whose MFU would exceed 1 shows the peak is stale (measured
    under load, or on a slower kernel): it is measured again, once per run, with an info event; a step that
    still beats it is reported as it is, never capped, with one warning event: "MFU above the measured peak"."""

    def __init__(self, device: str, dtype: torch.dtype, event=lambda kind, message, **extra: None):
        self.device, self.dtype, self.event = device, dtype, event
        self.flop_s = matmul_peak(device, dtype)
        self.remeasured = self.flagged = False

    def mfu(self, flop_s: float, step: int) -> float:
        """`flop_s` (a step's model FLOP/s) as a share of the peak."""
        if flop_s > self.flop_s and not self.remeasured:
            self.remeasured, old = True, self.flop_s
            self.flop_s = matmul_peak(self.device, self.dtype, fresh=True)
            self.event(
                "info",
                f"MFU {flop_s / old:.0%} of the cached matmul peak: peak re-measured, "
                f"{old / 1e9:.4g} → {self.flop_s / 1e9:.4g} GFLOP/s",
                step=step,
            )
        if flop_s > self.flop_s and not self.flagged:
            self.flagged = True
            self.event(
                "warning",
                f"MFU above the measured peak: peak stale (step {step}: {flop_s / 1e9:.4g} GFLOP/s, "
                f"peak {self.flop_s / 1e9:.4g}); perf/mfu is reported as measured, above 1",
                step=step,
            )
        return flop_s / self.flop_s
