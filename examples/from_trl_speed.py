"""The quick start timed under TRL and under grpo-studio: one script, the trainer picked by its first argument.

    taskset -c 1 python examples/from_trl_speed.py trl RUN_DIR
    taskset -c 1 python examples/from_trl_speed.py grpo_studio RUN_DIR

Both sides train the packaged SmolLM2 (TRL reads the transformers folder grpo-studio converts it to, the same
weights) in fp32 on the same prompts, reward and GRPOConfig: 2 prompts x 4 completions of up to 32 tokens a step,
GRPO_EXAMPLE_STEPS steps (default 4). A callback notes when each optimizer step ends; the script prints steps/s
and CPU seconds a step over the steps after the first (the first carries the warm-up), and the mean completion
length TRL's logs report, so the two sides' work per step can be compared."""

import importlib
import os
import sys
import time

from datasets import Dataset
from transformers import TrainerCallback

trainer_lib = importlib.import_module(sys.argv[1])  # trl or grpo_studio: the only line that differs
GRPOConfig, GRPOTrainer = trainer_lib.GRPOConfig, trainer_lib.GRPOTrainer
MODEL = os.environ.get("GRPO_EXAMPLE_MODEL", "smollm2-135m-instruct")
if sys.argv[1] == "trl":  # TRL loads a transformers folder: the one grpo-studio reads the packaged name from
    from grpo_studio.engine.model.policy_loader import resolve_model_path

    MODEL = str(resolve_model_path(MODEL))

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


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


class StepClock(TrainerCallback):
    """A TrainerCallback: when each optimizer step ended (wall clock, and this process's CPU time, which a busy
    machine does not stretch), and the completion lengths logged."""

    def __init__(self):
        super().__init__()
        self.ends, self.cpu_ends, self.lengths = [], [], []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())
        self.cpu_ends.append(time.process_time())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs:
            self.lengths.append(logs["completions/mean_length"])


clock = StepClock()
training_args = GRPOConfig(
    output_dir=sys.argv[2],
    max_steps=int(os.environ.get("GRPO_EXAMPLE_STEPS", "4")),
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=32,
    bf16=False,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
trainer = GRPOTrainer(
    model=MODEL, reward_funcs=reward_len, args=training_args, train_dataset=dataset, callbacks=[clock]
)
trainer.train()
timed = len(clock.ends) - 1
mean_length = sum(clock.lengths) / max(len(clock.lengths), 1)
print(
    f"{sys.argv[1]}: {timed / (clock.ends[-1] - clock.ends[0]):.4f} steps/s over steps 2-{len(clock.ends)} "
    f"({(clock.cpu_ends[-1] - clock.cpu_ends[0]) / timed:.2f} CPU s a step), completions {mean_length:.1f} tokens "
    "on average",
    flush=True,
)
