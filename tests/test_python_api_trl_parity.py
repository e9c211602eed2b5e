"""One script, two trainers: the same GRPOConfig fields, reward, dataset and LoraConfig given to trl.GRPOTrainer and
to grpo_studio.GRPOTrainer take one step's loss and gradient on one shared rollout (ours), through the bench's
parity check (benchmarks/step_parity.shared_rollout_parity). What the API maps from TRL's fields and shows in one
on-policy step (the loss type and its normaliser, reward scaling into advantages, the batch arithmetic, LoRA's
rank, alpha and modules) is what both sides compute with. Measured on tiny-arith: gradients 2.5e-6 apart
(relative L2), losses -0.0151485 both; with algo.loss_type set to grpo instead of TRL's default dapo the gradients
are 0.19 apart. (ε, β and the learning rate do not show in one on-policy step's gradient.)"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

PROMPTS = ["1+1=", "2+3=", "4+4=", "5+2=", "3+6=", "7+1=", "2+2=", "6+3="]


def reward_digits(completions, **kwargs):
    """Differs between completions: the count of digits."""
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def script(GRPOConfig, GRPOTrainer, model, out):
    """A user's TRL script: only the import differs between the two sides."""
    from datasets import Dataset
    from peft import LoraConfig

    args = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-4,
        max_steps=1,
        bf16=False,
        report_to="none",
        save_strategy="no",
    )
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_digits,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear"),
    )


def test_the_same_script_steps_alike_under_trl_and_grpo_studio(tmp_path):
    import trl

    import grpo_studio
    from grpo_studio.benchmarks.step_parity import TOLERANCE, shared_rollout_parity
    from grpo_studio.engine.model import policy_loader

    model = str(policy_loader.resolve_model_path("tiny-arith"))
    ours = script(grpo_studio.GRPOConfig, grpo_studio.GRPOTrainer, "tiny-arith", str(tmp_path / "run"))
    ours._prepare(resume=False)  # what train() does before its Trainer: the run's inputs, the prompts measured
    result = shared_rollout_parity(
        ours.config,
        lambda tmp: script(trl.GRPOConfig, trl.GRPOTrainer, model, tmp),
        ours.args.seed,
        run_dir=str(tmp_path / "run"),
    )
    assert result["rows"] == 8 and result["completion_tokens"] > 0
    assert result["grad_rel_l2"] < TOLERANCE, result
    assert result["loss_ours"] == pytest.approx(result["loss_trl"], rel=1e-4, abs=1e-6), result
