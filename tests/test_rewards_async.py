"""`async def` user rewards: awaited with the whole batch, side by side with the other async ones,
bounded by rewards.timeout_s (cancelled on timeout), errors localized as for plain functions."""

from __future__ import annotations

import math
import sys

from grpo_studio.rewards import build, score
from grpo_studio.rewards.runner import RewardFuncs

ASYNC_FILE = """
import asyncio, threading

BARRIER = threading.Barrier(2, timeout=20)
CANCELLED = []

async def length(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]

async def _meet():
    # passes only when the other async reward is waiting here at the same time
    await asyncio.to_thread(BARRIER.wait)

async def left(prompts, completions, **kwargs):
    await _meet()
    return [1.0] * len(completions)

async def right(prompts, completions, **kwargs):
    await _meet()
    return [2.0] * len(completions)

async def slow(prompts, completions, **kwargs):
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        CANCELLED.append(len(completions))
        raise
    return [0.0] * len(completions)

async def picky(prompts, completions, **kwargs):
    if any("bad" in c for c in completions):
        raise ValueError("bad completion")
    return [3.0] * len(completions)
"""


def _funcs(tmp_path, names, timeout=30.0) -> RewardFuncs:
    (tmp_path / "async_rewards.py").write_text(ASYNC_FILE)
    funcs = build([f"{tmp_path}/async_rewards.py:{n}" for n in names])
    funcs.timeout_s = timeout
    return funcs


def test_async_reward_is_awaited_with_the_batch(tmp_path):
    funcs = _funcs(tmp_path, ["length"])
    assert score(funcs, ["q"] * 3, ["a", "bb", ""], {}) == [[1.0], [2.0], [0.0]]


def test_async_rewards_run_side_by_side_with_a_plain_one(tmp_path):
    """`left` and `right` each wait at a two-party barrier: sequential awaiting would break it."""
    funcs = _funcs(tmp_path, ["left", "right"])
    funcs.append(("correctness", build(["correctness"])[0][1]))
    table = score(funcs, ["q", "q"], ["<answer>7</answer>", "x"], {"answer": ["7", "7"]})
    assert table == [[1.0, 2.0, 2.0], [1.0, 2.0, 0.0]]


def test_async_timeout_cancels_the_coroutine(tmp_path):
    funcs = _funcs(tmp_path, ["slow", "length"], timeout=0.5)
    calls = []
    table = score(
        funcs, ["q"] * 2, ["a", "bb"], {}, on_error=lambda name, message, i, **f: calls.append((name, message))
    )
    assert all(math.isnan(r[0]) for r in table) and [r[1] for r in table] == [1.0, 2.0]
    assert calls == [("slow", "no result within rewards.timeout_s = 0.5 s; all 2 samples set to None")]
    module = next(
        m for m in list(sys.modules.values()) if getattr(m, "__file__", "") == str(tmp_path / "async_rewards.py")
    )
    assert module.CANCELLED == [2]


def test_async_errors_are_localized_per_sample(tmp_path):
    funcs = _funcs(tmp_path, ["picky"])
    calls = []
    table = score(funcs, ["q"] * 3, ["ok", "bad", "ok"], {}, on_error=lambda name, message, i, **f: calls.append(i))
    assert table[0] == [3.0] and math.isnan(table[1][0]) and table[2] == [3.0]
    assert calls == [1]
