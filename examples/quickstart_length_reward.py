"""TRL's GRPO quick start (a length reward on a prompt dataset), unchanged but for the import, offline data and
the packaged SmolLM2. `GRPO_EXAMPLE_STEPS` (default 2) keeps it short; the run directory is the first argument."""

import os
import sys

from datasets import Dataset

from grpo_studio import GRPOConfig, GRPOTrainer

dataset = Dataset.from_dict(
    {
        "prompt": [
            "SUBREDDIT: r/cooking\nPOST: My bread never rises, what am I doing wrong?\nTL;DR:",
            "SUBREDDIT: r/running\nPOST: First marathon next month and my knee hurts.\nTL;DR:",
            "SUBREDDIT: r/personalfinance\nPOST: Should I pay off my car loan early?\nTL;DR:",
            "SUBREDDIT: r/gardening\nPOST: Tomato leaves are turning yellow from the bottom.\nTL;DR:",
        ]
    }
)


# Define the reward function, which rewards completions that are close to 20 characters
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


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
    reward_funcs=reward_len,
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
