"""Through a real terminal: tmux runs `grpo-studio` at 80×24, a key starts the run, the pane shows
the dashboard's reward and KL numbers changing; killing the studio leaves the trainer running."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_studio.contract import rundir
from grpo_studio.contract.run_lock import pid_alive
from tests.studio_helpers import tiny_model_name

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


STEPS = 400  # far more than the test watches: the trainer must still be running when the studio dies


def test_tmux_studio_runs_and_training_survives_it(tmp_path, request):
    model = tiny_model_name(request)
    studio = Path(sys.executable).parent / "grpo-studio"
    sock = f"grpo-studio-test-{os.getpid()}"
    tmux = ["tmux", "-L", sock]
    cmd = (
        f"cd {shlex.quote(str(tmp_path))} && exec {shlex.quote(str(studio))} --runs-dir runs "
        f"--set model.name={shlex.quote(model)} --set train.steps={STEPS} --set train.prompts_per_step=2 "
        f"--set rollout.num_generations=2 --set train.save_every=0"
    )
    env = {**os.environ, "TERM": "xterm-256color"}
    subprocess.run([*tmux, "new-session", "-d", "-s", "studio", "-x", "80", "-y", "24", cmd], check=True, env=env)

    def pane() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", "studio"], capture_output=True, text=True).stdout

    trainer_pid = None
    try:
        wait_for(lambda: "Launch" in pane(), 60, "the setup screen")
        subprocess.run([*tmux, "send-keys", "-t", "studio", "C-r"], check=True)

        status = re.compile(rf"(\d+)/{STEPS}\s+ETA.*reward (\S+)\s+k3 (\S+)")
        first = wait_for(lambda: (m := status.search(pane())) and int(m.group(1)) >= 1 and m, 240, "step 1")
        screen = pane()
        assert "reward" in screen and "KL k3" in screen  # both panels of the overview are on screen
        later = wait_for(
            lambda: (m := status.search(pane())) and int(m.group(1)) > int(first.group(1)) + 1 and m, 240, "more steps"
        )
        assert (later.group(2), later.group(3)) != (first.group(2), first.group(3))  # numbers change live

        run_dir = next((tmp_path / "runs").iterdir())
        trainer_pid = rundir.read_pid(run_dir)
        assert trainer_pid and pid_alive(trainer_pid)
        studio_pid = int(
            subprocess.run(
                [*tmux, "display", "-p", "-t", "studio", "#{pane_pid}"], capture_output=True, text=True, check=True
            ).stdout
        )
        subprocess.run([*tmux, "kill-server"], check=True)  # the studio and its terminal go away
        wait_for(lambda: not pid_alive(studio_pid) or _zombie(studio_pid), 60, "the studio to exit")
        rows_at_kill = len((run_dir / rundir.METRICS).read_text().splitlines())
        wait_for(
            lambda: len((run_dir / rundir.METRICS).read_text().splitlines()) >= rows_at_kill + 2,
            120,
            "the trainer to keep writing after the studio died",
        )
        assert pid_alive(trainer_pid)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        if trainer_pid and pid_alive(trainer_pid):
            os.killpg(os.getpgid(trainer_pid), signal.SIGKILL)
