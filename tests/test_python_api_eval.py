"""Evaluation of an explicit eval set (data.eval_source) on the bundled tiny model: from the Python API
(eval_strategy='steps', eval_steps, eval_on_start, num_generations_eval, eval_dataset) and from the CLI
(--set data.eval_source=FILE --set train.eval_every=N). The oracles: the eval file's contents, the prompts the
reward functions were called with, TRL's eval_reward computed by hand from the completions they scored (the
weighted sum's mean, and each function's), and transformers' callback order."""

from __future__ import annotations

import json
import math
import tomllib

import pytest

from grpo_studio.contract.errors import UserError

pytest.importorskip("datasets")

TRAIN = ["1+1=", "2+2=", "3+3=", "4+4="]
EVAL = {"prompt": ["5+6=", "7+8=", "9+1="], "answer": ["11", "15", "10"], "level": [1, 2, 3]}
WEIGHTS = [1.0, 0.5]


def length(completions, level, **kwargs):
    """A reward of the text and an extra column: len + level."""
    return [float(len(c) + lv) for c, lv in zip(completions, level)]


def digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


class Recorder:
    """Every callback event with the step it came at, and the logs / metrics it carried."""

    def __init__(self):
        self.seen = []

    def on_train_begin(self, args, state, control, **kw):
        self.seen.append(("begin", state.global_step, None))

    def on_step_end(self, args, state, control, **kw):
        self.seen.append(("step_end", state.global_step, None))

    def on_log(self, args, state, control, logs=None, **kw):
        self.seen.append(("log", state.global_step, dict(logs)))

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        self.seen.append(("evaluate", state.global_step, dict(metrics)))


def by_hand(completions: list[str], levels: list[int]) -> dict[str, float]:
    """TRL's eval numbers of these completions: each function's mean and the weighted sum's mean."""
    lengths = [len(c) + lv for c, lv in zip(completions, levels)]
    counts = [sum(ch.isdigit() for ch in c) for c in completions]
    total = [WEIGHTS[0] * a + WEIGHTS[1] * b for a, b in zip(lengths, counts)]
    return {
        "eval_reward": sum(total) / len(total),
        "eval_rewards/length/mean": sum(lengths) / len(lengths),
        "eval_rewards/digits/mean": sum(counts) / len(counts),
    }


@pytest.fixture(scope="module")
def api_run(tmp_path_factory):
    """Two steps, evaluated before step 1 and at step 2, 2 completions per eval prompt; every call of `length`
    recorded (its prompts, completions and levels)."""
    from datasets import Dataset

    from grpo_studio import GRPOConfig, GRPOTrainer

    calls = []

    def recorded_length(prompts, completions, level, **kwargs):
        calls.append((list(prompts), list(completions), list(level)))
        return length(completions, level)

    recorded_length.__name__ = "length"
    run, recorder = tmp_path_factory.mktemp("api-eval") / "run", Recorder()
    args = GRPOConfig(
        str(run),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        bf16=False,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
        eval_strategy="steps",
        eval_steps=2,
        eval_on_start=True,
        num_generations_eval=2,
        reward_weights=WEIGHTS,
    )
    train = Dataset.from_dict({"prompt": TRAIN, "level": [0, 0, 0, 0]})
    GRPOTrainer(
        "tiny-arith", [recorded_length, digits], args, train, Dataset.from_dict(EVAL), callbacks=[recorder]
    ).train()
    return run, calls, recorder


def rows_of(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_eval_dataset_is_the_runs_eval_source(api_run):
    run, calls, _ = api_run
    written = [json.loads(line) for line in (run / "data" / "eval.jsonl").read_text().splitlines()]
    assert written == [dict(zip(EVAL, values)) for values in zip(*EVAL.values())]
    config = tomllib.loads((run / "config.toml").read_text())
    assert config["data"]["eval_source"] == str(run / "data" / "eval.jsonl")
    t = config["train"]
    assert (t["eval_every"], t["eval_before"], t["eval_k"]) == (2, True, 2)
    # the calls on eval prompts: before step 1 and at step 2, each eval prompt twice (num_generations_eval)
    evals = [call for call in calls if set(call[0]) <= set(EVAL["prompt"])]
    assert len(evals) == 2 and len(calls) == 4  # two eval calls, one per training step
    for prompts, _, levels in evals:
        assert prompts == [p for p in EVAL["prompt"] for _ in range(2)]
        assert levels == [lv for lv in EVAL["level"] for _ in range(2)]


def test_eval_reward_is_trls_by_hand(api_run):
    run, calls, _ = api_run
    evals = [call for call in calls if set(call[0]) <= set(EVAL["prompt"])]
    row = rows_of(run)[-1]
    want = by_hand(evals[-1][1], evals[-1][2])
    assert row["eval/reward"] == pytest.approx(want["eval_reward"])
    assert row["eval/rewards/length/mean"] == pytest.approx(want["eval_rewards/length/mean"])
    assert row["eval/rewards/digits/mean"] == pytest.approx(want["eval_rewards/digits/mean"])
    assert "eval/reward" not in rows_of(run)[0]  # step 1 is no eval step
    before = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    (event,) = [e for e in before if e["event"] == "eval"]
    assert event["step"] == 0 and event["reward"] == pytest.approx(by_hand(evals[0][1], evals[0][2])["eval_reward"])


def test_callbacks_see_trls_eval_logs_in_transformers_order(api_run):
    run, calls, recorder = api_run
    evals = [call for call in calls if set(call[0]) <= set(EVAL["prompt"])]
    kinds = [(kind, step, "eval_reward" in (logs or {})) for kind, step, logs in recorder.seen]
    assert kinds == [
        ("begin", 0, False),
        ("log", 0, True),  # eval_on_start
        ("evaluate", 0, True),
        ("step_end", 1, False),
        ("log", 1, False),
        ("step_end", 2, False),
        ("log", 2, False),
        ("log", 2, True),  # the eval after the step's own log, as transformers' _maybe_log_save_evaluate
        ("evaluate", 2, True),
    ]
    for (_, step, logs), call in zip([s for s in recorder.seen if s[0] == "evaluate"], evals):
        want = by_hand(call[1], call[2])
        assert set(logs) == {*want, "epoch"} and logs["epoch"] == step / 4
        assert all(logs[name] == pytest.approx(value) for name, value in want.items())


@pytest.mark.parametrize(
    "kwargs, line",
    [
        (
            {"eval_strategy": "no", "eval_on_start": True},
            "GRPOConfig error: eval_on_start = true: grpo-studio evaluates on start only beside eval_strategy "
            "'steps' or 'epoch'; set one of them, or remove eval_on_start",
        ),
        (
            {"eval_strategy": "steps", "per_device_eval_batch_size": 3},
            "GRPOConfig error: per_device_eval_batch_size = 3: The global eval batch size (3 * 1) must be divisible "
            "by the number of generations used for evaluation (4)",
        ),
        (
            {"eval_strategy": "steps", "eval_delay": 2},
            "GRPOConfig error: eval_delay = 2: grpo-studio evaluates every train.eval_every steps from the first; "
            "remove it",
        ),
    ],
)
def test_evaluation_fields_refused_in_one_line(kwargs, line):
    from grpo_studio import GRPOConfig

    with pytest.raises(UserError) as err:
        GRPOConfig("o", per_device_train_batch_size=4, num_generations=4, **kwargs)
    assert str(err.value) == line


def test_trl_refuses_the_eval_batch_ours_does():
    trl = pytest.importorskip("trl")
    with pytest.raises(ValueError, match="must be divisible by the number of generations used for evaluation"):
        trl.GRPOConfig(
            "o", use_cpu=True, report_to="none", eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=3,
            per_device_train_batch_size=4, num_generations=4,
        )  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, every",
    [
        ({"eval_strategy": "steps", "logging_steps": 3}, 3),  # eval_steps None: logging_steps, as transformers
        ({"eval_strategy": "steps", "eval_steps": 0.25}, 3),  # a fraction of 10 steps: ceil(2.5)
        ({"eval_strategy": "epoch"}, 3),  # 12 prompts, 4 a step (16 completions / 4): 3 steps an epoch
        ({"eval_strategy": "no"}, 0),
    ],
)
def test_eval_cadence_by_hand(kwargs, every):
    from grpo_studio.grpo_config import GRPOConfig, studio_config, studio_keys

    args = GRPOConfig("o", per_device_train_batch_size=16, num_generations=4, max_steps=10, **kwargs)
    t = studio_config(studio_keys(args, 12)).train
    assert (t.eval_every, t.eval_k) == (every, 4 if every else 1)


def test_eval_dataset_mistakes_are_one_line(tmp_path):
    from datasets import Dataset

    from grpo_studio import GRPOConfig, GRPOTrainer

    args = GRPOConfig(str(tmp_path / "o"), per_device_train_batch_size=4, num_generations=4, eval_strategy="steps")
    chat = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1="}]]})
    with pytest.raises(UserError) as err:
        GRPOTrainer("tiny-arith", digits, args, Dataset.from_dict({"prompt": TRAIN}), chat)
    assert str(err.value) == (
        "GRPOTrainer error: eval_dataset = 'Dataset': its prompts are conversational (messages) and "
        "train_dataset's are text; give both in one format"
    )


def test_the_cli_evaluates_an_eval_file(tmp_path, capsys):
    """grpo-studio train tiny-arith --set data.eval_source=FILE --set train.eval_every=2: the file's rows are
    the eval rows (a user reward file records what it scored), nothing of builtin:arith is held out, and
    eval/reward is the by-hand mean of the recorded eval completions."""
    from grpo_studio.cli.main import main

    eval_file, seen = tmp_path / "eval.jsonl", tmp_path / "seen.jsonl"
    eval_file.write_text(
        "".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in [("60+70=", 130), ("88+99=", 187)])
    )
    (tmp_path / "rec.py").write_text(
        "import json\n"
        "def score(prompts, completions, **kwargs):\n"
        f"    with open({str(seen)!r}, 'a') as fh:\n"
        "        fh.write(json.dumps([prompts, completions]) + '\\n')\n"
        "    return [float(len(c)) for c in completions]\n"
    )
    run = tmp_path / "run"
    sets = [
        f"data.eval_source={eval_file}",
        "train.eval_every=2",
        "train.steps=2",
        "train.prompts_per_step=2",
        "rollout.num_generations=4",
        "train.eval_k=3",
        "data.general_size=0",
        f"rewards.funcs=['{tmp_path / 'rec.py'}:score']",
    ]
    assert main(["train", "tiny-arith", "--run-dir", str(run), *[a for s in sets for a in ("--set", s)]]) == 0
    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    evals = [(p, c) for p, c in calls if set(p) <= {"60+70=", "88+99="}]
    assert len(evals) == 1 and evals[0][0] == ["60+70="] * 3 + ["88+99="] * 3
    row = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    completions = evals[0][1]
    assert row["eval/reward"] == pytest.approx(sum(map(len, completions)) / 6)
    assert row["eval/rewards/score/mean"] == row["eval/reward"]
    assert not any(key.startswith("eval/general/") for key in row)
    info = [json.loads(line)["message"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert "data: 2500 training rows, 2 eval rows from data.eval_source" in info  # every one of 50 x 50 pairs
    assert not math.isnan(row["eval/accuracy"])
