"""Our defaults against TRL 1.16's, read from `trl.GRPOConfig()` itself.

Every key whose meaning TRL shares has TRL's default; the keys that differ on purpose are listed in
INTENDED, each with its reason in docs/algorithms.md ("Defaults against TRL 1.16"). The `grpo` preset
(the default algo.name) is those defaults: GRPO as TRL ships it.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import trl
from trl.trainer.grpo_trainer import GRPOTrainer

from grpo_studio.contract import algorithms, config

DOC = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"


def _is_level(backend: str):
    """TRL corrects towards the sampler only when it samples with vLLM (use_vllm), at its mode's level."""

    def read(c):
        if backend != "vllm" or not c.vllm_importance_sampling_correction:
            return "none"
        return c.vllm_importance_sampling_mode.split("_")[0]

    return read


# our key -> TRL's value for it, from a GRPOConfig (a field name, or how to read it)
SHARED = {
    "algo.loss_type": "loss_type",
    "algo.epsilon": "epsilon",
    "algo.epsilon_high": lambda c: c.epsilon if c.epsilon_high is None else c.epsilon_high,  # GRPOTrainer.__init__
    "algo.delta": lambda c: 0.0 if c.delta is None else c.delta,  # None = off = our 0
    "algo.beta": "beta",
    "algo.scale_rewards": "scale_rewards",
    "algo.mask_truncated_completions": "mask_truncated_completions",
    "algo.importance_sampling_level": "importance_sampling_level",
    "algo.use_bias_correction_kl": "use_bias_correction_kl",
    "algo.is_mode": lambda c: c.vllm_importance_sampling_mode.split("_")[1],
    "algo.is_cap": "vllm_importance_sampling_clip_max",
    "algo.is_floor": lambda c: c.vllm_importance_sampling_clip_min or 0.0,  # None = no floor = our 0
    "rollout.temperature": "temperature",
    "rollout.top_p": "top_p",
    "rollout.top_k": "top_k",
    "rollout.num_generations": "num_generations",
    "rollout.colocate": lambda c: c.vllm_mode == "colocate",
    "rollout.sleep": "vllm_enable_sleep_mode",
    "train.num_iterations": "num_iterations",
    "train.steps_per_generation": "steps_per_generation",  # None resolves to gradient_accumulation_steps = 1
    # TRL shuffles every generation batch before splitting it (no option): _prepare_inputs
    "train.shuffle_batch": lambda c: "shuffle_sequence_dict(" in inspect.getsource(GRPOTrainer._prepare_inputs),
    "train.weight_decay": "weight_decay",
    "train.warmup_steps": "warmup_steps",
    "train.grad_clip": "max_grad_norm",
    "rewards.weights": lambda c: [] if c.reward_weights is None else c.reward_weights,
}

# our key -> TRL's name: defaults that differ on purpose (docs/algorithms.md says why)
INTENDED = {
    "model.dtype": "bf16",
    "model.gradient_checkpointing": "gradient_checkpointing",
    "rollout.gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "rollout.max_completion_len": "max_completion_length",
    "train.lr": "learning_rate",
    "train.lr_schedule": "lr_scheduler_type",
    "train.seed": "seed",
}


@pytest.fixture(scope="module")
def trl_defaults(tmp_path_factory):
    return trl.GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), use_cpu=True)


def ours(key: str):
    section, name = key.split(".")
    return getattr(getattr(config.Config(), section), name)


def theirs(c, how):
    return how(c) if callable(how) else getattr(c, how)


@pytest.mark.parametrize("key", SHARED)
def test_shared_default_is_trls(trl_defaults, key):
    assert ours(key) == theirs(trl_defaults, SHARED[key])


@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_rollout_correction_is_trls_for_each_rollout(trl_defaults, backend):
    """algo.is_level = 'auto': TRL's vllm_importance_sampling_correction, which acts on vLLM rollouts only."""
    assert algorithms.rollout_is_level(ours("algo.is_level"), backend) == _is_level(backend)(trl_defaults)


@pytest.mark.parametrize("key", INTENDED)
def test_intended_difference_differs_and_is_documented(trl_defaults, key):
    value = theirs(trl_defaults, INTENDED[key])
    assert str(ours(key)) != str(getattr(value, "value", value))  # else it is no difference: move it to SHARED
    rows = DOC.read_text().split("## Defaults against TRL 1.16", 1)[1].split("\n## ", 1)[0]
    assert f"| `{key}` | `{INTENDED[key]}` |" in rows


def test_the_grpo_preset_is_the_defaults():
    """algo.name = grpo (the default) sets exactly the dataclass defaults, so `grpo` is TRL's GRPO."""
    assert config.Config().algo.name == "grpo"
    for key, value in algorithms.PRESETS["grpo"].items():
        assert ours(key) == value, key
