"""examples/from_trl_speed.py (docs/python-api.md's measured speed-up) runs under both trainers, here on the bundled
tiny model for two steps: each side prints its steps/s line, and grpo-studio's mean completion length (from the
callbacks' on_log, under TRL's name completions/mean_length) is the mean of metrics.jsonl's completion/len_mean."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]
LINE = r"{}: \d+\.\d{{4}} steps/s over steps 2-2 \(\d+\.\d\d CPU s a step\), completions (\d+\.\d) tokens on average"


def run_example(trainer: str, run: Path) -> str:
    env = {**os.environ, "GRPO_EXAMPLE_MODEL": "tiny-arith", "GRPO_EXAMPLE_STEPS": "2"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "from_trl_speed.py"), trainer, str(run)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["grpo_studio", "trl"])
def test_the_speed_example_times_both_trainers(tmp_path, trainer):
    line = run_example(trainer, tmp_path / "run")
    match = re.fullmatch(LINE.format(trainer), line)
    assert match, line
    if trainer == "grpo_studio":
        rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [row["step"] for row in rows] == [1, 2]
        assert float(match.group(1)) == pytest.approx(sum(r["completion/len_mean"] for r in rows) / 2, abs=0.05)
