"""TRL's own reward functions by name: rewards.funcs = ["trl.rewards:accuracy_reward", ...].

TRL's functions read `completion[0]["content"]`, so text completions are handed over as one
assistant message each; the accuracy functions read a `solution` column, which is the data's
`answer` when the data has no `solution` column. TRL's factories (get_cosine_scaled_reward, ...)
need token ids (`completion_ids`) and arguments, which a name cannot give: they are refused.
"""

from __future__ import annotations

import importlib
import importlib.util

from ..contract.errors import UserError, did_you_mean

PREFIX = "trl.rewards:"
# name -> needs math-verify (TRL's accuracy rewards parse with it)
USABLE = {"accuracy_reward": True, "reasoning_accuracy_reward": True, "think_format_reward": False}
FACTORIES = ("get_cosine_scaled_reward", "get_repetition_penalty_reward", "get_soft_overlong_punishment")


def _fail(entry: str, why: str) -> UserError:
    return UserError(why, key="rewards.funcs", value=entry)


def load(entry: str):
    """The TRL function named by 'trl.rewards:NAME', in grpo-studio's calling convention."""
    name = entry[len(PREFIX) :]
    usable = ", ".join(PREFIX + n for n in USABLE)
    if name in FACTORIES:
        raise _fail(
            entry,
            f"a TRL factory that needs arguments and completion_ids, which a name cannot give; "
            f"wrap it in a file.py:function, or use {usable}",
        )
    if name not in USABLE:
        raise _fail(entry, f"not a TRL reward usable by name; usable: {usable}{did_you_mean(name, USABLE)}")
    if importlib.util.find_spec("trl") is None:
        raise _fail(entry, "needs TRL: pip install 'grpo-studio[trl]'")
    if USABLE[name] and importlib.util.find_spec("math_verify") is None:
        raise _fail(entry, "needs math-verify: pip install 'grpo-studio[math]'")
    fn = getattr(importlib.import_module("trl.rewards"), name)

    def reward(prompts, completions, **columns):
        messages = [c if isinstance(c, (list, tuple)) else [{"role": "assistant", "content": c}] for c in completions]
        if USABLE[name] and "solution" not in columns and "answer" in columns:
            columns = {**columns, "solution": columns["answer"]}
        return fn(completions=messages, **columns)

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = fn.__doc__
    return reward
