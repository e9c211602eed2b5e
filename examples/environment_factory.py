"""TRL's `environment_factory` example (docs: Agent Training > Environments): no dataset, the environment samples
its task in reset() and scores itself in get_reward(); unchanged but for the import and the packaged SmolLM2.
`GRPO_EXAMPLE_STEPS` (default 2) keeps it short; the run directory is the first argument."""

import os
import random
import sys

from grpo_studio import GRPOConfig, GRPOTrainer


class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


trainer = GRPOTrainer(
    model="smollm2-135m-instruct",
    args=GRPOConfig(
        output_dir=sys.argv[1] if len(sys.argv) > 1 else "SmolLM2-135M-GRPO",
        max_steps=int(os.environ.get("GRPO_EXAMPLE_STEPS", "2")),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=16,
        bf16=False,
        chat_template_kwargs={"enable_thinking": False},
    ),
    environment_factory=IncrementEnv,
)
trainer.train()
