"""User reward files (TRL signature): loading, a short headless run, the same file under TRL's
GRPOTrainer, and reward functions that raise / return the wrong length / NaN / hang."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from grpo_studio.contract.config import load
from grpo_studio.contract.errors import UserError
from grpo_studio.rewards import build, score

USER_FILE = '''
import json, os

def score(prompts, completions, **kwargs):
    """1.0 when the reference digits appear in the completion, None for rows without a reference."""
    answer = kwargs["answer"]
    out = [None if a == "" else (1.0 if a in c else 0.0) for c, a in zip(completions, answer)]
    log = os.environ.get("REWARD_CALL_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps({"prompt_type": type(prompts[0]).__name__,
                                 "completion_type": type(completions[0]).__name__,
                                 "keys": sorted(kwargs), "values": out}) + "\\n")
    return out
'''

FAILING_FILE = """
def boom(prompts, completions, **kwargs):
    raise ValueError("boom")

def short(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)

def nan(prompts, completions, **kwargs):
    return [float("nan")] + [1.0] * (len(completions) - 1)

def words(prompts, completions, **kwargs):
    return ["high"] + [0.5] * (len(completions) - 1)

def hang(prompts, completions, **kwargs):
    while True:
        pass
"""


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- loading --------------------------------------------------------------------------------------


def test_load_from_file_and_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(USER_FILE)
    monkeypatch.chdir(tmp_path)
    funcs = build(
        [
            "my_rewards.py:score",
            "grpo_studio.rewards.builtin:proximity",
            str(tmp_path / "my_rewards.py") + ":score",
        ]
    )
    assert [n for n, _ in funcs] == ["score", "proximity", "score_2"]
    assert funcs[0][1](["q"] * 3, ["x 12", "no", "y"], answer=["12", "12", ""]) == [1.0, 0.0, None]


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            "missing.py:score",
            "config error: rewards.funcs = 'missing.py:score': file 'missing.py' not found; "
            "give 'file.py:function' with an existing file or 'module:function'",
        ),
        (
            "my_rewards.py:scor",
            "config error: rewards.funcs = 'my_rewards.py:scor': function 'scor' not found in "
            "my_rewards.py; functions there: score",
        ),
        (
            "no_such_module_x:f",
            "config error: rewards.funcs = 'no_such_module_x:f': cannot import module "
            "'no_such_module_x' (No module named 'no_such_module_x'); a file path must end in .py",
        ),
        (
            "broken.py:f",
            "config error: rewards.funcs = 'broken.py:f': loading broken.py raised ZeroDivisionError: division by zero",
        ),
    ],
)
def test_load_errors_are_one_line(tmp_path, monkeypatch, entry, message):
    (tmp_path / "my_rewards.py").write_text(USER_FILE)
    (tmp_path / "broken.py").write_text("x = 1 / 0\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        build([entry])
    assert str(err.value) == message


# ---- robust calling (unit) ---------------------------------------------------------------------------


def _score_with(tmp_path, names, n=4, timeout=30.0):
    (tmp_path / "failing.py").write_text(FAILING_FILE)
    cfg = load("tiny-arith", [f"rewards.funcs={json.dumps(names)}", f"rewards.timeout_s={timeout}"])
    funcs = build(cfg.rewards)
    calls = []
    table = score(
        funcs,
        ["1+1="] * n,
        ["<answer>2</answer>"] * n,
        {"answer": ["2"] * n},
        on_error=lambda name, message, index, **f: calls.append((name, message, index, f)),
    )
    return table, calls, funcs


def test_raising_function_is_localized_per_sample(tmp_path):
    (tmp_path / "flaky.py").write_text(
        "def flaky(prompts, completions, **kw):\n"
        '    if any("bad" in c for c in completions):\n'
        '        raise KeyError("bad sample")\n'
        "    return [1.0 for c in completions]\n"
    )
    funcs = build([f"{tmp_path}/flaky.py:flaky"])
    calls = []
    table = score(
        funcs,
        ["q"] * 4,
        ["ok", "bad", "ok", "bad"],
        {},
        on_error=lambda name, message, index, **f: calls.append((name, message, index, f)),
    )
    assert [row[0] for row in table[::2]] == [1.0, 1.0]
    assert all(math.isnan(row[0]) for row in table[1::2])
    assert len(calls) == 1
    name, message, index, fields = calls[0]
    assert (name, message, index) == ("flaky", "KeyError: 'bad sample' (sample 1; 2 of 4 samples set to None)", 1)
    assert (fields["problem"], fields["count"], fields["total"]) == ("exception", 2, 2)
    assert 'raise KeyError("bad sample")' in fields["traceback"]
    # later occurrences are counted, without the traceback
    score(
        funcs,
        ["q"] * 2,
        ["bad", "ok"],
        {},
        on_error=lambda name, message, index, **f: calls.append((name, message, index, f)),
    )
    assert calls[1][2:] == (0, {"problem": "exception", "count": 1, "total": 3})


def test_non_numbers_and_non_lists(tmp_path):
    table, calls, _ = _score_with(tmp_path, [f"{tmp_path}/failing.py:words", f"{tmp_path}/failing.py:nan"])
    assert math.isnan(table[0][0]) and [r[0] for r in table[1:]] == [0.5, 0.5, 0.5]
    assert calls[0][:3] == ("words", "returned 'high' (str, not a number) for sample 0; 1 of 4 samples set to None", 0)
    assert calls[1][:3] == ("nan", "returned nan (not finite) for sample 0; 1 of 4 samples set to None", 0)
    funcs = build(["correctness"])
    funcs[:] = [("scalar", lambda prompts, completions, **kw: 1.0)]
    calls = []
    score(funcs, ["q"], ["c"], {}, on_error=lambda name, message, index, **f: calls.append((message, f["problem"])))
    assert calls == [("returned float, expected a list of 1 floats (or None); all 1 samples set to None", "wrong_type")]


def test_hanging_function_is_bounded_and_its_thread_ends(tmp_path):
    table, calls, _ = _score_with(tmp_path, ["correctness", f"{tmp_path}/failing.py:hang"], timeout=0.5)
    assert [r[0] for r in table] == [2.0] * 4 and all(math.isnan(r[1]) for r in table)
    assert calls == [
        (
            "hang",
            "no result within rewards.timeout_s = 0.5 s; all 4 samples set to None",
            None,
            {"problem": "timeout", "count": 1, "total": 1},
        )
    ]
    alive = [t for t in threading.enumerate() if t.name == "reward-call"]
    for t in alive:
        t.join(5)
    assert not any(t.is_alive() for t in alive), "the hung pure-Python reward thread must be stopped"


# ---- headless runs ---------------------------------------------------------------------------------

RUN = [
    "train.steps=2",
    "train.prompts_per_step=2",
    "rollout.num_generations=2",
    "rollout.max_completion_len=8",
    "train.save_every=0",
    "model.lora_rank=4",
]


def test_failing_rewards_never_stop_training(tmp_path, model_name):
    from grpo_studio.engine.run.trainer import Trainer

    (tmp_path / "failing.py").write_text(FAILING_FILE)
    f = tmp_path / "failing.py"
    funcs = ["correctness", f"{f}:boom", f"{f}:short", f"{f}:nan", f"{f}:hang"]
    cfg = load(
        "tiny-arith", [*RUN, f"model.name={model_name}", f"rewards.funcs={json.dumps(funcs)}", "rewards.timeout_s=0.5"]
    )
    state = Trainer(cfg, tmp_path / "run").run()
    assert state == "finished"
    events = _jsonl(tmp_path / "run" / "events.jsonl")
    errors = [e for e in events if e["event"] == "reward_error"]
    got = {(e["step"], e["function"]): e for e in errors}
    assert sorted(got) == [(s, fn) for s in (1, 2) for fn in ("boom", "hang", "nan", "short")]
    boom1, boom2 = got[(1, "boom")], got[(2, "boom")]
    assert boom1["message"] == "reward 'boom' failed: ValueError: boom (sample 0; 4 of 4 samples set to None)"
    assert (boom1["sample"], boom1["problem"], boom1["count"], boom1["total"]) == (0, "exception", 4, 4)
    assert 'raise ValueError("boom")' in boom1["traceback"]
    assert "traceback" not in boom2 and (boom2["count"], boom2["total"]) == (4, 8)
    assert got[(1, "short")]["message"] == (
        "reward 'short' failed: returned 3 values for 4 completions; all 4 samples set to None"
    )
    assert got[(1, "short")]["sample"] is None and got[(1, "short")]["problem"] == "wrong_length"
    assert got[(2, "nan")]["message"] == (
        "reward 'nan' failed: returned nan (not finite) for sample 0; 1 of 4 samples set to None"
    )
    assert (got[(2, "nan")]["sample"], got[(2, "nan")]["total"]) == (0, 2)
    assert got[(1, "hang")]["message"] == (
        "reward 'hang' failed: no result within rewards.timeout_s = 0.5 s; all 4 samples set to None"
    )
    rows = _jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rewards/nan/mean"] == 1.0 and r["rewards/nan/std"] == 0.0  # NaN sample excluded
        assert r["rewards/boom/mean"] is None or math.isnan(r["rewards/boom/mean"])
    assert events[-1]["event"] == "finished"


def test_user_reward_file_in_our_trainer_and_in_trl(tmp_path, model_name, monkeypatch, random_tiny_model):
    """The same file, in TRL's signature, called by our trainer and by trl.GRPOTrainer: same
    arguments (names and types), and each logs rewards/score/mean = the mean of what it returned."""
    from grpo_studio.engine.run.trainer import Trainer

    (tmp_path / "my_rewards.py").write_text(USER_FILE)
    data = tmp_path / "sums.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(5) for b in range(5))
    )
    ours_log, trl_log = tmp_path / "ours.jsonl", tmp_path / "trl.jsonl"
    monkeypatch.setenv("REWARD_CALL_LOG", str(ours_log))
    cfg = load(
        "tiny-arith",
        [
            *RUN,
            f"model.name={model_name}",
            f"data.source={data}",
            "data.eval_size=5",
            f'rewards.funcs=["correctness", "{tmp_path}/my_rewards.py:score"]',
        ],
    )
    assert Trainer(cfg, tmp_path / "run").run() == "finished"
    ours = [c for c in _jsonl(ours_log)]
    rows = _jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(ours) == 2
    for call, row in zip(ours, rows):
        assert (call["prompt_type"], call["completion_type"]) == ("str", "str")
        assert row["rewards/score/mean"] == pytest.approx(sum(call["values"]) / len(call["values"]))

    # TRL on CPU, one step, a tiny model built from config; no network
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    from grpo_studio.contract.user_code import load as load_fn

    monkeypatch.setenv("REWARD_CALL_LOG", str(trl_log))
    fn = load_fn(f"{tmp_path}/my_rewards.py:score")
    ds = datasets.Dataset.from_list([json.loads(line) for line in data.read_text().splitlines()])
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        max_steps=1,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(model=str(random_tiny_model), reward_funcs=[fn], args=args, train_dataset=ds)
    trainer.train()
    theirs = _jsonl(trl_log)
    assert len(theirs) >= 1
    call = theirs[0]
    assert (call["prompt_type"], call["completion_type"]) == ("str", "str")
    trl_extras = {"completion_ids", "trainer_state", "log_extra", "log_metric"}
    assert set(call["keys"]) - trl_extras == set(ours[0]["keys"]) == {"answer"}
    logged = [h for h in trainer.state.log_history if "rewards/score/mean" in h][0]
    assert logged["rewards/score/mean"] == pytest.approx(sum(call["values"]) / len(call["values"]))
