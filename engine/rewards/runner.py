"""Calling one reward function so that nothing it does can stop training.

Each call runs in a daemon worker thread that the caller waits on for at most `timeout_s`.
On timeout the worker gets an asynchronous `RewardTimeout` (which ends pure-Python loops) and
is abandoned if it is stuck in C code; every sample of that call becomes None. Because the
function runs in a worker thread, signal-based timeouts inside it (e.g. math_verify's
`parsing_timeout`) cannot be used there: pass `parsing_timeout=None`, or set
rewards.timeout_s = 0 to call functions directly in the trainer's thread (no bound).

An `async def` reward (or one returning an awaitable) is awaited in an event loop of its own in
that worker thread, under `asyncio.wait_for(…, timeout_s)`, so a timeout cancels it cleanly.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import math
import threading
import time
import traceback

_MISSING = object()


class RewardTimeout(BaseException):
    """Raised inside a reward function's thread when it outlives rewards.timeout_s.
    A BaseException, so `except Exception` in user code does not swallow it."""


class RewardFuncs(list):
    """[(name, fn), ...] as the trainer iterates it, plus the call policy and error bookkeeping."""

    def __init__(self, items=(), timeout_s: float = 30.0):
        super().__init__(items)
        self.timeout_s = timeout_s
        self.seen: dict[tuple[str, str], int] = {}  # (function, kind) -> affected samples so far


def is_async(fn) -> bool:
    """An `async def` function, or a callable object whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


async def _bounded(awaitable, timeout: float):
    try:
        return await asyncio.wait_for(awaitable, timeout if timeout > 0 else None)
    except asyncio.TimeoutError:
        raise RewardTimeout from None


def _call(fn, kwargs: dict, timeout: float):
    result = fn(**kwargs)
    if inspect.isawaitable(result):  # async rewards: a loop of this thread's own
        result = asyncio.run(_bounded(result, timeout))
    return result


def _run(fn, kwargs: dict, timeout: float):
    """(result, error_text, traceback_text, timed_out)."""
    if timeout <= 0:
        try:
            return _call(fn, kwargs, timeout), None, None, False
        except Exception as err:
            return None, _exc_text(err), traceback.format_exc(), False
    box: dict = {}

    def target():
        try:
            box["result"] = _call(fn, kwargs, timeout)
        except RewardTimeout:
            box["timeout"] = True
        except BaseException as err:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from a reward too
            box["error"] = (_exc_text(err), traceback.format_exc())

    worker = threading.Thread(target=target, name="reward-call", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(RewardTimeout))
        worker.join(0.5)  # pure-Python loops end here; a thread stuck in C code is abandoned (daemon)
        return None, None, None, True
    if "error" in box:
        return None, box["error"][0], box["error"][1], False
    if box.get("timeout"):
        return None, None, None, True
    return box.get("result"), None, None, False


def _exc_text(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _as_float(value):
    """(float or None, problem kind or None)."""
    if value is None:
        return None, None
    if isinstance(value, (str, bytes)):
        return None, "not_a_number"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None, "not_a_number"
    if not math.isfinite(number):
        return None, "nan"
    return number, None


def call_reward(name: str, fn, prompts: list, completions: list, columns: dict, timeout: float,
                state: dict | None = None, on_error=None) -> list:
    """fn's values for every sample (None = not applicable or failed); failures reported once per kind."""
    n = len(completions)
    started = time.monotonic()
    result, error, trace, timed_out = _run(fn, {"prompts": prompts, "completions": completions, **columns}, timeout)
    problems: dict[str, list] = {}  # kind -> [(sample, message, traceback), ...]

    if timed_out:
        problems["timeout"] = [(None, f"no result within rewards.timeout_s = {timeout:g} s; "
                                      f"all {n} samples set to None", None)]
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
                one = {k: v[i:i + 1] for k, v in columns.items()}
                res, err1, tr1, to1 = _run(fn, {"prompts": prompts[i:i + 1], "completions": completions[i:i + 1],
                                                **one}, left)
                if err1 is None and not to1 and isinstance(res, (list, tuple)) and len(res) == 1:
                    number, kind = _as_float(res[0])
                    if kind is None:
                        values[i] = number
                        continue
                failed.append((i, err1 or error, tr1 or trace))
        else:
            failed = [(0, error, trace)]
        problems["exception"] = [(i, f"{msg} (sample {i}; {len(failed)} of {n} samples set to None)", tr)
                                 for i, msg, tr in failed[:1]] + [(i, msg, tr) for i, msg, tr in failed[1:]]
    else:
        values = [None] * n
        if not isinstance(result, (list, tuple)):
            returned = type(result).__name__
            try:  # a generator, numpy array or tensor is fine; a str/dict/number is not
                result = None if isinstance(result, (str, bytes, dict)) else list(result)
            except TypeError:
                result = None
            if result is None:
                problems["wrong_type"] = [(None, f"returned {returned}, expected a list of {n} floats (or None); "
                                                 f"all {n} samples set to None", None)]
        if result is not None and len(result) != n:
            problems["wrong_length"] = [(None, f"returned {len(result)} values for {n} completions; "
                                               f"all {n} samples set to None", None)]
        elif result is not None:
            bad: dict[str, list] = {}
            for i, value in enumerate(result):
                number, kind = _as_float(value)
                values[i] = number
                if kind:
                    bad.setdefault(kind, []).append((i, value))
            for kind, items in bad.items():
                i, value = items[0]
                shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
                what = "not finite" if kind == "nan" else f"{type(value).__name__}, not a number"
                problems[kind] = [(i, f"returned {shown} ({what}) for sample {i}; {len(items)} of {n} samples "
                                      f"set to None", None)] + [(k, "", None) for k, _ in items[1:]]

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
    return values
