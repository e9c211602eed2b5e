"""Readers never hang and never mislead (issue 40, item 4): a FIFO or a device where a run's file belongs is one
warning line, never a wait; reads are bounded; rows out of step order or repeated are read in step order, said
once, and never shown as the run's state; a last line still being written is taken by no reader, forward or
backward. The commands run as real child processes with a time limit (a hang fails the test, it does not stall
it); each expected line is written out by hand."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import run_reader
from grpo_studio.contract.run_files import EVENTS, METRICS
from grpo_studio.contract.run_reader import Warnings, last_step_row, read_rows, rows_from_end
from grpo_studio.contract.run_state import run_summaries
from grpo_studio.studio.rundata import RunData
from tests.cli_helpers import ROOT, run_cli

STEPS = 6
FIFO = "not a regular file (a FIFO); read as empty"


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=ROOT)  # its 120 s timeout: a reader that hangs fails the test


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
    # the total comes from one place (run_reader.total_steps): with events.jsonl unread, config.toml's train.steps
    step = {METRICS: "0/6", EVENTS: "6/6"}[name]
    shown = {METRICS: ["r", "finished", step, "bf16"], EVENTS: ["r", "created", step, "bf16"]}[name]
    out = cli("runs", str(run.parent))
    assert (out.returncode, out.stderr) == (0, f"warning: r/{name}: {FIFO}\n")
    assert out.stdout.splitlines()[1].split()[:4] == shown
    out = cli("report", str(run), "--out", str(tmp_path / "report"))
    assert (out.returncode, out.stderr) == (0, f"warning: {run}/{name}: {FIFO}\n")
    assert f"<tr><th>steps</th><td>{step}</td></tr>" in (tmp_path / "report" / "index.html").read_text()
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


def test_the_studio_waits_for_the_newline(tmp_path):
    run = write_run(tmp_path / "r", STEPS, total=STEPS + 1)  # step 7 is within the run's steps
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


def test_a_row_out_of_order_before_the_tail_is_found(tmp_path):
    """Step 100 first, then steps 1..99 of ~4 KB each: the file is over TAIL_BYTES and its tail is in order, yet
    runs shows step 100 (its first row is read too) and says what doctor says, in the same line."""
    run = write_run(tmp_path / "runs" / "r", STEPS, total=100)
    rows = [{"step": s, "reward/mean": s / 100, "pad": "x" * 4000} for s in [100, *range(1, 100)]]
    (run / METRICS).write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert (run / METRICS).stat().st_size > run_reader.TAIL_BYTES
    moved = f"{METRICS}: 99 rows out of step order; read in step order"
    warn = Warnings()
    assert last_step_row(run / METRICS, warn) == (rows[0], 0) and warn == [moved]
    out = cli("runs", str(run.parent))
    assert out.returncode == 0 and out.stderr == f"warning: r/{moved}\n"
    assert out.stdout.splitlines()[1].split()[:3] == ["r", "finished", "100/100"]
    out = cli("doctor", str(run), "--json")
    assert out.stderr == f"warning: {run}/{moved}\n" and json.loads(out.stdout)["steps"] == 100


@pytest.mark.parametrize("step", [99, 10**30])
def test_a_row_beyond_the_runs_total_is_left_out_and_said(run, tmp_path, step):
    good = json.loads(lines(run / METRICS)[-1])
    with open(run / METRICS, "a") as fh:
        fh.write(json.dumps({**good, "step": step, "reward/mean": -99.0}) + "\n")
    beyond = f"{METRICS}: 1 rows with a step beyond the run's 6 steps; left out"
    out = cli("runs", str(run.parent))
    assert out.returncode == 0 and out.stderr == f"warning: r/{beyond}\n"
    assert out.stdout.splitlines()[1].split()[:5] == ["r", "finished", "6/6", "bf16", f"{good['reward/mean']:.4g}"]
    out = cli("report", str(run), "--out", str(tmp_path / "report"))
    assert out.returncode == 0 and out.stderr == f"warning: {run}/{beyond}\n"
    assert "<tr><th>steps</th><td>6/6</td></tr>" in (tmp_path / "report" / "index.html").read_text()
    out = cli("doctor", str(run), "--json")
    assert out.stderr == f"warning: {run}/{beyond}\n" and json.loads(out.stdout)["steps"] == STEPS
    data = RunData(run)
    data.drain()
    assert data.steps == list(range(1, 7)) and data.warnings() == [beyond]


def test_a_line_over_16_mib_in_samples_is_said_by_report_as_by_doctor(run, tmp_path):
    with open(run / "samples.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 6, "completion": "b" * (run_reader.MAX_LINE_BYTES + 1)}) + "\n")
    skipped = "samples.jsonl: skipped 1 malformed lines (not a JSON object with the fields the file needs)"
    out = cli("report", str(run), "--out", str(tmp_path / "report"))
    assert out.returncode == 0 and out.stderr == f"warning: {run}/{skipped}\n"
    out = cli("doctor", str(run))
    assert out.returncode == 0 and out.stderr == f"warning: {run}/{skipped}\n"


def test_runs_names_the_file_of_a_malformed_line(run):
    with open(run / METRICS, "a") as fh:
        fh.write(json.dumps({"step": True, "reward/mean": 1.0}) + "\n")  # a bool is no step
    out = cli("runs", str(run.parent))
    assert out.returncode == 0 and out.stderr == (
        f"warning: r/{METRICS}: skipped 1 malformed lines (not a JSON object with the fields the file needs)\n"
    )


def unwritable(path: Path, kind: str) -> str:
    """Make `path` something a trainer cannot append to; the refusal's words for it."""
    if kind == "fifo":
        os.mkfifo(path)
        return "not a regular file (a FIFO)"
    if kind == "dev_null":
        os.symlink("/dev/null", path)
        return "not a regular file (a link to a character device)"
    if kind == "loop":
        os.symlink(path.name, path)
        return "too many levels of symbolic links"
    os.symlink(path.parent / "nowhere" / "x", path)
    return "a link to nothing"


@pytest.mark.parametrize(
    "name, kind",
    [
        (METRICS, "fifo"),
        (EVENTS, "fifo"),
        ("samples.jsonl", "dev_null"),
        ("config.toml", "loop"),
        (METRICS, "dangling"),
    ],
)
def test_a_new_run_into_a_file_it_cannot_append_to_is_refused_before_anything_loads(tmp_path, name, kind):
    run = tmp_path / "X"
    run.mkdir()
    what = unwritable(run / name, kind)
    out = cli("train", "tiny-arith", "--set", "train.steps=1", "--run-dir", str(run))
    assert (out.returncode, out.stdout, out.stderr) == (
        2,
        "",
        f"run error: {run / name}: {what}; move it away, then start the trainer again\n",
    )
    assert os.listdir(run) == [name]


@pytest.mark.parametrize("name", ["histograms.jsonl", "stdout.log"])
def test_a_resume_into_a_fifo_is_refused_before_anything_loads(run, name):
    (run / name).unlink(missing_ok=True)
    os.mkfifo(run / name)
    before = sorted(os.listdir(run))
    out = cli("train", "--resume", str(run))
    assert (out.returncode, out.stderr) == (
        2,
        f"run error: {run / name}: not a regular file (a FIFO); move it away, then start the trainer again\n",
    )
    assert sorted(os.listdir(run)) == before
