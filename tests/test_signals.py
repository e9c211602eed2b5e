"""Signals (issue 40 item 7), with real `grpo-studio train tiny-arith` processes (benchmarks/hostile_signals.py holds
each case and its oracle): SIGHUP to the supervisor detaches the run, which goes on to `finished` with its output in
RUN/stdout.log; a supervisor killed leaves a trainer that stops gracefully and writes its own `stopped`; a stop while
loading is one line ("stopped while loading (SIGTERM): RUN"), a `stopped` event and exit 0, and before the lock it
writes nothing at all; a trainer killed by a signal gets its `crashed` from the supervisor."""

from __future__ import annotations

import pytest

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
