"""Group-relative advantages: GRPO's (DeepSeekMath arXiv 2402.03300 §4.1.2) or pass@k's (algo.advantage).

GRPO mirrors TRL 1.16 `GRPOTrainer._generate_and_score_completions` ("sum_then_normalize" branch):
weighted nansum over reward functions, NaN for rows where every function returned None,
nan-aware group mean / std, advantages of unscorable rows forced to 0.

pass@k (Chen et al. 2025, arXiv 2508.10751, the analytical derivation): a completion passes when its reward is
> 0 (as eval/pass@k counts a sample right); a k-subset of the group scores 1 when any member passes, and each
completion's advantage is the mean of (subset score − R̄) / σ over the k-subsets that hold it.
"""

from __future__ import annotations

from math import comb, sqrt

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


def pass_at_k_group(passed: list[bool], k: int, scale: str) -> tuple[list[float], float]:
    """One group's pass@k advantages, and σ (0: no signal). Over its n completions, c passing:

      R̄ = 1 − C(n−c, k)/C(n, k)              the mean subset score (pass@k of the group)
      σ = sqrt(R̄ (1 − R̄))                    the std of the C(n, k) binary subset scores
      Â_pass = (1 − R̄)/σ                     every subset holding a passing completion scores 1
      Â_fail = (1 − R̄ − C(n−c−1, k−1)/C(n−1, k−1))/σ   the ratio: its subsets with no passing member
    scale "none" keeps the numerators; σ = 0 (no pass, or fewer than k failures) gives 0 (their numerators are
    0 too). A group with fewer than k scored completions has no k-subset: 0."""
    n, c = len(passed), sum(passed)
    if n < k:
        return [0.0] * n, 0.0
    mean = 1 - comb(n - c, k) / comb(n, k)
    std = sqrt(mean * (1 - mean))
    fail = 1 - mean - comb(n - c - 1, k - 1) / comb(n - 1, k - 1) if c < n else 0.0
    numerators = [1 - mean if p else fail for p in passed]
    if scale == "none":
        return numerators, std
    return [a / std if std > 0 else 0.0 for a in numerators], std


def pass_at_k_advantages(total: torch.Tensor, group_size: int, k: int, scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """pass_at_k_group over each group of `total` [N] (NaN rows: unscored, left out, advantage 0); the
    advantages [N] and each row's group σ [N]."""
    advantages, stds = torch.zeros_like(total), torch.zeros_like(total)
    for start in range(0, total.numel(), group_size):
        group = total[start : start + group_size]
        scored = (~torch.isnan(group)).nonzero().flatten()
        values, std = pass_at_k_group((group[scored] > 0).tolist(), k, scale)
        advantages[start + scored] = torch.tensor(values, dtype=total.dtype)
        stds[start : start + group_size] = std
    return advantages, stds


def compute_advantages(
    rewards: torch.Tensor,
    weights: torch.Tensor,
    group_size: int,
    scale: str,
    advantage: str = "grpo",
    k: int = 1,
) -> tuple[torch.Tensor, dict]:
    """Advantages [N] from per-function rewards [N, F] (NaN = function not applicable).

    Rows are grouped in consecutive blocks of `group_size` completions of the same prompt.
    scale: "group" divides by the group std (GRPO), "batch" by the batch std (Dr. GRPO notes,
    TRL's scale_rewards="batch"), "none" only centres (Dr. GRPO, arXiv 2503.20783).
    advantage: "grpo", or "pass_at_k" with its k (pass_at_k_group; scale "group" or "none").
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards = {scale!r}: allowed: group, batch, none")
    if rewards.dim() != 2 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards shape {tuple(rewards.shape)}: need [N, F] with N a multiple of {group_size}")
    total = weighted_totals(rewards, weights)
    if advantage == "pass_at_k":
        advantages, std = pass_at_k_advantages(total, group_size, k, scale)
        return advantages, reward_metrics(total, std)
    if advantage != "grpo":
        raise ValueError(f"algo.advantage = {advantage!r}: allowed: grpo, pass_at_k")

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
    return torch.nan_to_num(advantages, nan=0.0), reward_metrics(total, std)


def reward_metrics(total: torch.Tensor, std: torch.Tensor) -> dict[str, float]:
    """reward/* of the weighted totals [N], with each row's advantage std [N] (at most ZERO_STD: no signal)."""
    return {
        "reward/mean": torch.nanmean(total).item(),
        "reward/std": nanstd(total).item(),
        "reward/frac_zero_std": (std <= ZERO_STD).float().mean().item(),
    }
