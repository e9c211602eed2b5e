"""Run `grpo-studio` as a child process on the tree under test (the same import roots as this process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The parent's environment, so the child imports what this process imports (an editable install, or
# PYTHONPATH); offline, so no error path depends on the network.
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def run_cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpo_studio.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=ENV,
        timeout=timeout,
    )
