"""Signals (issue 40 item 7), with real `grpo-studio train tiny-arith` processes (benchmarks/hostile_signals.py holds
each case and its oracle): SIGHUP to the supervisor detaches the run, which goes on to `finished` with its output in
RUN/stdout.log; a supervisor killed leaves a trainer that stops gracefully and writes its own `stopped`; a stop while
loading is one line ("stopped while loading (SIGTERM): RUN"), a `stopped` event and exit 0, and before the lock it
writes nothing at all; a trainer killed by a signal gets its `crashed` from the supervisor."""

from __future__ import annotations

import pytest

from grpo_studio.benchmarks import hostile_environments
from grpo_studio.benchmarks import hostile_signals as hostile

CASES = {case.name: case for case in hostile.cases()}


def test_detach_output_sends_a_pipe_to_stdout_log_and_leaves_a_file(tmp_path):
    assert hostile.detach_output_redirects(tmp_path) is None


@pytest.mark.parametrize(
    "name",
    [
        "SIGHUP to the supervisor",
        "SIGHUP to the process group",
        "SIGKILL of the supervisor mid-run",
        "SIGTERM to the supervisor while loading",
        "SIGINT before the lock",
        "SIGUSR1 to the trainer",
    ],
)
@pytest.mark.slow
def test_signal(tmp_path, name):
    assert CASES[name].check(tmp_path) is None


ENVIRONMENTS = {case.name: case for case in hostile_environments.cases()}


@pytest.mark.parametrize(
    "name",
    [
        "reset calls os._exit(0)",
        "a module thread os._exit(0)s mid-run",
        "an atexit handler sleeps forever",
        "a non-daemon thread sleeps forever",
    ],
)
@pytest.mark.slow
def test_a_trainer_that_exits_without_its_end_is_crashed_and_one_that_will_not_exit_is_ended(tmp_path, name):
    """Exit status 0 without `finished` is a crash (one line, exit 1, a crashed event, no lock); a trainer kept
    alive after its end by user code is ended by the exit watchdog (cli/train_cmd.py bound_exit)."""
    assert ENVIRONMENTS[name].check(tmp_path) is None


@pytest.mark.slow
def test_a_terminal_gone_without_a_hangup_detaches_the_run(tmp_path):
    """A background job's terminal closes and no SIGHUP reaches it (its own session): its next write fails with
    EIO. The run goes on into RUN/stdout.log and finishes, as after a hang-up."""
    import os
    import pty
    import subprocess
    import sys
    import time

    from grpo_studio.contract import rundir

    master, slave = pty.openpty()
    run = tmp_path / "run"
    sets = ["train.steps=3", "train.prompts_per_step=2", "rollout.num_generations=2", "train.eval_every=0"]
    argv = [sys.executable, "-m", "grpo_studio.cli.main", "train", "tiny-arith", "--run-dir", str(run)]
    proc = subprocess.Popen(
        argv + [a for s in sets for a in ("--set", s)],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        start_new_session=True,  # the pty is not its controlling terminal: closing it sends no SIGHUP
    )
    os.close(slave)
    seen, deadline = b"", time.monotonic() + 120
    while b"run directory" not in seen and time.monotonic() < deadline:
        seen += os.read(master, 4096)
    os.close(master)  # the terminal is gone
    assert proc.wait(timeout=300) == 0
    states = [e["event"] for e in rundir.read_events(run) if e["event"] in ("finished", "crashed")]
    assert states == ["finished"]
    assert "finished at step 3" in (run / rundir.STDOUT).read_text()
