"""Rewards contained end to end (issue 30): whatever a reward function returns, raises, mutates or
takes at import becomes a reward_error (or one config-error line), never a crash or a hang.

Each test reproduces one case of the fault probe and asserts the exact outcome. Time bounds are
upper bounds of a few seconds (a busy machine must not make them flaky), never tight."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest

from grpo_studio.contract.config import load
from grpo_studio.contract.errors import UserError
from grpo_studio.rewards import build, score

FAULTY_FILE = """
import time

def huge_int(prompts, completions, **kw):
    return [10 ** 400] + [1.0] * (len(completions) - 1)

def broken_generator(prompts, completions, **kw):
    for c in completions:
        if "bad" in c:
            raise RuntimeError("generator broke")
        yield 1.0

class NoFloat:
    def __float__(self):
        raise RuntimeError("no float")
    def __repr__(self):
        return "NoFloat()"

def bad_float(prompts, completions, **kw):
    return [NoFloat()] + [1.0] * (len(completions) - 1)

class NoLen:
    def __iter__(self):
        return iter([1.0])
    def __len__(self):
        raise RuntimeError("no len")

def bad_len(prompts, completions, **kw):
    return NoLen()

def sleepy_generator(prompts, completions, **kw):
    for c in completions:
        end = time.monotonic() + 60
        while time.monotonic() < end:  # short sleeps: the timeout ends the thread between two of them
            time.sleep(0.01)
        yield 1.0

class SlowText(Exception):
    def __str__(self):
        while True:  # a pure-Python loop: the timeout lands in here
            time.sleep(0.01)

def slow_message(prompts, completions, **kw):
    raise SlowText()

def huge_message(prompts, completions, **kw):
    raise ValueError("x" * 5_000_000)

def vandal(prompts, completions, **kw):
    completions.clear()
    kw["answer"][0] = "nope"
    prompts[0] = "changed"
    return [0.0] * len(kw["answer"])

def one(prompts, completions, **kw):
    return [1.0] * len(completions)

def vast(prompts, completions, **kw):  # finite, but times a weight beyond float32's range
    return [1e36] * len(completions)
"""

TIMEOUT = 0.5
BOUND = TIMEOUT + 5.0  # the call returns within timeout_s + a margin; only an upper bound


def _funcs(tmp_path, names, timeout=30.0, extra=()):
    (tmp_path / "faulty.py").write_text(FAULTY_FILE)
    entries = [n if n in ("correctness",) else f"{tmp_path}/faulty.py:{n}" for n in names]
    cfg = load("tiny-arith", [f"rewards.funcs={json.dumps(entries)}", f"rewards.timeout_s={timeout}", *extra])
    return build(cfg.rewards)


def _score(funcs, completions, answers=None):
    n = len(completions)
    calls = []
    started = time.monotonic()
    table = score(
        funcs,
        ["1+1="] * n,
        completions,
        {"answer": answers or ["2"] * n},
        on_error=lambda name, message, index, **f: calls.append((name, message, index, f)),
    )
    return table, calls, time.monotonic() - started


def _column(table, j):
    return [None if math.isnan(row[j]) else row[j] for row in table]


@pytest.fixture
def thread_errors(monkeypatch):
    """Exceptions that escaped a thread (they would print 'Exception in thread reward-call' tracebacks)."""
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type.__name__))
    return seen


def _reward_threads_end(before: set):
    for t in [t for t in threading.enumerate() if t.name == "reward-call" and t not in before]:
        t.join(5)
        assert not t.is_alive(), "a pure-Python reward thread must be stopped"


# ---- the returned value, converted inside the guarded call ---------------------------------------


def test_huge_int_is_not_finite(tmp_path):
    table, calls, _ = _score(_funcs(tmp_path, ["huge_int"]), ["<answer>2</answer>"] * 4)
    assert _column(table, 0) == [None, 1.0, 1.0, 1.0]
    shown = "1" + "0" * 76 + "..."
    assert calls == [
        (
            "huge_int",
            f"returned {shown} (too large for a float) for sample 0; 1 of 4 samples set to None",
            0,
            {"problem": "nan", "count": 1, "total": 1},
        )
    ]


def test_generator_raising_while_iterated_is_an_exception_of_the_function(tmp_path):
    table, calls, _ = _score(_funcs(tmp_path, ["broken_generator"]), ["ok", "bad", "ok", "bad"])
    assert _column(table, 0) == [1.0, None, 1.0, None]  # localized: retried one sample at a time
    ((name, message, index, fields),) = calls
    assert (name, message, index) == (
        "broken_generator",
        "RuntimeError: generator broke (sample 1; 2 of 4 samples set to None)",
        1,
    )
    assert (fields["problem"], fields["count"], fields["total"]) == ("exception", 2, 2)
    assert 'raise RuntimeError("generator broke")' in fields["traceback"]


def test_float_that_raises_is_not_a_number(tmp_path):
    table, calls, _ = _score(_funcs(tmp_path, ["bad_float"]), ["c"] * 3)
    assert _column(table, 0) == [None, 1.0, 1.0]
    assert calls == [
        (
            "bad_float",
            "returned NoFloat() (NoFloat, not a number) for sample 0; 1 of 3 samples set to None",
            0,
            {"problem": "not_a_number", "count": 1, "total": 1},
        )
    ]


def test_len_that_raises_is_an_exception_of_the_function(tmp_path):
    table, calls, _ = _score(_funcs(tmp_path, ["bad_len", "one"]), ["c"] * 2)
    assert _column(table, 0) == [None, None] and _column(table, 1) == [1.0, 1.0]
    ((name, message, index, fields),) = calls
    assert (name, message, index) == ("bad_len", "RuntimeError: no len (sample 0; 2 of 2 samples set to None)", 0)
    assert fields["problem"] == "exception" and 'raise RuntimeError("no len")' in fields["traceback"]


def test_sleeping_generator_is_bounded_by_the_timeout(tmp_path, thread_errors):
    before = set(threading.enumerate())
    table, calls, took = _score(_funcs(tmp_path, ["one", "sleepy_generator"], timeout=TIMEOUT), ["c"] * 4)
    assert took < BOUND  # the generator sleeps 60 s per value
    assert _column(table, 0) == [1.0] * 4 and _column(table, 1) == [None] * 4
    assert calls == [
        (
            "sleepy_generator",
            "no result within rewards.timeout_s = 0.5 s; all 4 samples set to None",
            None,
            {"problem": "timeout", "count": 1, "total": 1},
        )
    ]
    _reward_threads_end(before)
    assert thread_errors == []


# ---- error messages --------------------------------------------------------------------------------


def test_slow_error_message_times_out_without_a_leaked_traceback(tmp_path, thread_errors):
    before = set(threading.enumerate())
    table, calls, took = _score(_funcs(tmp_path, ["slow_message"], timeout=TIMEOUT), ["c"])
    assert took < BOUND
    assert _column(table, 0) == [None]
    assert calls == [
        (
            "slow_message",
            "no result within rewards.timeout_s = 0.5 s; all 1 samples set to None",
            None,
            {"problem": "timeout", "count": 1, "total": 1},
        )
    ]
    _reward_threads_end(before)
    assert thread_errors == []  # no RewardTimeout escaped the reward thread


def test_huge_error_message_is_truncated(tmp_path):
    table, calls, _ = _score(_funcs(tmp_path, ["huge_message"]), ["c"])
    assert _column(table, 0) == [None]
    ((name, message, index, fields),) = calls
    text = "ValueError: " + "x" * 5_000_000
    assert message == f"{text[:500]}... [{len(text)} characters, cut to 500] (sample 0; 1 of 1 samples set to None)"
    assert fields["problem"] == "exception"
    assert "raise ValueError" in fields["traceback"] and len(fields["traceback"]) < 10_000
    assert f"[{len(text) + 1} characters, cut to 2000]" in fields["traceback"]  # the exception line, with its \n


# ---- inputs --------------------------------------------------------------------------------------


def test_a_function_that_mutates_its_inputs_changes_nothing_for_the_others(tmp_path):
    funcs = _funcs(tmp_path, ["vandal", "correctness"])
    completions, answers = ["<answer>2</answer>", "<answer>3</answer>"], ["2", "2"]
    table, calls, _ = _score(funcs, completions, answers)
    assert calls == []
    assert _column(table, 0) == [0.0, 0.0]
    assert _column(table, 1) == [2.0, 0.0]  # correctness saw the completions and answers as they were
    assert completions == ["<answer>2</answer>", "<answer>3</answer>"] and answers == ["2", "2"]


# ---- weights ---------------------------------------------------------------------------------------


def test_weights_that_overflow_the_sum_exclude_the_samples(tmp_path):
    funcs = _funcs(tmp_path, ["vast", "one"], extra=["rewards.weights=[1e6, 1e6]"])  # |w| <= 1e6 (the schema's)
    table, calls, _ = _score(funcs, ["<answer>2</answer>", "<answer>3</answer>"])
    assert all(math.isnan(v) for row in table for v in row)  # unscorable: advantage 0, not NaN/inf
    assert calls == [
        (
            "rewards.weights",
            "the weighted sum of sample 0's rewards [1e+36, 1] x rewards.weights "
            "[1e+06, 1e+06] is not finite in float32; 2 of 2 samples set to None",
            0,
            {"problem": "not_finite_sum", "count": 2, "total": 2},
        )
    ]


def test_large_weights_that_keep_the_sum_finite_are_untouched(tmp_path):
    funcs = _funcs(tmp_path, ["correctness", "one"], extra=["rewards.weights=[1e6, 1]"])
    table, calls, _ = _score(funcs, ["<answer>2</answer>", "<answer>3</answer>"])
    assert calls == [] and table == [[2.0, 1.0], [0.0, 1.0]]


# ---- import time -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, why",
    [
        ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
        ("class Stop(BaseException):\n    pass\nraise Stop('at import')\n", "Stop: at import"),
        ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
    ],
)
def test_import_time_base_exceptions_are_one_line(tmp_path, monkeypatch, body, why):
    (tmp_path / "stops.py").write_text(
        body + "def f(prompts, completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        build(["stops.py:f"])
    assert str(err.value) == f"config error: rewards.funcs = 'stops.py:f': loading stops.py raised {why}"
    # the half-run module is not kept: once fixed, the file loads
    (tmp_path / "stops.py").write_text("def f(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    assert [n for n, _ in build(["stops.py:f"])] == ["f"]


def test_import_time_keyboard_interrupt_in_a_module_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "stops_mod_x.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError) as err:
        build(["stops_mod_x:f"])
    assert str(err.value) == (
        "config error: rewards.funcs = 'stops_mod_x:f': importing 'stops_mod_x' raised KeyboardInterrupt"
    )


# ---- headless runs: the run finishes, its files stay small and whole ---------------------------------

RUN = [
    "train.steps=2",
    "train.prompts_per_step=2",
    "rollout.num_generations=2",
    "rollout.max_completion_len=8",
    "train.save_every=0",
    "model.lora_rank=4",
    "rewards.timeout_s=0.5",
]
FAULTY = [
    "huge_int",
    "broken_generator",
    "bad_float",
    "bad_len",
    "sleepy_generator",
    "slow_message",
    "huge_message",
    "vandal",
]


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(tmp_path, model_name, names, extra=()):
    from grpo_studio.engine.run.trainer import Trainer

    (tmp_path / "faulty.py").write_text(FAULTY_FILE)
    entries = [n if n == "correctness" else f"{tmp_path}/faulty.py:{n}" for n in names]
    cfg = load("tiny-arith", [*RUN, f"model.name={model_name}", f"rewards.funcs={json.dumps(entries)}", *extra])
    assert Trainer(cfg, tmp_path / "run").run() == "finished"
    run = tmp_path / "run"
    return _jsonl(run / "events.jsonl"), _jsonl(run / "metrics.jsonl"), _jsonl(run / "samples.jsonl"), run


def test_a_run_with_every_faulty_reward_finishes(tmp_path, model_name, thread_errors):
    events, rows, samples, run = _run(tmp_path, model_name, ["correctness", *FAULTY])
    assert events[-1]["event"] == "finished"
    errors = {(e["step"], e["function"]): e for e in events if e["event"] == "reward_error"}
    failing = sorted(set(FAULTY) - {"vandal", "broken_generator"})  # no completion holds "bad": it yields 1.0s
    assert sorted(errors) == sorted((s, f) for s in (1, 2) for f in failing)
    assert errors[(1, "huge_int")]["problem"] == "nan" and errors[(1, "bad_float")]["problem"] == "not_a_number"
    assert errors[(1, "bad_len")]["problem"] == "exception"
    assert errors[(1, "sleepy_generator")]["problem"] == errors[(1, "slow_message")]["problem"] == "timeout"
    assert errors[(1, "huge_message")]["message"].endswith(
        "... [5000012 characters, cut to 500] (sample 0; 4 of 4 samples set to None)"
    )
    assert (run / "events.jsonl").stat().st_size < 100_000  # was 15 MB in 2 steps
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # the vandal's edits reached no other function
        assert r["rewards/correctness/mean"] is not None and not math.isnan(r["rewards/correctness/mean"])
        assert r["rewards/vandal/mean"] == 0.0
    assert len(samples) == 8 and all(s["completion"] is not None for s in samples)
    assert thread_errors == []


def test_a_run_whose_weights_overflow_reports_every_step(tmp_path, model_name):
    events, rows, samples, _ = _run(tmp_path, model_name, ["vast", "one"], ["rewards.weights=[1e6, 1e6]"])
    errors = [e for e in events if e["event"] == "reward_error"]
    assert [(e["step"], e["function"], e["problem"], e["count"], e["total"]) for e in errors] == [
        (1, "rewards.weights", "not_finite_sum", 4, 4),
        (2, "rewards.weights", "not_finite_sum", 4, 8),
    ]
    assert errors[0]["message"].startswith("reward 'rewards.weights' failed: the weighted sum of sample 0's rewards [")
    assert errors[0]["message"].endswith(
        "x rewards.weights [1e+06, 1e+06] is not finite in float32; 4 of 4 samples set to None"
    )
    for r in rows:  # nothing trained on NaN/inf: every sample unscorable, advantage 0
        assert r["rewards/one/mean"] is None or math.isnan(r["rewards/one/mean"])
    assert all(s["advantage"] == 0.0 and s["rewards"] == {"vast": None, "one": None} for s in samples)
