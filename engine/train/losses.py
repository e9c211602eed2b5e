"""Policy losses: loss_type normalisation, PPO clipping, rollout-correction IS, KL to the reference.

One function, `policy_loss`, read top to bottom:

1. rollout-correction weights w against the sampler μ (TIS / MIS / IcePop, token or sequence level);
2. the per-token objective: PPO-clip of r = π_θ/π_old (token, or GSPO sequence ratio),
   or the vanilla policy gradient -A·log π_θ;
3. per-token loss × w, + β·k3 KL to the reference;
4. the loss_type normalisation (contract/loss_types.py: grpo | bnpo | dr_grpo | dapo).

Numerically it reproduces TRL 1.16 `GRPOTrainer._compute_loss` (and the IS-ratio lines of
`_generate_and_score_completions`) for every knob TRL shares; tests/test_losses_trl_parity.py
checks value and gradient to 1e-6. docs/algorithms.md lists the formulas and papers.

Gradient accumulation: grpo / bnpo / dr_grpo losses are means over *this* call's batch, so a
trainer that splits a batch into k micro-batches divides each by k (as TRL does). dapo divides
by `num_items_in_batch` (TRL: the active tokens of the generation batch over its
steps_per_generation optimizer steps), so micro-batch losses simply add up.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...contract import loss_types
from ...contract.algorithms import rollout_is_level
from ...contract.config import AlgoConfig
from ...contract.errors import UserError
from ..rollout.batching import LossInputs

SEQ_LOG_RATIO_MAX = 20.0  # sequence-level log ρ is capped here (ρ ≤ 4.9e8) so plain IS cannot overflow


def masked_mean(x: Tensor, mask: Tensor) -> float:
    """Mean of x over active tokens; a [B, 1] x (one value per sequence) is averaged over sequences."""
    if x.shape[-1] == 1:
        return x.float().mean().item()
    return ((x * mask).sum() / mask.sum().clamp(min=1.0)).item()


def masked_max(x: Tensor, mask: Tensor) -> float:
    """Largest x over active tokens (0.0 when there is none); a [B, 1] x over sequences."""
    if x.shape[-1] == 1:
        return x.float().max().item()
    active = x[mask.bool()]
    return active.max().item() if active.numel() else 0.0


def rollout_correction(
    behaviour_logps: Tensor, rollout_logps: Tensor, mask: Tensor, level: str, mode: str, cap: float, floor: float = 0.0
) -> tuple[Tensor, dict[str, float]]:
    """IS weights w ([B, T] or [B, 1], no grad) correcting samples from μ towards the behaviour policy.

    token:    ρ_t = π_b(y_t)/μ(y_t)                  sequence: ρ = Π_t π_b(y_t)/μ(y_t)
    truncate: w = clamp(ρ, F, C)  (TIS, Yao et al. 2025; C = 0: no cap, plain IS; F = 0: no floor)
    mask:     w = ρ·1[F ≤ ρ ≤ C]  (MIS, arXiv 2510.26788; with F > 0 IcePop's M(ρ; α, β), arXiv 2510.18855)
    with C = algo.is_cap and F = algo.is_floor, as TRL 1.16's clip_max / clip_min. Tokens whose μ is NaN (not
    scored by the sampler) get ρ_t = 1, as in TRL. mismatch/masked_frac is the share of ρ outside [F, C].
    """
    with torch.no_grad():
        log_rho = torch.nan_to_num((behaviour_logps - rollout_logps) * mask, nan=0.0)
        if level == "sequence":
            log_rho = log_rho.sum(dim=-1, keepdim=True).clamp(max=SEQ_LOG_RATIO_MAX)
        rho = torch.exp(log_rho)
        outside = rho < floor
        if cap > 0:
            outside |= rho > cap
        if mode == "truncate":
            weights = rho.clamp(min=floor, max=cap if cap > 0 else math.inf)  # ρ ≥ 0: floor 0 is no floor
        elif mode == "mask":
            weights = rho.masked_fill(outside, 0.0)
        else:
            raise ValueError(f"algo.is_mode = {mode!r}: allowed: truncate, mask")

        # Metrics over active units: completion tokens (token level) or non-empty sequences.
        active = mask.bool() if level == "token" else (mask.sum(-1, keepdim=True) > 0)
        r, w = rho[active].double(), weights[active].double()  # float64: ESS stays within [0, 1]
        if r.numel() == 0:
            return weights, {}
        sq = (w * w).sum()
        metrics = {
            "mismatch/is_min": r.min().item(),
            "mismatch/is_mean": r.mean().item(),
            "mismatch/is_max": r.max().item(),
            "mismatch/masked_frac": outside[active].float().mean().item(),
            # Kish effective sample size of the applied weights, (Σw)² / (n·Σw²) ∈ [0, 1]
            "mismatch/ess": (w.sum() ** 2 / (w.numel() * sq)).item() if sq > 0 else 0.0,
        }
    return weights, metrics


def policy_loss(
    inp: LossInputs,
    algo: AlgoConfig,
    max_completion_len: int,
    num_items_in_batch: int | float | Tensor | None = None,
    rollout_backend: str = "hf",
) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss to minimise and its metrics (clip/*, policy/ratio_*, kl_ref, entropy, mismatch/is_*, ...).
    `rollout_backend` (hf | vllm) resolves algo.is_level = 'auto'."""
    logps, old_logps = inp.logps, inp.old_logps.detach()
    mask = inp.mask.to(logps.dtype)
    adv = inp.advantages.to(logps.dtype).unsqueeze(-1)  # [B, 1]
    metrics: dict[str, float] = {}

    # 1. Rollout correction against μ. PPO corrects π_old vs μ (the ratio to π_θ is clipped
    #    separately); the pg objective has no π_old term, so its weight is sg(π_θ/μ).
    is_weights, is_level = None, rollout_is_level(algo.is_level, rollout_backend)
    if is_level != "none":
        if inp.rollout_logps is None:
            raise ValueError(f"algo.is_level = {is_level!r} needs rollout_logps (μ) from the sampler")
        behaviour = logps.detach() if algo.objective == "pg" else old_logps
        is_weights, is_metrics = rollout_correction(
            behaviour, inp.rollout_logps, mask, is_level, algo.is_mode, algo.is_cap, algo.is_floor
        )
        metrics.update(is_metrics)

    # 2. The ratio r = π_θ/π_old: per token, or GSPO's exp(mean_t log r_t) per sequence (arXiv 2507.18071 eq. 7).
    log_ratio = logps - old_logps
    if algo.importance_sampling_level == "sequence":
        log_ratio = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    ratio = torch.exp(log_ratio)
    metrics["policy/ratio_mean"] = masked_mean(ratio.detach(), mask)
    metrics["policy/ratio_max"] = masked_max(ratio.detach(), mask)

    if algo.objective == "ppo":
        # PPO-clip (Schulman et al. 2017): -min(r·A, clip(r, 1-ε_low, 1+ε_high)·A); ε_high > ε_low is
        # DAPO's clip-higher; delta caps the unclipped term from above (INTELLECT-2, arXiv 2505.07291).
        clipped = torch.clamp(ratio, 1 - algo.epsilon, 1 + algo.epsilon_high)
        unclipped = torch.clamp(ratio, max=algo.delta) if algo.delta > 0 else ratio
        per_token_loss = -torch.min(unclipped * adv, clipped * adv)
        low = (ratio < 1 - algo.epsilon) & (adv < 0)
        high = (ratio > 1 + algo.epsilon_high) & (adv > 0)
        metrics["clip/low"] = masked_mean(low.to(logps.dtype), mask)
        metrics["clip/high"] = masked_mean(high.to(logps.dtype), mask)
        metrics["clip/region"] = masked_mean((low | high).to(logps.dtype), mask)
    elif algo.objective == "pg":
        # Vanilla policy gradient: -A·log π_θ(y_t); with w below, -sg(w)·A·log π_θ (arXiv 2510.26788).
        per_token_loss = -adv * logps
        metrics.update({"clip/low": 0.0, "clip/high": 0.0, "clip/region": 0.0})
    else:
        raise UserError(key="algo.objective", value=algo.objective, allowed=("ppo", "pg"))

    # 3. Rollout-correction weights multiply the per-token loss.
    if is_weights is not None:
        per_token_loss = per_token_loss * is_weights

    # KL to the reference with Schulman's k3 estimator: exp(ref - θ) - (ref - θ) - 1 ≥ 0. TRL's
    # default use_bias_correction_kl multiplies it by r (DeepSeek-V3.2, arXiv 2512.02556).
    if algo.beta > 0:
        if inp.ref_logps is None:
            raise ValueError("algo.beta > 0 needs ref_logps from the reference policy")
        d = inp.ref_logps - logps
        per_token_kl = torch.exp(d) - d - 1
        if algo.use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio
        per_token_loss = per_token_loss + algo.beta * per_token_kl
        metrics["kl_ref"] = masked_mean(per_token_kl.detach(), mask)

    if inp.entropy is not None:
        metrics["entropy"] = masked_mean(inp.entropy.detach(), mask)

    # 4. Normalise, as the loss type says (contract/loss_types.py).
    loss = loss_types.of(algo.loss_type).normalise(per_token_loss * mask, mask, max_completion_len, num_items_in_batch)
    return loss, metrics
