"""The named algorithm presets (`algo.name`): each is a documented combination of loss knobs.

`algo.name` fills these defaults; any explicit key in the recipe or on the command line
overrides them; config.toml records the resolved values. See docs/algorithms.md.
"""

from __future__ import annotations

PRESETS: dict[str, dict[str, object]] = {
    # DeepSeekMath GRPO as TRL ships it: per-sequence token mean, symmetric clip.
    "grpo": {"algo.loss_type": "grpo", "algo.epsilon": 0.2, "algo.epsilon_high": 0.2},
    # DAPO (arXiv 2503.14476): clip-higher 0.28, token-level normalisation, no std scaling
    # is *not* part of DAPO (it keeps group std), overlong filtering via masking.
    "dapo": {"algo.loss_type": "dapo", "algo.epsilon": 0.2, "algo.epsilon_high": 0.28,
             "algo.mask_truncated_completions": True},
    # Dr. GRPO (arXiv 2503.20783): constant normaliser B*L_max, no std scaling.
    "dr_grpo": {"algo.loss_type": "dr_grpo", "algo.scale_rewards": "none"},
    # GSPO (arXiv 2507.18071): sequence ratio exp(mean log r), clip range 3e-4 / 4e-4.
    "gspo": {"algo.importance_sampling_level": "sequence", "algo.epsilon": 3e-4,
             "algo.epsilon_high": 4e-4, "algo.loss_type": "grpo"},
    # Precision-RL (arXiv 2510.26788) algorithm set.
    "ppo": {"algo.loss_type": "dapo", "algo.is_level": "none"},
    "ppo_token_tis": {"algo.loss_type": "dapo", "algo.is_level": "token", "algo.is_mode": "truncate",
                      "algo.is_cap": 2.0},
    "ppo_seq_tis": {"algo.loss_type": "dapo", "algo.is_level": "sequence", "algo.is_mode": "truncate",
                    "algo.is_cap": 2.0},
    "ppo_seq_mis": {"algo.loss_type": "dapo", "algo.is_level": "sequence", "algo.is_mode": "mask",
                    "algo.is_cap": 10.0},
    "pg_seq_is": {"algo.loss_type": "dapo", "algo.is_level": "sequence", "algo.is_mode": "truncate",
                  "algo.is_cap": 1e30},
    "pg_seq_tis": {"algo.loss_type": "dapo", "algo.is_level": "sequence", "algo.is_mode": "truncate",
                   "algo.is_cap": 2.0},
    "pg_seq_mis": {"algo.loss_type": "dapo", "algo.is_level": "sequence", "algo.is_mode": "mask",
                   "algo.is_cap": 10.0},
}


def defaults(name: str) -> dict[str, object]:
    return dict(PRESETS.get(name, {}))


def is_policy_gradient(name: str) -> bool:
    """pg_* presets use the unclipped REINFORCE-style objective -sg(w)·A·log π."""
    return name.startswith("pg_")
