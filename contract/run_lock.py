"""The run lock, trainer.pid: which live trainer holds a run directory.

The lock names the trainer's pid, the process's start time and the host, so a pid that the system has
handed to another process since is seen as stale, never as a running trainer. An unreadable lock (no
permission, a folder, not JSON) reads as none: no live trainer wrote it. Pure python, no torch.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from .run_files import PIDFILE, atomic_write_text
from .run_reader import read_bytes

MAX_LOCK_BYTES = 4096  # a lock is one short JSON object
START_TIME_SLACK_S = 1.0  # two readings of one process's start time differ by less (boot-time rounding)


class RunLock(RuntimeError):
    pass


@dataclass(frozen=True)
class Lock:
    """trainer.pid: who holds a run directory. The start time tells a reused pid from the trainer."""

    pid: int
    start_time: float
    host: str

    @classmethod
    def of(cls, pid: int) -> Lock:
        return cls(pid, psutil.Process(pid).create_time(), socket.gethostname())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_lock(run_dir: Path) -> Lock | None:
    """The lock in trainer.pid; None when there is none or it is unreadable (no live trainer wrote it)."""
    text = read_bytes(Path(run_dir) / PIDFILE, MAX_LOCK_BYTES)  # a FIFO or a device is never opened
    try:
        data = json.loads(text or b"")
        return Lock(int(data["pid"]), float(data["start_time"]), str(data["host"]))
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return None


def read_pid(run_dir: Path) -> int | None:
    lock = read_lock(run_dir)
    return lock.pid if lock else None


def write_lock(run_dir: Path, lock: Lock) -> None:
    """Create trainer.pid whole or not at all: written to a temporary file, then hard-linked into place,
    which fails if another trainer's lock appeared meanwhile."""
    path = Path(run_dir) / PIDFILE
    tmp = path.with_name(f".{PIDFILE}.{os.getpid()}.tmp")
    text = json.dumps({"pid": lock.pid, "start_time": lock.start_time, "host": lock.host})
    atomic_write_text(tmp, text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links: create exclusively, then write (not whole at once)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w") as fh:
            fh.write(text)
    finally:
        tmp.unlink()


def stale_reason(lock: Lock) -> str | None:
    """Why `lock` no longer names a live trainer, or None when it does. A lock from another host
    cannot be checked from here and counts as live."""
    if lock.host != socket.gethostname():
        return None
    try:
        proc = psutil.Process(lock.pid)
        started, zombie = proc.create_time(), proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ValueError, OverflowError):  # gone, or a pid no process can have
        return "the process is gone"
    if zombie:
        return "the process is gone"
    if abs(started - lock.start_time) > START_TIME_SLACK_S:
        return (
            f"pid {lock.pid} now belongs to another process (started {_clock(started)}, "
            f"the trainer started {_clock(lock.start_time)})"
        )
    return None


def _clock(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def lock_holder(run_dir: Path) -> Lock | None:
    """The lock of the live trainer that holds `run_dir`, or None (no lock, or a stale one)."""
    lock = read_lock(run_dir)
    return lock if lock is not None and stale_reason(lock) is None else None


def in_use(run_dir: Path, holder: Lock) -> RunLock:
    """The refusal of a trainer that finds `run_dir` held by the live trainer `holder`."""
    where = "" if holder.host == socket.gethostname() else f" on host {holder.host}"
    return RunLock(
        f"run error: {Path(run_dir)} is in use by trainer pid {holder.pid}{where}; stop it or pick another --run-dir"
    )
