"""TRL's `tools=` example (docs: Agent Training > Tools): the model may call multiply and async_add, unchanged but
for the import, offline data and the packaged SmolLM2, with a reward that checks the final answer.
`GRPO_EXAMPLE_STEPS` (default 2) keeps it short; the run directory is the first argument."""

import os
import sys

from datasets import Dataset

from grpo_studio import GRPOConfig, GRPOTrainer


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_add(a: int, b: int) -> int:
    """
    Asynchronously adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    return a + b


dataset = Dataset.from_dict(
    {
        "prompt": [
            [{"role": "user", "content": f"Use the tools to compute {a}*{b}+{c}."}]
            for a, b, c in [(12, 7, 5), (3, 9, 4), (6, 6, 1), (8, 5, 2)]
        ],
        "answer": ["89", "31", "37", "42"],
    }
)


def answer_reward(completions, answer, **kwargs):
    return [float(a in completion[-1]["content"]) for completion, a in zip(completions, answer)]


trainer = GRPOTrainer(
    model="smollm2-135m-instruct",
    reward_funcs=answer_reward,
    args=GRPOConfig(
        output_dir=sys.argv[1] if len(sys.argv) > 1 else "SmolLM2-135M-GRPO",
        max_steps=int(os.environ.get("GRPO_EXAMPLE_STEPS", "2")),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=16,
        bf16=False,
    ),
    train_dataset=dataset,
    tools=[multiply, async_add],
)
trainer.train()
