"""Start, stop and kill trainers. `grpo-studio train` runs in its own session (its own process group,
no controlling terminal), so closing the studio, an SSH drop or a studio crash never stops it; it runs
the trainer as its child and records the trainer's end if the trainer cannot. Stop and kill signal
only a process proven to be the run's trainer. The studio only reads the run directory."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import psutil

from ..contract import config as cfgmod
from ..contract import rundir
from ..contract.config import Config
from ..contract.dtypes import DTYPES
from ..contract.errors import UserError
from ..contract.launch import FRONT_DOOR, train_args, train_command


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


def launch(cfg: Config, run_dir: Path, force: bool = False, nproc: int = 1, rehearse: bool = False) -> subprocess.Popen:
    """Write the setup next to the run and start `grpo-studio train` on it, detached (`force`: past a
    refusing pre-flight check, which the user was shown; `nproc` > 1: that many data-parallel processes,
    one per GPU, under torchrun; `rehearse`: one rehearsal step first, `train --rehearse`)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    setup = run_dir / "setup.toml"
    rundir.atomic_write_text(setup, cfgmod.to_toml(cfg))
    return _train(run_dir, train_args(str(setup), run_dir, force=force, rehearse=rehearse, nproc=nproc))


def resume(run_dir: Path) -> subprocess.Popen:
    """`grpo-studio train --resume RUN`, detached: a fork continuing from its parent's checkpoint (studio/fork.py)."""
    return _train(Path(run_dir), train_args(None, Path(run_dir), resume=True))


def _train(run_dir: Path, args: list[str]) -> subprocess.Popen:
    """`grpo-studio train ARGS` in its own session, its output appended to the run's stdout.log."""
    log = open(run_dir / rundir.STDOUT, "ab")
    cmd = train_command(args)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
            cwd=os.getcwd(),
        )
    finally:
        log.close()


def export_command(run: Path, dest: str) -> list[str]:
    """The `grpo-studio export` command line for a destination typed in the studio: FILE.gguf or a folder."""
    kind = "--gguf" if dest.lower().endswith(".gguf") else "--merged"
    return [*FRONT_DOOR, "export", str(run), kind, dest]


def export(run: Path, dest: str) -> tuple[bool, str]:
    """Run `grpo-studio export` (the studio never loads torch): whether it worked, and its one line."""
    done = subprocess.run(export_command(run, dest), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    lines = (done.stdout if done.returncode == 0 else done.stderr).strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else f"grpo-studio export exited with status {done.returncode}"


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


def trainer_process(run_dir: Path) -> psutil.Process:
    """The process proven to be this run's trainer: the lock's pid is alive on this host with the lock's
    start time, and its command line is a `grpo-studio train` of this run directory. Anything else is
    refused (UserError): a stale lock's pid may belong to an unrelated process by now."""
    run_dir = Path(run_dir)
    lock = rundir.read_lock(run_dir)
    if lock is None:
        raise UserError(
            f"no trainer holds it ({rundir.PIDFILE} is missing or unreadable)", kind="run", key=str(run_dir)
        )
    if lock.host != socket.gethostname():
        why = f"it runs on host {lock.host}; stop it there"
    else:
        why = rundir.stale_reason(lock)
    if why is None:
        try:
            proc = psutil.Process(lock.pid)
            if _trains(proc.cmdline(), Path(proc.cwd()), run_dir):
                return proc
        except psutil.Error:
            pass
        why = f"pid {lock.pid} is not a grpo-studio train of this run directory"
    raise UserError(f"refusing to signal trainer pid {lock.pid}: {why}", kind="run", key=str(run_dir))


def _trains(argv: list[str], cwd: Path, run_dir: Path) -> bool:
    """Whether a command line is `grpo-studio train ...` naming `run_dir` (relative to its cwd)."""
    if "train" not in argv:
        return False
    at = argv.index("train")
    if not any(a == "grpo_studio.cli.main" or Path(a).name == "grpo-studio" for a in argv[:at]):
        return False
    target = run_dir.resolve()
    values = (a.partition("=")[2] if a.startswith("--") else a for a in argv[at + 1 :])
    return any(v and (cwd / v).resolve() == target for v in values)


def stop(run_dir: Path) -> None:
    """Graceful: SIGTERM to the trainer, which finishes its step, checkpoints and logs `stopped`."""
    trainer_process(run_dir).terminate()


def kill(run_dir: Path) -> None:
    """SIGKILL to the trainer and every process it started (no checkpoint); the `grpo-studio train` that
    launched it records the `crashed` event."""
    proc = trainer_process(run_dir)
    children = proc.children(recursive=True)
    for victim in (proc, *children):
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            pass


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
