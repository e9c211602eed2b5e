"""A user's environment class is contained the way reward code is (issue 40): each case the issue found, with its
exact message, the run directory's files or the episode's stop reason. Classes are written to files; runs train
the bundled tiny-arith model in this process; episodes that need tool calls run on SmolLM2's tokenizer with the
shipped ChatML tools template, the model's turn given as text (tests/test_episodes.py does the same). The fault
suite runs these and more as real processes (benchmarks/hostile_environments.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from grpo_studio.benchmarks.hostile_environments import BASE, SMALL, TEMPLATE, episode_of, model_turn
from grpo_studio.contract import config, environments
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.rollout.tool_calls import EpisodeEnds
from grpo_studio.engine.run.trainer import Trainer


def _write(tmp: Path, body: str) -> str:
    path = tmp / "env.py"
    path.write_text(BASE + body)
    (tmp / "tiny.jinja").write_text(TEMPLATE)
    return f"{path}:E"


def _load(tmp: Path, body: str, timeout_s: float = 1.0):
    return environments.load(_write(tmp, body), timeout_s)


def _refused(tmp: Path, body: str, timeout_s: float = 1.0) -> str:
    with pytest.raises(UserError) as err:
        _load(tmp, body, timeout_s)
    message = str(err.value)
    assert "\n" not in message
    return message


def _train(tmp: Path, body: str, *sets: str) -> Trainer:
    spec = _write(tmp, body)
    cfg = config.load("tiny-arith", [f"env.environment={spec}", f"data.chat_template={tmp}/tiny.jinja", *SMALL, *sets])
    trainer = Trainer(cfg, tmp / "run")
    try:
        trainer.run()
    finally:
        trainer.close()
    return trainer


def _rows(tmp: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (tmp / "run" / name).read_text().splitlines()]


# ---- loading: one line naming env.environment --------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("class E(Tools):\n def __init__(self): sys.exit(3)", "making an instance raised SystemExit: 3"),
        (
            "class E(Tools):\n def __init__(self): raise KeyboardInterrupt",
            "making an instance raised KeyboardInterrupt",
        ),
        (
            "class E(Tools):\n def __init__(self):\n  while True: pass",
            "making and checking a probe instance ran past env.tool_timeout_s = 1 s",
        ),
        ("sys.exit(4)\n", "loading env.py raised SystemExit: 4"),
        ("raise KeyboardInterrupt\n", "loading env.py raised KeyboardInterrupt"),
    ],
)
def test_system_exit_keyboard_interrupt_and_hangs_at_load_are_one_line_naming_the_key(tmp_path, body, why):
    spec = f"{tmp_path}/env.py:E"
    assert _refused(tmp_path, "\n" + body + "\n") == f"config error: env.environment = {spec!r}: {why}"


def test_a_module_that_hangs_at_import_is_refused_after_the_import_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(environments, "IMPORT_S", 0.5)
    message = _refused(tmp_path, "while True: pass\n", timeout_s=0.2)
    assert message.endswith(
        "loading env.py ran past 0.5 s (0.5 s, or env.tool_timeout_s when longer: an import may load libraries)"
    )


def test_a_class_with_tools_and_step_is_refused_as_ambiguous(tmp_path):
    message = _refused(tmp_path, "\nclass E(Tools):\n def step(self, text): return [], True, 1.0, {}\n")
    assert message.endswith(
        ": E has both tools (add) and step(text), so its shape is ambiguous; allowed: tools (TRL's "
        "environment_factory) or reset/step, so rename step or make the other methods private (_name)"
    )


def test_a_folder_named_like_a_py_file_is_refused_as_a_folder(tmp_path):
    (tmp_path / "envdir.py").mkdir()
    with pytest.raises(UserError) as err:
        environments.load(f"{tmp_path}/envdir.py:E", 1.0)
    assert str(err.value) == (
        f"config error: env.environment = '{tmp_path}/envdir.py:E': '{tmp_path}/envdir.py' is a folder; "
        f"give 'file.py:class' or 'module:class'"
    )


def test_a_get_reward_property_is_refused_without_running_it(tmp_path):
    body = "\nclass E(Tools):\n @property\n def get_reward(self): raise SystemExit(9)\n"
    assert _refused(tmp_path, body).endswith(": E.get_reward is a property; allowed: a method (def get_reward(self))")


def test_tool_timeout_s_has_no_unbounded_zero():
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", ["env.environment=calculator", "env.tool_timeout_s=0"])
    assert str(err.value) == "config error: env.tool_timeout_s = 0.0: must be > 0"


# ---- inside an episode: a stop reason, never the run -----------------------------------------------------


@pytest.mark.parametrize(
    ("body", "stop", "why"),
    [
        ("class E(Tools):\n def reset(self, **row): sys.exit(5)", "error", "reset raised SystemExit: 5"),
        (
            "class E(Turns):\n def reset(self, **row): raise KeyboardInterrupt",
            "error",
            "reset raised KeyboardInterrupt",
        ),
        (
            "class E(Tools):\n def reset(self, **row):\n  while True: pass",
            "timeout",
            "reset ran past env.tool_timeout_s = 1 s",
        ),
        (
            "made = []\nclass E(Tools):\n def __init__(self):\n  made.append(1)\n  if len(made) > 1: 1/0",
            "error",
            "making an instance raised ZeroDivisionError: division by zero",
        ),
    ],
)
def test_an_episode_the_environment_cannot_start_has_no_tokens(tmp_path, body, stop, why):
    from grpo_studio.engine.rollout.episodes import EveryEpisodeFailed, every_episode_failed

    episodes, _ = episode_of(tmp_path, "Tools")  # SmolLM2's tokenizer and template: only the class changes
    episodes.env = _load(tmp_path, "\n" + body + "\n")  # its probe instance was the first one made
    episode = episodes._begin({"prompt": "hi"}, "prompt")
    assert (episode.stop, episode.why, episode.failed) == (stop, why, True)
    assert (episode.ids, episode.prompt_ids, episode.turns) == ([], [], 0)
    assert every_episode_failed([episode, episode]) == f"every episode (2) failed in the environment, the first: {why}"
    assert issubclass(EveryEpisodeFailed, Exception)


@pytest.mark.parametrize(
    ("returns", "stop", "why"),
    [
        (
            "class R:\n def __str__(self): 1/0\ndef make(x): return R()",
            "error",
            "tool hostile raised ZeroDivisionError: division by zero",
        ),
        (
            "class R:\n def __str__(self):\n  while True: pass\ndef make(x): return R()",
            "timeout",
            "tool hostile ran past env.tool_timeout_s = 1 s",
        ),
        ("def make(x): sys.exit(8)", "error", "tool hostile raised SystemExit: 8"),
        ("def make(x): raise KeyboardInterrupt", "error", "tool hostile raised KeyboardInterrupt"),
    ],
)
def test_a_tool_whose_result_raises_or_hangs_ends_its_episode(tmp_path, returns, stop, why):
    from grpo_studio.benchmarks.hostile_environments import HOSTILE_TOOL

    episodes, episode = episode_of(tmp_path, "E", HOSTILE_TOOL + returns + "\n")
    ids = model_turn(episodes, episode, '<tool_call>{"name": "hostile", "arguments": {"x": 1}}</tool_call>')
    assert (episode.stop, episode.why) == (stop, why)
    assert episode.mask == [1.0] * len(ids) and episode.failed_calls == 1


def test_a_tool_result_is_cut_to_max_result_chars(tmp_path):
    """env.max_result_chars: a 10 MB result is cut before it is rendered or tokenised; a larger limit keeps more."""
    from grpo_studio.benchmarks.hostile_environments import HOSTILE_TOOL

    body = HOSTILE_TOOL + "def make(x): return 'ab' * 5_000_000\n"
    call = '<tool_call>{"name": "hostile", "arguments": {"x": 1}}</tool_call>'
    shown = {}
    for limit in (10, 40):
        episodes, episode = episode_of(tmp_path, "E", body, max_result_chars=limit)
        model_turn(episodes, episode, call)
        assert episode.stop is None  # the cut result fits the budget: the episode goes on
        shown[limit] = episode.messages[-1]["content"]
    assert shown[10] == "ababababab... [10000000 characters, cut to env.max_result_chars = 10]"
    assert shown[40] == "ab" * 20 + "... [10000000 characters, cut to env.max_result_chars = 40]"


def test_get_reward_10_400_or_raising_leaves_none_and_says_why(tmp_path):
    episodes, episode = episode_of(tmp_path, "E", "\nclass E(Tools):\n def get_reward(self): return 10**400\n")
    episodes._score(episode)
    assert (episode.reward, episode.reward_error) == (None, ("nan", "get_reward returned int (too large for a float)"))
    (tmp_path / "b").mkdir()  # a file of its own: a path's module is loaded once
    episodes, episode = episode_of(tmp_path / "b", "E", "\nclass E(Tools):\n def get_reward(self): sys.exit(7)\n")
    episodes._score(episode)
    assert (episode.reward, episode.reward_error) == (None, ("exception", "get_reward raised SystemExit: 7"))
    assert episode.failed is False  # its tokens still train; only its reward is missing


@pytest.mark.parametrize(
    ("value", "reward", "error"),
    [
        ("None", None, ("not_a_number", "get_reward returned NoneType (None, not a number)")),
        ("'1.0'", None, ("not_a_number", "get_reward returned str (str, not a number)")),
        ("float('nan')", None, ("nan", "get_reward returned float (not finite)")),
        ("-float('inf')", None, ("nan", "get_reward returned float (not finite)")),
        ("[1.0]", None, ("not_a_number", "get_reward returned list (list, not a number)")),
        ("True", 1.0, None),  # a bool is a number as float() reads it: 1 or 0
        ("False", 0.0, None),
    ],
)
def test_get_reward_returning_anything_but_a_finite_number_is_a_reward_error(tmp_path, value, reward, error):
    episodes, episode = episode_of(tmp_path, "E", f"\nclass E(Tools):\n def get_reward(self): return {value}\n")
    episodes._score(episode)
    assert (episode.reward, episode.reward_error) == (reward, error)


def test_start_up_measures_the_rows_within_one_bound(tmp_path):
    """A reset that takes 0.3 s: the measuring before weights load stops after env.tool_timeout_s (1 s) in all,
    not after rows x 0.3 s."""
    from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path
    from grpo_studio.engine.rollout import episodes as episodes_lib

    body = "\ncalls = []\nclass E(Tools):\n def reset(self, **row):\n  calls.append(1)\n  time.sleep(0.3)\n"
    spec = _write(tmp_path, body)
    cfg = config.load("tiny-arith", [f"env.environment={spec}", f"data.chat_template={tmp_path}/tiny.jinja", *SMALL])
    made = episodes_lib.make(cfg, load_tokenizer(resolve_model_path("tiny-arith")), [{"prompt": "1+1="}] * 50)
    calls = sys.modules[made.env.factory.__module__].calls
    assert 1 <= len(calls) <= 5  # 1 s / 0.3 s, and the call under way


# ---- through the trainer: the run goes on, or stops in one line -----------------------------------------


def test_reset_failing_for_a_whole_rollout_is_a_skipped_step_then_one_line(tmp_path):
    """The crash the issue found (logprobs: "Size does not match at dimension 1") is now train.max_bad_steps
    skipped steps, and the run stops naming env.environment."""
    spec = f"{tmp_path}/env.py:E"
    with pytest.raises(UserError) as err:
        _train(tmp_path, "\nclass E(Tools):\n def reset(self, **row): raise RuntimeError('no episode today')\n")
    cause = "every episode (4) failed in the environment, the first: reset raised RuntimeError: no episode today"
    assert str(err.value) == (
        f"run error: environment_failed: steps 1-2 all skipped (train.max_bad_steps = 2), the last because {cause}; "
        f"last good checkpoint: none; fix env.environment = {spec!r} (docs/environments.md), then --resume"
    )
    events = _rows(tmp_path, "events.jsonl")
    skipped = [e for e in events if e["event"] == "skipped_step"]
    assert [e["message"] for e in skipped] == [f"step 1 skipped: {cause}", f"step 2 skipped: {cause}"]
    assert [e["event"] for e in events][-2:] == ["environment_failed", "crashed"]
    assert [row["step"] for row in _rows(tmp_path, "metrics.jsonl")] == [1, 2]


def test_episodes_that_never_started_train_nothing_and_leave_their_group_statistics(tmp_path):
    body = "\nn = []\nclass E(Tools):\n def reset(self, **row):\n  n.append(1)\n  if len(n) % 2 == 0: 1/0\n"
    _train(tmp_path, body, "train.steps=1")
    samples = _rows(tmp_path, "samples.jsonl")
    never = [s for s in samples if s["episode"]["stop"] == "error"]
    assert never and all(s["tokens"] == 0 and s["trained"] == 0 for s in never)
    assert all(set(s["rewards"].values()) == {None} and s["advantage"] == 0.0 for s in never)
    assert {s["episode"]["why"] for s in never} == {"reset raised ZeroDivisionError: division by zero"}


def test_a_get_reward_that_always_raises_is_a_reward_error_with_its_sample(tmp_path):
    _train(tmp_path, "\nclass E(Tools):\n def get_reward(self): raise ValueError('no score')\n", "train.steps=1")
    (error,) = [e for e in _rows(tmp_path, "events.jsonl") if e["event"] == "reward_error"]
    assert error["message"] == (
        "reward 'E' failed: get_reward raised ValueError: no score (sample 0; 4 of 4 samples set to None)"
    )
    assert (error["function"], error["sample"], error["problem"], error["count"], error["step"]) == (
        "E",
        0,
        "exception",
        4,
        1,
    )
    assert all(s["rewards"]["E"] is None for s in _rows(tmp_path, "samples.jsonl"))


def test_a_get_reward_returning_none_as_the_only_reward_is_a_reward_error_not_a_nan_run(tmp_path):
    """rewards.funcs = [] and get_reward returning None: it trained at reward nan, exit 0, nothing said."""
    _train(tmp_path, "\nclass E(Tools):\n def get_reward(self): return None\n", "train.steps=1", "rewards.funcs=[]")
    (error,) = [e for e in _rows(tmp_path, "events.jsonl") if e["event"] == "reward_error"]
    assert error["message"] == (
        "reward 'E' failed: get_reward returned NoneType (None, not a number) (sample 0; 4 of 4 samples set to None)"
    )
    assert (error["function"], error["sample"], error["problem"]) == ("E", 0, "not_a_number")


def test_process_wide_state_a_reset_changes_is_put_back(tmp_path):
    """reset lowering the recursion limit to 60 (a 90-line traceback later), making float64 torch's default (a
    traceback at grpo_step) and moving the working directory: the run finishes and each is as it was."""
    import os

    import torch

    (tmp_path / "elsewhere").mkdir()
    body = (
        "\nimport torch\nclass E(Tools):\n def reset(self, **row):\n  sys.setrecursionlimit(60)\n"
        f"  torch.set_default_dtype(torch.float64)\n  os.chdir({str(tmp_path / 'elsewhere')!r})\n"
    )
    before = (sys.getrecursionlimit(), torch.get_default_dtype(), os.getcwd())
    _train(tmp_path, body, "train.steps=1")
    assert [e["event"] for e in _rows(tmp_path, "events.jsonl")][-1] == "finished"
    assert (sys.getrecursionlimit(), torch.get_default_dtype(), os.getcwd()) == before


def test_a_closed_or_replaced_standard_stream_is_put_back(tmp_path, monkeypatch):
    import os

    from grpo_studio.contract import user_code

    fd = os.open(tmp_path / "out.txt", os.O_WRONLY | os.O_CREAT)
    out, err = open(fd, "w", closefd=False), open(fd, "w", closefd=False)  # as Python opens sys.stdout
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    user_code.guarded(lambda: (sys.stdout.close(), setattr(sys, "stderr", None)), 1.0, str)
    assert sys.stderr is err and sys.stdout is not out and out.closed  # the closed one reopened on its descriptor
    print("still here", flush=True)
    assert (tmp_path / "out.txt").read_text() == "still here\n"
    os.close(fd)


def test_a_signal_handler_cannot_be_replaced_from_a_call(tmp_path):
    """Only the main thread sets handlers: signal.signal(SIGTERM, SIG_IGN) in reset ends that episode, and the
    trainer's handler stays (the run can still be stopped)."""
    import signal

    handler = signal.getsignal(signal.SIGTERM)
    body = "\nimport signal\nclass E(Tools):\n def reset(self, **row): signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    with pytest.raises(EpisodeEnds) as end:
        episode_of(tmp_path, "E", body)
    assert str(end.value) == "reset raised ValueError: signal only works in main thread of the main interpreter"
    assert signal.getsignal(signal.SIGTERM) is handler


def test_calls_spinning_past_their_bound_are_counted_until_no_episode_starts(tmp_path):
    """A call that catches the guard's timeout (except BaseException) spins on, one thread per episode; from
    MAX_STILL_RUNNING of them on, no new episode starts (a skipped step, train.max_bad_steps of them end the run)."""
    import threading

    from grpo_studio.contract import environments, user_code
    from grpo_studio.engine.rollout import tool_calls
    from grpo_studio.engine.rollout.episodes import MAX_STILL_RUNNING

    episodes, _ = episode_of(tmp_path, "Tools")
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            try:
                while not stop.is_set():
                    pass
            except BaseException:  # noqa: BLE001, S110 - the hostile part: the guard's timeout, swallowed
                pass

    already = user_code.still_running(environments.THREAD)  # calls other tests in this process left running
    try:
        for _ in range(max(0, MAX_STILL_RUNNING - already)):
            assert episodes.still_running() is None
            with pytest.raises(EpisodeEnds):
                tool_calls.bounded(spin, 0.05, "reset")
        stuck = user_code.still_running(environments.THREAD)
        assert stuck >= MAX_STILL_RUNNING
        assert episodes.still_running() == (
            f"{stuck} calls into the environment are still running past env.tool_timeout_s = 1 s; "
            f"it does not stop when asked"
        )
    finally:
        stop.set()
    for thread in threading.enumerate():
        if thread.name == "environment":
            thread.join(5)
    assert episodes.still_running() is None


def test_exit_from_a_running_environment_does_not_end_the_run(tmp_path):
    """step raising SystemExit in every episode: skipped steps and one line, never the user's exit code."""
    body = "\nclass E(Turns):\n def step(self, text): sys.exit(6)\n"
    with pytest.raises(UserError, match=re.escape("the first: step raised SystemExit: 6")):
        _train(tmp_path, body)
