"""TRL's GRPO quick start on a conversational dataset with its accuracy reward (trl.rewards.accuracy_reward, which
reads the `solution` column), unchanged but for the import, offline data and the packaged SmolLM2.
`GRPO_EXAMPLE_STEPS` (default 2) keeps it short; the run directory is the first argument."""

import os
import sys

from datasets import Dataset
from trl.rewards import accuracy_reward

from grpo_studio import GRPOConfig, GRPOTrainer

questions = [("What is 2+3?", "5"), ("What is 7*6?", "42"), ("What is 10-4?", "6"), ("What is 9+8?", "17")]
dataset = Dataset.from_dict(
    {
        "prompt": [[{"role": "user", "content": f"{q} Put the answer in \\boxed{{}}."}] for q, _ in questions],
        "solution": [f"${a}$" for _, a in questions],
    }
)

training_args = GRPOConfig(
    output_dir=sys.argv[1] if len(sys.argv) > 1 else "SmolLM2-135M-GRPO",
    max_steps=int(os.environ.get("GRPO_EXAMPLE_STEPS", "2")),
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=16,
    bf16=False,
)
trainer = GRPOTrainer(
    model="smollm2-135m-instruct",
    reward_funcs=accuracy_reward,
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
