"""Who owns a run directory (issue 30, "Ownership first"): the lock is taken before anything loads, a
refused trainer writes nothing into the directory, a new run (no --resume) into a directory that already
holds a run is refused in one line, and `--run-dir ""` never means the current directory."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import ENV, ROOT, run_cli

from grpo_studio.contract import config, rundir
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.run_state import held_run
from grpo_studio.contract.rundir import CHECKPOINTS, CONFIG, EVENTS, METRICS, PIDFILE

SHORT = ["train.steps=2", "train.eval_every=0", "train.save_every=0"]
QUICK_S = 10.0  # a refusal's bound: the tiny model alone loads in seconds here, a real one in ~40 s


def sets(*settings: str) -> list[str]:
    return [a for s in settings for a in ("--set", s)]


def tree(path: Path) -> dict[str, bytes | None]:
    """Every file under `path` with its bytes (folders as None): what "changes nothing" compares."""
    return {p.relative_to(path).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(path.rglob("*"))}


def held_line(run: Path, held: str) -> str:
    return (
        f"config error: --run-dir = '{run}': already holds a run ({held}); allowed: --resume {shlex.quote(str(run))} "
        f"to continue it, or a new or empty directory"
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run of 2 steps, finished (one checkpoint, at its end)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    proc = run_cli("train", "tiny-arith", *sets(*SHORT), "--run-dir", str(run), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in rundir.read_rows(run / METRICS)] == [1, 2]
    return run


# ---- a new run into a directory that holds one ---------------------------------------------------


def test_a_new_run_into_a_finished_directory_is_one_line_and_changes_nothing(finished):
    before = tree(finished)
    start = time.monotonic()
    proc = run_cli("train", "tiny-arith", *sets(*SHORT), "--run-dir", str(finished), cwd=ROOT)
    took = time.monotonic() - start
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, held_line(finished, "finished at step 2") + "\n", "")
    assert tree(finished) == before  # metrics.jsonl, config.toml, events.jsonl, checkpoints: byte for byte
    assert took < QUICK_S, took


def test_the_trainer_itself_refuses_a_new_run_there_before_anything_loads(finished, monkeypatch):
    """The engine's own check (the CLI's is only the early one): Trainer(..., resume=False) refuses with the
    same line, loads nothing, writes nothing and leaves no lock."""
    from grpo_studio.engine.run import trainer as trainer_mod

    def must_not_load(*args, **kwargs):
        raise AssertionError("loaded before the run directory was checked")

    monkeypatch.setattr(trainer_mod.reward_lib, "build", must_not_load)
    monkeypatch.setattr(trainer_mod.policy_loader, "load_tokenizer", must_not_load)
    before = tree(finished)
    with pytest.raises(UserError) as refused:
        trainer_mod.Trainer(config.load("tiny-arith", SHORT), finished)
    assert str(refused.value) == held_line(finished, "finished at step 2")
    assert tree(finished) == before and not (finished / PIDFILE).exists()


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_run_dir_is_refused_and_nothing_is_written_here(value, tmp_path):
    proc = run_cli("train", "tiny-arith", *sets(*SHORT), "--run-dir", value, cwd=tmp_path)
    assert (proc.returncode, proc.stderr, proc.stdout) == (
        2,
        f"config error: --run-dir = '{value}': empty; allowed: a new or empty directory, or no --run-dir for a "
        f"new one under runs/\n",
        "",
    )
    assert list(tmp_path.iterdir()) == []


def test_an_empty_resume_is_refused(tmp_path):
    proc = run_cli("train", "--resume", "", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (2, "config error: --resume = '': empty; allowed: a run directory\n")
    assert list(tmp_path.iterdir()) == []


def test_what_counts_as_holding_a_run(tmp_path):
    """The studio's launch leaves setup.toml and stdout.log, and a trainer that failed before it started
    its `info` line and an empty checkpoints/: still a place for a new run. Any of config.toml, a state
    event, a stream row or a checkpoint is a run."""
    run = tmp_path / "run"
    assert held_run(run) is None  # not there yet
    (run / CHECKPOINTS).mkdir(parents=True)
    (run / "setup.toml").write_text("[train]\nsteps = 2\n")
    (run / rundir.STDOUT).write_text("pre-flight: ...\n")
    (run / EVENTS).write_text(json.dumps({"time": 1.0, "event": "info", "message": "data"}) + "\n")
    rundir.refuse_held_run(run)  # no error
    cases = [
        (CONFIG, "", "created, no step yet"),
        (EVENTS, json.dumps({"time": 2.0, "event": "started", "message": "", "pid": 1}) + "\n", "crashed at step 0"),
        (METRICS, json.dumps({"step": 3, "loss": 0.5}) + "\n", "crashed at step 3"),
        (EVENTS, json.dumps({"time": 3.0, "event": "stopped", "message": ""}) + "\n", "stopped at step 3"),
    ]
    for name, text, held in cases:
        with open(run / name, "a") as fh:
            fh.write(text)
        assert held_run(run) == held, name
    other = tmp_path / "checkpoint-only"
    (other / CHECKPOINTS / "step-4").mkdir(parents=True)
    with pytest.raises(UserError) as refused:
        rundir.refuse_held_run(other)
    assert str(refused.value) == held_line(other, "created, no step yet")


def test_the_studio_launches_into_its_prepared_directory(tmp_path):
    """studio/launcher.py writes setup.toml and opens stdout.log in a new directory, then runs
    `grpo-studio train --run-dir` on it: that directory is not refused."""
    from grpo_studio.studio import launcher

    run = launcher.new_run_dir(tmp_path / "runs", "tiny")
    proc = launcher.launch(config.load("tiny-arith", SHORT), run)
    assert proc.wait(timeout=300) == 0, (run / rundir.STDOUT).read_text()
    assert rundir.run_state(run).state == "finished" and (run / "setup.toml").is_file()


# ---- a live trainer's lock --------------------------------------------------------------------------


def test_a_second_trainer_is_refused_at_once_and_writes_nothing(tmp_path):
    """The first trainer holds trainer.pid from before its model loads; a second `train` into the same
    directory is refused in one line at once (no pre-flight, no model), and events.jsonl stays as the first
    writes it: one `info`, one `started`."""
    run = tmp_path / "run"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grpo_studio.cli.main",
            "train",
            "tiny-arith",
            *sets("train.steps=100000", "train.eval_every=0", "train.save_every=0"),
            "--run-dir",
            str(run),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while rundir.read_lock(run) is None:
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "no trainer.pid in 120 s"
            time.sleep(0.02)
        holder = rundir.read_lock(run).pid
        line = f"run error: {run} is in use by trainer pid {holder}; stop it or pick another --run-dir\n"

        def second() -> float:
            start = time.monotonic()
            proc = run_cli("train", "tiny-arith", *sets(*SHORT), "--run-dir", str(run), cwd=ROOT)
            took = time.monotonic() - start
            assert (proc.returncode, proc.stderr, proc.stdout) == (2, line, "")
            return took

        early = second()  # the first is still loading
        while not rundir.read_rows(run / METRICS):
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "no metrics row in 120 s"
            time.sleep(0.05)
        events = (run / EVENTS).read_bytes()
        late = second()  # the first is training
        assert (run / EVENTS).read_bytes() == events
        assert [e["event"] for e in rundir.read_events(run)] == ["info", "info", "started"]  # held out, micro-batch
        assert rundir.read_lock(run).pid == holder
        print(f"\nrefused in {early:.2f} s (first loading), {late:.2f} s (first training)")
        assert early < QUICK_S and late < QUICK_S
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGTERM)  # the supervisor passes it on: finish the step, checkpoint, stop
        code = first.wait(timeout=120)
    assert code == 0, first.stderr.read()
    assert rundir.read_events(run)[-1]["event"] == "stopped" and not (run / PIDFILE).exists()


def test_the_trainer_takes_the_lock_before_anything_loads(tmp_path, monkeypatch):
    """A live process holds the lock: Trainer(...) is refused (RunLock) before rewards, data, tokenizer or
    model load, and writes no event."""
    from grpo_studio.engine.run import trainer as trainer_mod

    def must_not_load(*args, **kwargs):
        raise AssertionError("loaded before the lock was taken")

    monkeypatch.setattr(trainer_mod.reward_lib, "build", must_not_load)
    monkeypatch.setattr(trainer_mod.data, "load_rows", must_not_load)
    monkeypatch.setattr(trainer_mod.policy_loader, "load_tokenizer", must_not_load)
    run = tmp_path / "run"
    run.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        rundir.write_lock(run, rundir.Lock.of(sleeper.pid))
        before = tree(run)
        for resume in (False, True):
            with pytest.raises(rundir.RunLock) as refused:
                trainer_mod.Trainer(config.load("tiny-arith", SHORT), run, resume=resume)
            assert str(refused.value) == (
                f"run error: {run} is in use by trainer pid {sleeper.pid}; stop it or pick another --run-dir"
            )
        assert tree(run) == before
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)
