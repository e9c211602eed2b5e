"""The vocabulary every config key is declared with: `opt` (a field with its default, allowed values, bounds and
help), the lists of allowed values, and the constants that bound the numbers. The keys themselves are declared in
config_training.py (model, rollout, algo, train) and config_schema.py (the other sections, and Config).

Pure python (no torch).
"""

from __future__ import annotations

from dataclasses import field

from . import algorithms, dtypes, loss_types


def opt(default, *, choices=None, lo=None, hi=None, lo_open=False, item=None, auto=None, help=""):
    """A config field with its validation rules (choices, inclusive/open lower bound, upper bound; for a
    list the type of its items, str or float, and the bounds apply to each item; for a key that also takes
    the word "auto", the type of its other values)."""
    meta = {"choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "item": item, "auto": auto, "help": help}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


DTYPES = list(dtypes.DTYPES)
ALGOS = list(algorithms.PRESETS)
LOSS_TYPES = list(loss_types.BY_NAME)
TRACKERS = ("tensorboard", "trackio", "wandb")  # report.to: each an extra of the same name (docs/trackers.md)
# Upper bounds no real run reaches, so a typo (an extra 000) is refused before anything allocates.
MAX_STEPS = 10_000_000  # optimizer steps, and every "every N steps" key
MAX_TOKENS = 1_000_000  # prompt + completion tokens of one sequence
MAX_GENERATIONS = 1024  # completions per prompt
MAX_PROMPTS = 65_536  # prompts per step
MAX_SEQUENCES = 1_048_576  # sequences per step: prompts_per_step x num_generations
MAX_SECONDS = 86_400  # a reward time bound: one day
VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses a hotter one (rollout.temperature takes up to 100)
MAX_UPDATES = 1024  # optimizer steps per rollout: steps_per_generation, num_iterations
MAX_ROUNDS = 1024  # sampling rounds of one rollout: algo.dynamic_sampling_max_rounds
# Every float key is bounded on both sides (tests/test_config_limits.py): generous, but finite, so 1e308 or a
# sign slip is refused in one line before it reaches an optimizer, a sampler or a loss.
MAX_COEF = 1000.0  # a loss coefficient or clip range (algo.beta, epsilon, delta)
MAX_SCALE = 1e6  # a multiplier: LoRA alpha, a reward weight (|w|), a cap, a grad norm
AUTO = "auto"  # the word a key declared with opt(auto=type) takes besides its values
