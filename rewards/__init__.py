"""Reward functions in TRL's signature: f(prompts, completions, **columns) -> list[float | None].

    build(cfg.rewards)  -> RewardFuncs: [(name, fn), ...] with the call policy (timeout) attached
    score(funcs, prompts, completions, columns, on_error) -> [N][F] floats, NaN for None

`score` never lets a reward function stop training: an exception, a wrong-length or non-list
result, NaN/inf or a non-number, or a call that outlives rewards.timeout_s turns the affected
samples into None (NaN here: excluded from that function's mean and, as in TRL, skipped by the
weighted nansum before the advantage) and reports one `reward_error` through `on_error`. A sample
whose weighted sum is not finite (rewards.weights = [1e308, 1e308]) has all its rewards set to
None, reported as a reward_error of function 'rewards.weights', rather than training on NaN/inf.

  builtin        the built-in reward functions (correctness, format, length, code_exec, ...)
  runner         calling one reward function so that nothing it does stops training
  sandbox        sandboxed execution of model-written code (code_exec), with _sandbox_child its launcher
  reward_model   a reward model as a reward function ("rm:PATH")
  trl_rewards    TRL's own reward functions by name ("trl.rewards:NAME")

A room of its own, torch-free at import, so the studio lists the built-ins without loading the engine
(reward_model imports torch and transformers when a reward model is built).

May import: contract.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..contract import user_code
from ..contract.errors import UserError, did_you_mean
from ..contract.errors import describe as describe_error
from . import builtin, reward_model, sandbox, trl_rewards
from .runner import RewardFuncs, call_reward, exclude_non_finite_sums, is_async

RewardFn = Callable[..., list]

__all__ = ["build", "score", "RewardFuncs", "describe"]


def _validate(opts: builtin.Options, names: list[str]) -> None:
    import re

    for key in ("answer_regex", "regex"):
        pattern = getattr(opts, key)
        try:
            re.compile(pattern)
        except (re.error, OverflowError, RecursionError) as err:  # also a{99999999999}, deeply nested groups
            raise UserError(f"not a valid regular expression ({err})", key=f"rewards.{key}", value=pattern) from None
    if "regex_match" in names and not opts.regex:
        raise UserError(
            "the regex_match reward needs a pattern, e.g. rewards.regex = '^Dear '",
            key="rewards.regex",
            value=opts.regex,
        )
    if opts.length_min > opts.length_max:
        raise UserError(
            f"must be <= rewards.length_max ({opts.length_max})", key="rewards.length_min", value=opts.length_min
        )
    for key in ("solution_start", "solution_end"):
        if not getattr(opts, key):
            raise UserError("the answer marker cannot be empty", key=f"rewards.{key}", value="")
    if "math_verify" in names and importlib.util.find_spec("math_verify") is None:
        raise UserError("needs math-verify: pip install 'grpo-studio[math]'", key="rewards.funcs", value="math_verify")
    if "code_exec" in names and opts.sandbox == "bwrap" and sandbox.bwrap_problem():
        raise UserError(f"{sandbox.bwrap_problem()}; use auto or namespaces", key="rewards.sandbox", value="bwrap")


def _load_user(entry: str):
    """user_code.load, with what its `except (Exception, SystemExit)` lets through (KeyboardInterrupt or
    another BaseException raised by the module at import) as the same one UserError line. A module
    that calls os._exit() at import ends the process: that cannot be contained in-process."""
    before = set(sys.modules)
    try:
        return user_code.load(entry)
    except Exception:
        raise
    except BaseException as err:  # noqa: BLE001
        for stale in set(sys.modules) - before:  # the half-run module loader registered: loaded again next time
            if stale.startswith("grpo_user_reward_"):
                del sys.modules[stale]
        target = entry.rpartition(":")[0]
        is_file = target.endswith(".py") or "/" in target or "\\" in target
        doing = f"loading {Path(target).name}" if is_file else f"importing {target!r}"
        raise UserError(f"{doing} raised {describe_error(err)}", key="rewards.funcs", value=entry) from None


def build(spec) -> RewardFuncs:
    """Resolve rewards.funcs: built-in names, 'trl.rewards:NAME', 'rm:PATH' (a reward model) and
    'file.py:function' / 'module:function'. `spec` is a RewardsConfig or a list of names."""
    opts = builtin.Options(funcs=list(spec)) if isinstance(spec, (list, tuple)) else spec
    names = list(opts.funcs)
    _validate(opts, names)
    weights = getattr(opts, "weights", None)
    funcs = RewardFuncs(timeout_s=float(opts.timeout_s), weights=list(weights) if weights else None)
    taken: set[str] = set()
    for entry in names:
        if not isinstance(entry, str):
            raise UserError("expected a name or 'file.py:function'", key="rewards.funcs", value=entry)
        if entry in builtin.REGISTRY:
            name, fn = entry, builtin.configure(entry, opts)
        elif entry.startswith(trl_rewards.PREFIX):
            fn = trl_rewards.load(entry)
            name = fn.__name__
        elif entry.startswith(reward_model.PREFIX):
            fn = reward_model.RewardModel(entry, opts.reward_model_batch_size)
            name = fn.__name__
        elif ":" in entry:
            fn = _load_user(entry)
            name = getattr(fn, "__name__", None) or entry.rpartition(":")[2]
        else:
            allowed = ", ".join(builtin.REGISTRY)
            raise UserError(
                f"unknown reward; allowed: {allowed}, 'rm:PATH', 'trl.rewards:NAME' or "
                f"'file.py:function'{did_you_mean(entry, builtin.REGISTRY)}",
                key="rewards.funcs",
                value=entry,
            )
        base, k = name, 2
        while name in taken:  # two files exporting `score`: score, score_2
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        funcs.append((name, fn))
    return funcs


def score(funcs, prompts: list, completions: list, columns: dict[str, list], on_error=None) -> list[list[float]]:
    """[N][F] rewards, NaN where a function returned None or failed (failures go to on_error).

    Conversational prompts (lists of messages) make the completions chat messages too, as TRL
    passes them: [{"role": "assistant", "content": text}]."""
    n = len(completions)
    if prompts and isinstance(prompts[0], (list, tuple)):
        completions = [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]
    timeout = getattr(funcs, "timeout_s", 30.0)
    lock = threading.Lock()

    def report(*args, **fields):
        with lock:
            on_error(*args, **fields)

    def one(j: int) -> list:
        name, fn = funcs[j]
        return call_reward(
            name,
            fn,
            prompts,
            completions,
            columns,
            timeout,
            state=getattr(funcs, "seen", None),
            on_error=report if on_error else None,
        )

    # async rewards are awaited side by side (each in its own thread and loop, as TRL gathers them),
    # while the others run one after another here
    concurrent = [j for j, (_, fn) in enumerate(funcs) if is_async(fn)]
    with ThreadPoolExecutor(max_workers=max(1, len(concurrent)), thread_name_prefix="async-reward") as pool:
        pending = {j: pool.submit(one, j) for j in concurrent}
        done = {j: one(j) for j in range(len(funcs)) if j not in pending}
        columns_out = [pending[j].result() if j in pending else done[j] for j in range(len(funcs))]
    table = [[math.nan] * len(funcs) for _ in range(n)]
    for j, values in enumerate(columns_out):
        for i, value in enumerate(values):
            if value is not None:
                table[i][j] = value
    exclude_non_finite_sums(
        table,
        getattr(funcs, "weights", None),
        state=getattr(funcs, "seen", None),
        on_error=report if on_error else None,
    )
    return table


def describe() -> list[tuple[str, str, str]]:
    """(name, one-line description, score range) for every built-in."""
    return [(name, about, span) for name, (_, about, span) in builtin.REGISTRY.items()]
