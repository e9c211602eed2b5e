"""Readers never hang and never mislead (issue 40, item 4): a FIFO or a device where a run's file belongs is one
warning line, never a wait; reads are bounded; rows out of step order or repeated are read in step order, said
once, and never shown as the run's state; a last line still being written is taken by no reader, forward or
backward. The commands run as real child processes with a time limit (a hang fails the test, it does not stall
it); each expected line is written out by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import run_reader
from grpo_studio.contract.run_files import EVENTS, METRICS
from grpo_studio.contract.run_reader import Warnings, last_step_row, read_rows, rows_from_end
from grpo_studio.contract.run_state import run_summaries
from grpo_studio.studio.rundata import RunData
from tests.cli_helpers import ENV, ROOT

STEPS = 6
FIFO = "not a regular file (a FIFO); read as empty"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpo_studio.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def run(tmp_path) -> Path:
    return write_run(tmp_path / "runs" / "r", STEPS)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("name", [METRICS, EVENTS])
def test_a_fifo_blocks_no_command(run, tmp_path, name):
    fifo(run / name)
    shown = {METRICS: ["r", "finished", "0/6", "bf16"], EVENTS: ["r", "created", "6/?", "bf16"]}[name]
    out = cli("runs", str(run.parent))
    assert (out.returncode, out.stderr) == (0, f"warning: r/{name}: {FIFO}\n")
    assert out.stdout.splitlines()[1].split()[:4] == shown
    out = cli("report", str(run), "--out", str(tmp_path / "report"))
    assert (out.returncode, out.stderr) == (0, f"warning: {run}/{name}: {FIFO}\n")
    out = cli("doctor", str(run))
    assert (out.returncode, out.stderr) == (0, f"warning: {run}/{name}: {FIFO}\n")
    if name == METRICS:
        assert out.stdout == "no findings: no metrics rows yet\n"


def test_metrics_linked_to_dev_zero_is_one_line(run):
    (run / METRICS).unlink()
    os.symlink("/dev/zero", run / METRICS)
    out = cli("doctor", str(run))
    assert out.returncode == 0 and out.stdout == "no findings: no metrics rows yet\n"
    assert out.stderr == f"warning: {run}/{METRICS}: not a regular file (a link to a character device); read as empty\n"


def test_a_fifo_is_never_opened_by_open_file(tmp_path):
    """open_file judges the path before opening it: a FIFO with no writer is refused at once."""
    os.mkfifo(tmp_path / METRICS)
    warn = Warnings()
    assert run_reader.open_file(tmp_path / METRICS, warn) is None
    assert warn == [f"{METRICS}: {FIFO}"]


SHUFFLED = [3, 1, 6, 2, 5, 4]  # 1 (after 3), 2, 5 and 4 (after 6): 4 rows out of order


def test_shuffled_rows_read_in_step_order_and_said_once(run):
    good = lines(run / METRICS)
    (run / METRICS).write_text("".join(good[s - 1] + "\n" for s in SHUFFLED))
    moved = f"{METRICS}: 4 rows out of step order; read in step order"
    out = cli("runs", str(run.parent))
    reward = json.loads(good[-1])["reward/mean"]
    assert out.returncode == 0 and out.stderr == f"warning: r/{moved}\n"
    assert out.stdout.splitlines()[1].split()[:5] == ["r", "finished", "6/6", "bf16", f"{reward:.4g}"]
    warn = Warnings()
    assert read_rows(run / METRICS, warn) == [json.loads(line) for line in good] and warn == [moved]
    data = RunData(run)
    data.drain()
    assert data.steps == list(range(1, 7)) and data.step == 6 and data.warnings() == [moved]
    assert [e["message"] for e in data.events if e["event"] == "warning"] == [moved]


def test_a_repeated_step_keeps_its_last_row(run):
    good = [json.loads(line) for line in lines(run / METRICS)]
    again = {**good[1], "reward/mean": 99.0}
    with open(run / METRICS, "a") as fh:
        fh.write(json.dumps(again) + "\n")
    repeated = f"{METRICS}: 1 rows repeating a step; read in step order; a repeated step's last row kept"
    (row,) = run_summaries(run.parent)
    assert (row["step"], row["total"], row["warnings"]) == (6, 6, [repeated])
    warn = Warnings()
    assert read_rows(run / METRICS, warn) == [good[0], again, *good[2:]] and warn == [repeated]
    data = RunData(run)
    data.drain()
    assert data.series("reward/mean") == ([1, 2, 3, 4, 5, 6], [r["reward/mean"] for r in [good[0], again, *good[2:]]])


def test_step_disorder_counts_by_hand():
    assert run_reader.step_disorder(METRICS, [3, 1, 6, 2, 5, 4]) == (4, 0)
    assert run_reader.step_disorder(METRICS, [1, 2, 3, 2, 3]) == (0, 2)
    assert run_reader.step_disorder("samples.jsonl", [1, 1, 2, 2, 1]) == (1, 0)  # a step's G rows repeat nothing


def unterminated(run: Path) -> dict:
    """Step 7 appended as a whole JSON object, without its newline: a row still being written."""
    row = {**json.loads(lines(run / METRICS)[-1]), "step": 7}
    with open(run / METRICS, "a") as fh:
        fh.write(json.dumps(row))
    return row


def test_the_forward_reader_leaves_out_a_whole_row_without_its_newline(run):
    unterminated(run)
    assert [r["step"] for r in read_rows(run / METRICS)] == [1, 2, 3, 4, 5, 6]


def test_the_backward_reader_leaves_out_a_whole_row_without_its_newline(run):
    unterminated(run)
    assert [r["step"] for r in rows_from_end(run / METRICS, lambda row: False)[0]] == [6, 5, 4, 3, 2, 1]
    assert last_step_row(run / METRICS) == (json.loads(lines(run / METRICS)[STEPS - 1]), 0)
    (row,) = run_summaries(run.parent)
    assert row["step"] == 6


def test_the_studio_waits_for_the_newline(run):
    row = unterminated(run)
    data = RunData(run)
    data.drain()
    assert data.steps == [1, 2, 3, 4, 5, 6]
    with open(run / METRICS, "a") as fh:
        fh.write("\n")
    data.poll()
    assert data.steps == [1, 2, 3, 4, 5, 6, 7] and data.last("reward/mean") == row["reward/mean"]


def test_a_state_event_without_its_newline_is_not_the_state(run):
    (run / EVENTS).write_text((run / EVENTS).read_text().rstrip("\n"))  # `finished`, still being written
    (row,) = run_summaries(run.parent)
    assert row["state"] == "crashed"  # its last whole state event is `started`, and no trainer holds it


def test_a_resume_rewrite_starts_the_studio_over(run):
    """A resume's cut renames a new file over metrics.jsonl: the studio reads it from the start, no warning."""
    data = RunData(run)
    data.drain()
    kept = lines(run / METRICS)[:3]
    (run / ".m.tmp").write_text("".join(line + "\n" for line in kept))
    os.replace(run / ".m.tmp", run / METRICS)
    data.poll()
    assert data.steps == [1, 2, 3] and data.warnings() == []


def test_a_read_is_bounded_in_bytes(run):
    """A file over MAX_READ_BYTES: the forward reader takes its first MAX_READ_BYTES, the backward its last,
    each said once; a 10 GB sparse file is read in bounded time (the probe's limit in the fault suite)."""
    size = len((run / METRICS).read_bytes())
    with open(run / METRICS, "ab") as fh:
        fh.truncate(10 << 30)  # six rows, then a 10 GiB hole: one line that never ends
    assert (run / METRICS).stat().st_size == 10 << 30 and size < 1 << 20
    warn = Warnings()
    assert [r["step"] for r in read_rows(run / METRICS, warn)] == [1, 2, 3, 4, 5, 6]
    assert warn == [f"{METRICS}: 10.0 GiB, over the 1.0 GiB a reader takes of a file; read its first 1.0 GiB"]
    warn = Warnings()
    assert rows_from_end(run / METRICS, lambda row: False, warn) == ([], 0)
    assert warn == [f"{METRICS}: 10.0 GiB, over the 1.0 GiB a reader takes of a file; read its last 1.0 GiB"]


def test_a_file_growing_while_read_is_read_as_long_as_it_was(run, monkeypatch):
    """read_rows takes the file as long as it was when opened: a row appended during the read waits."""
    path, real_size = run / METRICS, run_reader._size

    def size_then_grow(fh):
        size = real_size(fh)
        with open(path, "a") as out:
            out.write(json.dumps({"step": 7, "time": 1.0}) + "\n")
        return size

    monkeypatch.setattr(run_reader, "_size", size_then_grow)
    assert [r["step"] for r in read_rows(path)] == [1, 2, 3, 4, 5, 6]
    monkeypatch.undo()
    assert [r["step"] for r in read_rows(path)] == [1, 2, 3, 4, 5, 6, 7]


def test_a_run_name_is_printed_escaped(run):
    os.rename(os.fsencode(run), os.fsencode(run.parent) + b"/r\nx\x1b[2J\xff")
    out = cli("runs", str(run.parent))
    assert out.returncode == 0 and out.stderr == ""
    assert len(out.stdout.splitlines()) == 2 and "\x1b" not in out.stdout
    assert out.stdout.splitlines()[1].split()[0] == "r\\nx\\x1b[2J\\xff"
