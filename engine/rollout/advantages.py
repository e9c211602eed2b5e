"""Group-relative advantages (GRPO, DeepSeekMath arXiv 2402.03300 §4.1.2).

Mirrors TRL 1.16 `GRPOTrainer._generate_and_score_completions` ("sum_then_normalize" branch):
weighted nansum over reward functions, NaN for rows where every function returned None,
nan-aware group mean / std, advantages of unscorable rows forced to 0.
"""

from __future__ import annotations

import torch

STD_EPS = 1e-4  # TRL adds 1e-4 to the std before dividing
ZERO_STD = 1e-8  # a reward std this small is no signal (torch.isclose(std, 0)'s tolerance; NaN is none either)


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased (Bessel-corrected) std ignoring NaNs; NaN when fewer than 2 values (as trl.trainer.utils.nanstd)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(var, float("nan")))
    std = torch.sqrt(var * correction)
    return std.squeeze(dim) if dim is not None else std.reshape(())


def weighted_totals(rewards: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each completion's reward [N] from per-function rewards [N, F]: r_i = Σ_k w_k r_ik, skipping functions
    that returned None (NaN); NaN where every function did (excluded from the baseline, advantage 0)."""
    rewards = rewards.float()
    total = (rewards * weights.to(rewards).unsqueeze(0)).nansum(dim=1)
    total[torch.isnan(rewards).all(dim=1)] = float("nan")
    return total


def compute_advantages(
    rewards: torch.Tensor, weights: torch.Tensor, group_size: int, scale: str
) -> tuple[torch.Tensor, dict]:
    """Advantages [N] from per-function rewards [N, F] (NaN = function not applicable).

    Rows are grouped in consecutive blocks of `group_size` completions of the same prompt.
    scale: "group" divides by the group std (GRPO), "batch" by the batch std (Dr. GRPO notes,
    TRL's scale_rewards="batch"), "none" only centres (Dr. GRPO, arXiv 2503.20783).
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards = {scale!r}: allowed: group, batch, none")
    if rewards.dim() != 2 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards shape {tuple(rewards.shape)}: need [N, F] with N a multiple of {group_size}")
    total = weighted_totals(rewards, weights)

    grouped = total.view(-1, group_size)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(group_size)
    if scale == "batch":
        std = nanstd(total).expand_as(total) if total.numel() > 1 else torch.zeros_like(total)
    else:  # "group", and "none" (std used only for the zero-std metric)
        std = nanstd(grouped, dim=1).repeat_interleave(group_size) if group_size > 1 else torch.zeros_like(total)

    # Â_i = (r_i - mean(r_group)) / (std + 1e-4)   (GRPO eq. in §4.1.2; Dr. GRPO drops the division)
    advantages = total - mean
    if scale != "none":
        advantages = advantages / (std + STD_EPS)
    advantages = torch.nan_to_num(advantages, nan=0.0)

    metrics = {
        "reward/mean": torch.nanmean(total).item(),
        "reward/std": nanstd(total).item(),
        "reward/frac_zero_std": (std <= ZERO_STD).float().mean().item(),
    }
    return advantages, metrics
