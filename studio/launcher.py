"""Start, stop and kill trainers. The trainer is its own process in its own session (its own
process group, no controlling terminal), so closing the studio, an SSH drop or a studio crash
never stops it. The studio only reads the run directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from grpo_studio.engine.contract import config as cfgmod
from grpo_studio.engine.contract import rundir
from grpo_studio.engine.contract.config import Config
from grpo_studio.engine.contract.dtypes import DTYPES
from grpo_studio.engine.contract.errors import UserError


def new_run_dir(root: Path, label: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{label}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def run_label(cfg: Config) -> str:
    model = Path(cfg.model.name).name.lower().replace("/", "-") or "run"
    return f"{model}-{cfg.model.dtype}"


def launch(cfg: Config, run_dir: Path) -> subprocess.Popen:
    """Write the setup next to the run and start `grpo-studio train` on it, detached."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    setup = run_dir / "setup.toml"
    rundir.atomic_write_text(setup, cfgmod.to_toml(cfg))
    log = open(run_dir / rundir.STDOUT, "ab")
    cmd = [sys.executable, "-m", "grpo_studio.cli.main", "train", str(setup), "--run-dir", str(run_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env, cwd=os.getcwd())
    finally:
        log.close()


def wait_for_pid(run_dir: Path, proc: subprocess.Popen | None = None, timeout: float = 60.0) -> int | None:
    """The trainer's pid once it has written trainer.pid (None if it exited first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = rundir.read_pid(run_dir)
        if pid is not None:
            return pid
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def stop(run_dir: Path) -> bool:
    """Graceful: SIGTERM to the trainer, which finishes its step, checkpoints and logs `stopped`."""
    pid = rundir.read_pid(run_dir)
    if pid is None or not rundir.pid_alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    return True


def kill(run_dir: Path) -> bool:
    """SIGKILL to the trainer's whole process group (no checkpoint)."""
    pid = rundir.read_pid(run_dir)
    if pid is None or not rundir.pid_alive(pid):
        return False
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    return True


def load_run_config(run_dir: Path) -> Config:
    """The resolved config of an existing run (config.toml, else the setup.toml the studio wrote)."""
    for name in (rundir.CONFIG, "setup.toml"):
        path = Path(run_dir) / name
        if path.is_file():
            return cfgmod.load(str(path))
    raise UserError(f"{run_dir}: no {rundir.CONFIG} (not a run directory)", kind="run")


def other_dtype(dtype: str) -> str:
    return DTYPES[dtype].ab_partner


def duplicate_with_dtype(run_dir: Path, dtype: str | None = None) -> tuple[Config, str]:
    """The precision A/B: the same run with another model dtype (rollout dtype follows it)."""
    cfg = load_run_config(run_dir)
    new = dtype or other_dtype(cfg.model.dtype)
    cfgmod.set_key(cfg, "model.dtype", new)
    cfgmod.set_key(cfg, "rollout.dtype", "")
    cfgmod.validate(cfg)
    return cfg, new
