"""The named algorithm presets (`algo.name`): each is a documented combination of loss knobs.

`algo.name` fills these defaults; any explicit key in the recipe or on the command line
overrides them; config.toml records the resolved values. See docs/algorithms.md.

Every preset sets every loss knob it depends on, so switching `algo.name` never inherits a
stale value from the dataclass defaults of another algorithm.
"""

from __future__ import annotations

# Knobs every preset starts from: the AlgoConfig defaults, which are TRL 1.16's GRPOConfig defaults
# (loss_type "dapo"; vllm_importance_sampling_correction on for vLLM rollouts with mode "sequence_mask",
# clip_max 3.0); tests/test_trl_defaults.py compares them with trl.GRPOConfig().
_BASE: dict[str, object] = {
    "algo.objective": "ppo",
    "algo.loss_type": "dapo",
    "algo.epsilon": 0.2,
    "algo.epsilon_high": 0.2,
    "algo.importance_sampling_level": "token",
    "algo.scale_rewards": "group",
    "algo.mask_truncated_completions": False,
    "algo.is_level": "auto",
    "algo.is_mode": "mask",
    "algo.is_cap": 3.0,
    "algo.is_floor": 0.0,  # TRL's vllm_importance_sampling_clip_min = None
}


def _preset(**knobs: object) -> dict[str, object]:
    return {**_BASE, **{f"algo.{k}": v for k, v in knobs.items()}}


PRESETS: dict[str, dict[str, object]] = {
    # GRPO, DeepSeekMath (arXiv 2402.03300) as TRL 1.16 ships it: symmetric clip, token-level "dapo"
    # normalisation (TRL's default loss_type), sequence-level MIS against a vLLM rollout (C = 3).
    "grpo": _preset(),
    # DAPO (arXiv 2503.14476): clip-higher (0.2 / 0.28), token-level normalisation over the batch,
    # overlong completions masked out of the loss. DAPO keeps the group std scaling.
    "dapo": _preset(loss_type="dapo", epsilon_high=0.28, mask_truncated_completions=True),
    # Dr. GRPO (arXiv 2503.20783): constant normaliser B·L_max and no std scaling.
    "dr_grpo": _preset(loss_type="dr_grpo", scale_rewards="none"),
    # GSPO (arXiv 2507.18071): sequence ratio exp(mean_t log r_t), clip range 3e-4 / 4e-4, the sequence
    # losses averaged over the group (eq. 5: loss_type grpo, as TRL's GSPO example sets it).
    "gspo": _preset(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, loss_type="grpo"),
    # Precision-RL algorithm set (arXiv 2510.26788, "Defeating the Training-Inference Mismatch
    # via FP16"), token-mean aggregation as in its verl implementation. ρ is π_old/μ, μ the sampler.
    "ppo": _preset(loss_type="dapo", is_level="none"),  # PPO-clip against π_old, ignores μ
    "ppo_token_tis": _preset(loss_type="dapo", is_level="token", is_mode="truncate", is_cap=2.0),
    "ppo_seq_tis": _preset(loss_type="dapo", is_level="sequence", is_mode="truncate", is_cap=2.0),
    "ppo_seq_mis": _preset(loss_type="dapo", is_level="sequence", is_mode="mask", is_cap=10.0),
    # Vanilla policy gradient with sequence-level IS: -sg(π_θ(y)/μ(y))·A·Σ_t log π_θ(y_t), unclipped.
    # is_cap = 0 with is_mode = truncate means "no truncation" (plain IS).
    "pg_seq_is": _preset(loss_type="dapo", objective="pg", is_level="sequence", is_mode="truncate", is_cap=0.0),
    "pg_seq_tis": _preset(loss_type="dapo", objective="pg", is_level="sequence", is_mode="truncate", is_cap=2.0),
    "pg_seq_mis": _preset(loss_type="dapo", objective="pg", is_level="sequence", is_mode="mask", is_cap=10.0),
    # IcePop (Ring-1T, "Every Step Evolves", arXiv 2510.18855): tokens whose π_old/μ lies outside [0.5, 5] are
    # masked out of the gradient, the others weighted by it; each completion's token mean (the paper's 1/|y_i|).
    "icepop": _preset(loss_type="grpo", is_level="token", is_mode="mask", is_floor=0.5, is_cap=5.0),
}


def rollout_is_level(is_level: str, backend: str) -> str:
    """algo.is_level with 'auto' resolved for the rollout backend ('hf' or 'vllm'): TRL 1.16 corrects vLLM
    rollouts by default (vllm_importance_sampling_correction = True, at the sequence level of its default
    mode sequence_mask) and has no sampler log-probs to correct towards otherwise."""
    if is_level != "auto":
        return is_level
    return "sequence" if backend == "vllm" else "none"


def defaults(name: str) -> dict[str, object]:
    """The keys `algo.name = name` fills in (empty for an unknown name; config validation reports it)."""
    return dict(PRESETS.get(name, {}))


def is_policy_gradient(name: str) -> bool:
    """pg_* presets use the unclipped REINFORCE-style objective -sg(w)·A·log π (algo.objective = 'pg')."""
    return PRESETS.get(name, {}).get("algo.objective") == "pg"
