"""Calling one reward function so that nothing it does can stop training.

Each call runs guarded (contract/user_code.py `guarded`, the guard environments share): in a daemon
worker thread that the caller waits on for at most `timeout_s`. On timeout the worker gets an
asynchronous `RewardTimeout` (which ends pure-Python loops) and is abandoned if it is stuck in C code; every sample of that call becomes None. Because the
function runs in a worker thread, signal-based timeouts inside it (e.g. math_verify's
`parsing_timeout`) cannot be used there: pass `parsing_timeout=None`, or set
rewards.timeout_s = 0 to call functions directly in the trainer's thread (no bound).

An `async def` reward (or one returning an awaitable) is awaited in an event loop of its own in
that worker thread, under `asyncio.wait_for(…, timeout_s)`, so a timeout cancels it cleanly.

Everything the function's own code can run is inside that bound: turning the returned value into
floats (iterating a generator, an object's `__len__` / `__float__` / `__repr__`) and formatting its
exception. Each call gets its own deep copies of prompts, completions and columns, so a function
that edits its inputs cannot change what the others (or samples.jsonl) see. Error texts are cut to
MESSAGE_CHARS, saying how long they were.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import struct
import time
import traceback

from ..contract import user_code
from ..contract.user_code import CallTimeout as RewardTimeout  # the asynchronous timeout, as rewards name it

_MISSING = object()
MESSAGE_CHARS = 500  # an error message longer than this is cut (a 5 MB message would fill events.jsonl)
TRACE_PART_CHARS = 2000  # each part of a traceback (a frame, the exception line) likewise


class RewardFuncs(list):
    """[(name, fn), ...] as the trainer iterates it, plus the call policy and error bookkeeping."""

    def __init__(self, items=(), timeout_s: float = 30.0, weights=None):
        super().__init__(items)
        self.timeout_s = timeout_s
        self.weights = weights  # rewards.weights (None: 1.0 each), for the finite-sum check in `score`
        self.seen: dict[tuple[str, str], int] = {}  # (function, kind) -> affected samples so far


def is_async(fn) -> bool:
    """An `async def` function, or a callable object whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(fn.__call__))


async def _bounded(awaitable, timeout: float):
    try:
        return await asyncio.wait_for(awaitable, timeout if timeout > 0 else None)
    except TimeoutError:
        raise RewardTimeout from None


def _call(fn, kwargs: dict, timeout: float, n: int):
    """(values, problems): the call and the conversion of what it returned, both under the caller's bound."""
    result = fn(**kwargs)
    if inspect.isawaitable(result):  # async rewards: a loop of this thread's own
        result = asyncio.run(_bounded(result, timeout))
    return _convert(result, n)


def _run(fn, kwargs: dict, timeout: float, n: int):
    """((values, problems) or None, error_text, traceback_text, timed_out)."""
    if timeout <= 0:
        try:
            return _call(fn, kwargs, timeout, n), None, None, False
        except Exception as err:
            return None, _exc_text(err), _trace(err), False
    # the guard of all user code (SystemExit/KeyboardInterrupt from a reward too), the error formatted inside it
    done = user_code.guarded(
        lambda: _call(fn, kwargs, timeout, n), timeout, lambda err: (_exc_text(err), _trace(err)), "reward-call"
    )
    if done.timed_out:
        return None, None, None, True
    if done.error is not None:
        return None, done.explained[0], done.explained[1], False
    return done.value, None, None, False


def clip(text: str, limit: int = MESSAGE_CHARS) -> str:
    """text, or its first `limit` characters and how long it was: one reward's error must not fill the run's files."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text)} characters, cut to {limit}]"


def _exc_text(err: BaseException) -> str:
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises still has a type
        text = "<str() of the exception raised>"
    return clip(f"{type(err).__name__}: {text}" if text else type(err).__name__)


def _trace(err: BaseException) -> str:
    """The traceback as traceback.format_exc() gives it, each part (frame, exception line) clipped."""
    return "".join(clip(part, TRACE_PART_CHARS) for part in traceback.format_exception(err))


def _shown(value) -> str:
    """repr(value) in at most 80 characters; a repr that raises (or an int too long to print) says so."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - user objects' __repr__, int's max_str_digits
        return f"<{type(value).__name__} object>"
    return text if len(text) <= 80 else text[:77] + "..."


def as_float(value):
    """(float or None, problem kind or None, what is wrong)."""
    if value is None:
        return None, None, None
    if isinstance(value, (str, bytes)):
        return None, "not_a_number", f"{type(value).__name__}, not a number"
    try:
        number = float(value)
    except OverflowError:  # 10**400
        return None, "nan", "too large for a float"
    except Exception:  # noqa: BLE001 - TypeError, ValueError, or whatever a user __float__ raises
        return None, "not_a_number", f"{type(value).__name__}, not a number"
    if not math.isfinite(number):
        return None, "nan", "not finite"
    return number, None, None


def _convert(result, n: int) -> tuple[list, dict]:
    """(n floats or None, problems by kind) from what a reward returned. Runs inside the guarded call:
    an exception here (a generator failing part way, a __len__ that raises) is the function's own."""
    values = [None] * n
    problems: dict[str, list] = {}
    if not isinstance(result, (list, tuple)):
        returned = type(result).__name__
        try:  # a generator, numpy array or tensor is fine; a str/dict/number is not
            result = None if isinstance(result, (str, bytes, dict)) else list(result)
        except TypeError:
            result = None
        if result is None:
            problems["wrong_type"] = [
                (
                    None,
                    f"returned {returned}, expected a list of {n} floats (or None); all {n} samples set to None",
                    None,
                )
            ]
            return values, problems
    if len(result) != n:
        problems["wrong_length"] = [
            (None, f"returned {len(result)} values for {n} completions; all {n} samples set to None", None)
        ]
        return values, problems
    bad: dict[str, list] = {}
    for i, value in enumerate(result):
        number, kind, what = as_float(value)
        values[i] = number
        if kind:
            bad.setdefault(kind, []).append((i, value, what))
    for kind, items in bad.items():
        i, value, what = items[0]
        problems[kind] = [
            (i, f"returned {_shown(value)} ({what}) for sample {i}; {len(items)} of {n} samples set to None", None)
        ] + [(k, "", None) for k, _, _ in items[1:]]
    return values, problems


def _own(prompts: list, completions: list, columns: dict) -> dict:
    """The call's keyword arguments as copies of its own: a function that clears `completions` or edits
    `answer` changes nothing the other functions, the retries or samples.jsonl see."""
    kwargs = {"prompts": prompts, "completions": completions, **columns}
    try:
        return copy.deepcopy(kwargs)
    except Exception:  # noqa: BLE001 - a column of objects that cannot be deep-copied: new lists at least
        return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in kwargs.items()}


def call_reward(
    name: str,
    fn,
    prompts: list,
    completions: list,
    columns: dict,
    timeout: float,
    state: dict | None = None,
    on_error=None,
) -> list:
    """fn's values for every sample (None = not applicable or failed); failures reported once per kind."""
    n = len(completions)
    started = time.monotonic()
    result, error, trace, timed_out = _run(fn, _own(prompts, completions, columns), timeout, n)
    problems: dict[str, list] = {}  # kind -> [(sample, message, traceback), ...]

    if timed_out:
        problems["timeout"] = [
            (None, f"no result within rewards.timeout_s = {timeout:g} s; all {n} samples set to None", None)
        ]
        values = [None] * n
    elif error is not None:
        values = [None] * n
        failed = []
        if n > 1:  # localize: retry one sample at a time within what is left of the time budget
            for i in range(n):
                left = timeout - (time.monotonic() - started) if timeout > 0 else 0
                if timeout > 0 and left <= 0:
                    failed.extend((k, error, trace) for k in range(i, n))
                    break
                one = _own(prompts[i : i + 1], completions[i : i + 1], {k: v[i : i + 1] for k, v in columns.items()})
                res, err1, tr1, to1 = _run(fn, one, left, 1)
                if err1 is None and not to1 and res is not None and not res[1]:
                    values[i] = res[0][0]
                    continue
                failed.append((i, err1 or error, tr1 or trace))
        else:
            failed = [(0, error, trace)]
        problems["exception"] = [
            (i, f"{msg} (sample {i}; {len(failed)} of {n} samples set to None)", tr) for i, msg, tr in failed[:1]
        ] + [(i, msg, tr) for i, msg, tr in failed[1:]]
    else:
        values, problems = result

    report(name, problems, state, on_error)
    return values


def report(name: str, problems: dict[str, list], state: dict | None, on_error) -> None:
    """One on_error per kind of problem: {kind: [(sample, message, traceback), ...]}, the first item's message
    said, its count and the running total per (name, kind) in `state`; a traceback only the first time."""
    for kind, items in problems.items():
        if not on_error:
            continue
        count = len(items)
        key = (name, kind)
        first = state is None or key not in state
        total = (state.get(key, 0) if state is not None else 0) + count
        if state is not None:
            state[key] = total
        sample, message, trace = items[0]
        fields = {"problem": kind, "count": count, "total": total}
        if first and trace:
            fields["traceback"] = trace
        try:
            on_error(name, message, sample, **fields)
        except Exception:  # reporting must not stop training either
            pass


SUM_NAME = "rewards.weights"  # the `function` of a reward_error about a sample's weighted sum


def _f32(x: float) -> float:
    """x as the float32 the advantage computation holds it in (inf where it does not fit)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _weighted_sum(row: list, weights: list) -> float:
    """Σ w_k r_k as compute_advantages forms it in float32 (NaN rewards skipped); NaN if a term is not
    finite, which its nansum would skip or spread silently (inf × 0, 1e308 weights)."""
    total = 0.0
    for value, weight in zip(row, weights):
        if math.isnan(value):
            continue
        term = _f32(_f32(value) * _f32(weight))
        if not math.isfinite(term):
            return math.nan
        total = _f32(total + term)
    return total


def exclude_non_finite_sums(table: list, weights, state: dict | None = None, on_error=None) -> None:
    """Set to NaN every reward of a sample whose weighted sum is not finite (it would train on NaN/inf):
    the sample counts as unscorable (advantage 0), reported once per call as a reward_error."""
    width = len(table[0]) if table else 0
    weights = [1.0] * width if weights is None else [float(w) for w in weights]
    if not width or len(weights) != width:
        return
    bad = [
        i
        for i, row in enumerate(table)
        if any(not math.isnan(v) for v in row) and not math.isfinite(_weighted_sum(row, weights))
    ]
    if not bad:
        return
    first = bad[0]
    shown = ", ".join(f"{v:g}" for v in table[first])
    for i in bad:
        table[i][:] = [math.nan] * width
    if not on_error:
        return
    key = (SUM_NAME, "not_finite_sum")
    total = (state.get(key, 0) if state is not None else 0) + len(bad)
    if state is not None:
        state[key] = total
    message = (
        f"the weighted sum of sample {first}'s rewards [{shown}] x rewards.weights "
        f"[{', '.join(f'{w:g}' for w in weights)}] is not finite in float32; {len(bad)} of {len(table)} "
        f"samples set to None"
    )
    try:
        on_error(SUM_NAME, message, first, problem="not_finite_sum", count=len(bad), total=total)
    except Exception:  # reporting must not stop training either
        pass
