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
