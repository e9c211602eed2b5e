"""The run directory's files: their names, and how a whole file is written.

Layout (see docs/design.md, "The run directory"):
    config.toml  metrics.jsonl  samples.jsonl  events.jsonl  histograms.jsonl
    checkpoints/step-N/  trainer.pid  stdout.log  trackers.json

The layers above, lowest first: run_reader (the tolerant readers), run_lock (trainer.pid),
run_state (a run's state, the runs list), rundir (the writer). Pure python, no torch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
EVENTS = "events.jsonl"
HISTOGRAMS = "histograms.jsonl"
STREAMS = (METRICS, SAMPLES, HISTOGRAMS)  # the per-step files a resume cuts back to its checkpoint's step
CONFIG = "config.toml"
SETUP = "setup.toml"  # what the studio launched (only runs started from the studio)
PIDFILE = "trainer.pid"
CHECKPOINTS = "checkpoints"
STDOUT = "stdout.log"
RUNS = Path("runs")  # where runs live unless told (--runs-dir): the studio, attach, runs, train's new runs
FORK = "fork.json"  # a fork's parent run, the step it forked at and the change it makes (studio/fork.py)
STATE_EVENTS = ("started", "finished", "stopped", "crashed")  # the events that change a run's state


def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file beside it, fsynced, then renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def checkpoint_folders(run_dir: Path) -> list[tuple[int, Path]]:
    """The run's checkpoint folders as (step, path), oldest first (complete or not)."""
    found = []
    for path in (Path(run_dir) / CHECKPOINTS).glob("step-*"):
        match = re.fullmatch(r"step-(\d+)", path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)
