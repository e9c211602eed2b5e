"""The run directory: the seam between the engine (writer) and the studio (reader).

Layout (see docs/design.md):
    config.toml  metrics.jsonl  samples.jsonl  events.jsonl  histograms.jsonl
    checkpoints/step-N/  trainer.pid  stdout.log  trackers.json

Pure python, no torch: the studio imports the reader side.
Every append is flushed and fsync'ed; whole files are written atomically (tmp + rename).

The lock (trainer.pid) names the trainer's pid, the process's start time and the host, so a pid
that the system has handed to another process since is seen as stale, never as a running trainer.
Readers never crash on a malformed line: `parse_row` accepts a JSON object with the fields its
file needs (a step >= 1 in the streams, an event name in events.jsonl) and readers count the rest.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import socket
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from grpo_studio.contract import metrics as schema
from grpo_studio.contract.errors import UserError

METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
EVENTS = "events.jsonl"
HISTOGRAMS = "histograms.jsonl"
STREAMS = (METRICS, SAMPLES, HISTOGRAMS)  # the per-step files a resume cuts back to its checkpoint's step
CONFIG = "config.toml"
PIDFILE = "trainer.pid"
CHECKPOINTS = "checkpoints"
STDOUT = "stdout.log"
RUNS = Path("runs")  # where runs live unless told (--runs-dir): the studio, attach, runs, train's new runs
START_TIME_SLACK_S = 1.0  # two readings of one process's start time differ by less (boot-time rounding)


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _clean(value):
    """JSON has no NaN/inf: write them as null so every reader can parse every line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


# ---- rows: what a reader accepts ----------------------------------------------------------------

def _is_step(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


ROW_CHECKS = {  # file -> the fields its readers rely on
    METRICS: lambda row: _is_step(row.get(schema.STEP)),
    SAMPLES: lambda row: _is_step(row.get(schema.STEP)) and isinstance(row.get("rewards", {}), dict),
    HISTOGRAMS: lambda row: (_is_step(row.get(schema.STEP)) and isinstance(row.get("edges"), list)
                             and isinstance(row.get("counts"), list)),
    EVENTS: lambda row: isinstance(row.get("event"), str) and isinstance(row.get("time", 0.0), (int, float)),
}


def parse_row(name: str, line: bytes | str) -> dict | None:
    """One line of the run directory's file `name` as readers take it, or None when it is not a JSON
    object with the fields that file needs (see ROW_CHECKS)."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, or not UTF-8
        return None
    if not isinstance(row, dict):
        return None
    check = ROW_CHECKS.get(name)
    return row if check is None or check(row) else None


# ---- the lock ---------------------------------------------------------------------------------

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
    try:
        data = json.loads((Path(run_dir) / PIDFILE).read_text())
        return Lock(int(data["pid"]), float(data["start_time"]), str(data["host"]))
    except (OSError, ValueError, TypeError, KeyError):
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
    except psutil.NoSuchProcess:
        return "the process is gone"
    if zombie:
        return "the process is gone"
    if abs(started - lock.start_time) > START_TIME_SLACK_S:
        return (f"pid {lock.pid} now belongs to another process (started {_clock(started)}, "
                f"the trainer started {_clock(lock.start_time)})")
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
    return RunLock(f"run error: {Path(run_dir)} is in use by trainer pid {holder.pid}{where}; "
                   f"stop it or pick another --run-dir")


def held_run(run_dir: Path) -> str | None:
    """The run `run_dir` already holds, as "finished at step 6", or None when a new run may start there.
    A directory holds a run once a trainer has written its config.toml, a state event, a stream row or a
    checkpoint; what the studio writes before it launches (setup.toml, stdout.log) and the `info` lines of a
    trainer that stopped before it started do not count. The lock is not consulted: its holder is
    `lock_holder`'s question."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    kinds = [e["event"] for e in read_events(run_dir) if e["event"] in STATE_EVENTS]
    checkpoints = run_dir / CHECKPOINTS
    if not ((run_dir / CONFIG).exists() or kinds or any(_size(run_dir / name) for name in STREAMS)
            or (checkpoints.is_dir() and any(checkpoints.iterdir()))):
        return None
    last = kinds[-1] if kinds else ""
    state = "crashed" if last == "started" else last or "created"  # started, and nobody holds it: it died
    row = last_metrics_row(run_dir)
    step = row[schema.STEP] if row else 0
    return f"{state} at step {step}" if step or state != "created" else "created, no step yet"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def refuse_held_run(run_dir: Path) -> None:
    """A new run (no --resume) into a directory that already holds one: one UserError line."""
    held = held_run(run_dir)
    if held is not None:
        raise UserError(f"already holds a run ({held}); allowed: --resume {shlex.quote(str(Path(run_dir)))} to "
                        f"continue it, or a new or empty directory", key="--run-dir", value=str(Path(run_dir)))


class RunWriter:
    """Appends the trainer's rows. One per run directory, guarded by trainer.pid."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, object] = {}

    def acquire(self, new_run: bool = False) -> None:
        """Take trainer.pid. A live trainer's lock is refused (RunLock); a stale one (its process is gone,
        or its pid now names another process) is taken over with a `stale_lock` event. `new_run`: a run
        directory that already holds a run is refused too (UserError, `refuse_held_run`), checked before the
        lock is taken and again once it is held (a run that ended meanwhile). A refused trainer writes
        nothing into the directory."""
        me = Lock.of(os.getpid())
        holder = lock_holder(self.dir)
        if holder is not None and (holder.pid, holder.host) != (me.pid, me.host):
            raise in_use(self.dir, holder)
        if new_run:
            refuse_held_run(self.dir)
        if holder is not None:
            return  # ours already
        pidfile = self.dir / PIDFILE
        stale = pidfile.exists()
        if stale:
            old = read_lock(self.dir)
            pidfile.unlink(missing_ok=True)
        try:
            write_lock(self.dir, me)
        except FileExistsError:  # another trainer took it meanwhile: refuse, or take it over if it died too
            self.acquire(new_run)
            return
        if new_run:
            try:
                refuse_held_run(self.dir)
            except BaseException:
                self.release()
                raise
        (self.dir / CHECKPOINTS).mkdir(exist_ok=True)  # once held: a refused trainer creates nothing here
        if stale and old is None:
            self.event("stale_lock", "took over an unreadable trainer.pid", pid=None)
        elif stale:
            self.event("stale_lock", f"took over the stale lock of trainer pid {old.pid}: {stale_reason(old)}",
                       pid=old.pid)

    def release(self) -> None:
        if read_pid(self.dir) == os.getpid():
            (self.dir / PIDFILE).unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        for fh in self._files.values():
            with contextlib.suppress(OSError):  # a write already failed (disk full) and said so
                fh.close()
        self._files.clear()

    def _append(self, name: str, row: dict) -> None:
        fh = self._files.get(name)
        if fh is None:
            fh = self._files[name] = open(self.dir / name, "a+b")
            if fh.tell():  # a writer killed mid-line left a torn last line: end it, so ours stays whole
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    fh.write(b"\n")
        fh.write(json.dumps(_clean(row), separators=(",", ":")).encode() + b"\n")
        fh.flush()
        os.fsync(fh.fileno())

    def metrics(self, row: dict) -> None:
        """Append one row; a name missing from the metric schema raises UnknownMetric."""
        schema.check_row(row)
        self._append(METRICS, row)

    def samples(self, rows: list[dict]) -> None:
        for row in rows:
            self._append(SAMPLES, row)

    def histogram(self, row: dict) -> None:
        self._append(HISTOGRAMS, row)

    def event(self, kind: str, message: str = "", **extra) -> None:
        self._append(EVENTS, {"time": time.time(), "event": kind, "message": message, **extra})

    def cut_streams(self, step: int) -> dict[str, dict[str, int]]:
        """On resume: keep the stream rows of steps 1..`step` (the checkpoint the run continues from) and
        drop every line a reader would skip, in the streams and in events.jsonl, so the run goes on as one
        stream of whole rows, each step once. Returns {file: {"past": n, "malformed": m}} for the files
        that lost lines."""
        dropped = {}
        for name in (*STREAMS, EVENTS):
            path = self.dir / name
            if not path.exists():
                continue
            tmp, past, malformed = path.with_name(f".{name}.tmp"), 0, 0
            with open(path, "rb") as src, open(tmp, "wb") as kept:  # line by line: samples can be large
                for line in src:
                    row = parse_row(name, line)
                    if row is None:
                        malformed += 1 if line.strip() else 0
                    elif name != EVENTS and row[schema.STEP] > step:
                        past += 1
                    else:
                        kept.write(line if line.endswith(b"\n") else line + b"\n")
                if past or malformed:
                    kept.flush()
                    os.fsync(kept.fileno())
            if not (past or malformed):
                tmp.unlink()
                continue
            fh = self._files.pop(name, None)
            if fh is not None:  # it is about to be replaced: the next append opens the new file
                fh.close()
            os.replace(tmp, path)
            dropped[name] = {"past": past, "malformed": malformed}
        return dropped


class JsonlTail:
    """Incrementally reads complete lines appended to a run directory's JSONL file (partial last lines
    wait). Lines that `parse_row` refuses are skipped and counted in `skipped`. When the file was
    rewritten (a resume cut it) the tail starts over and `restarted` is True after that read."""

    def __init__(self, path: Path, max_rows: int = 5000):
        self.path = Path(path)
        self.offset = 0
        self._partial = b""
        self._inode: int | None = None
        self.max_rows = max_rows
        self.skipped = 0
        self.restarted = False

    def read_new(self) -> list[dict]:
        self.restarted = False
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_size < self.offset or self._inode not in (None, st.st_ino):  # rewritten: start over
                    self.offset, self._partial, self.skipped, self.restarted = 0, b"", 0, True
                self._inode = st.st_ino
                fh.seek(self.offset)
                chunk = fh.read(max(0, min(st.st_size - self.offset, 8 << 20)))  # back-pressure: 8 MiB a poll
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        rows = []
        for line in lines[-self.max_rows:] if len(lines) > self.max_rows else lines:
            if line.strip():
                row = parse_row(self.path.name, line)
                if row is None:
                    self.skipped += 1
                else:
                    rows.append(row)
        return rows


STATE_EVENTS = ("started", "finished", "stopped", "crashed")  # the events that change a run's state


def record_exit(run_dir: Path, pid: int, returncode: int) -> str | None:
    """The goodbye of trainer `pid` when it died without one (os._exit in a reward function, SIGKILL from
    the OOM killer): if its `started` is the run's last state event, append `crashed` naming the exit status
    or signal; remove its lock if it left one. Returns the crashed message, or None if it had said goodbye."""
    lock = read_lock(run_dir)
    if lock is not None and lock.pid == pid:
        if stale_reason(lock) is None:  # the named trainer lives (a refused trainer under torchrun names the holder)
            return None
        (Path(run_dir) / PIDFILE).unlink(missing_ok=True)
    events = [e for e in read_events(run_dir) if e["event"] in STATE_EVENTS]
    if not events or events[-1]["event"] != "started" or events[-1].get("pid") != pid:
        return None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        how, extra = f"was killed by {name}", {"signal": name}
    else:
        how, extra = f"exited with status {returncode}", {"exit_status": returncode}
    row = last_metrics_row(run_dir)
    step = row[schema.STEP] if row else 0
    message = f"trainer pid {pid} {how} after step {step}, without saying goodbye"
    writer = RunWriter(run_dir)
    writer.event("crashed", message, step=step, pid=pid, **extra)
    writer.close()
    return message


@dataclass
class RunState:
    name: str
    path: Path
    state: str  # running | finished | stopped | crashed | created
    step: int = 0
    total_steps: int | None = None
    last_event: str = ""
    skipped_rows: int = 0  # malformed lines its readers skipped (events.jsonl, the tail of metrics.jsonl)
    extra: dict = field(default_factory=dict)


def read_rows(path: Path) -> list[dict]:
    """Every whole row of a run directory's JSONL file, however long (malformed lines and a partial last
    line are skipped, as parse_row and JsonlTail skip them)."""
    try:
        with open(path, "rb") as fh:
            lines = fh.read().split(b"\n")[:-1]  # the part after the last newline is being written
    except FileNotFoundError:
        return []
    return [row for row in (parse_row(Path(path).name, line) for line in lines if line.strip()) if row is not None]


def read_events(run_dir: Path) -> list[dict]:
    return read_rows(Path(run_dir) / EVENTS)


def _last_row(path: Path, window: int = 65536) -> tuple[dict | None, int]:
    """The last whole row of a JSONL file (reading its last `window` bytes) and how many malformed lines
    follow it."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            start = max(0, fh.tell() - window)
            fh.seek(start)
            lines = fh.read().split(b"\n")
    except FileNotFoundError:
        return None, 0
    lines.pop()  # the part after the last newline: being written, or empty
    if start:
        lines = lines[1:]  # the window began inside this one
    skipped = 0
    for line in reversed(lines):
        row = parse_row(path.name, line) if line.strip() else None
        if row is not None:
            return row, skipped
        skipped += 1 if line.strip() else 0
    return None, skipped


def last_metrics_row(run_dir: Path) -> dict | None:
    return _last_row(Path(run_dir) / METRICS)[0]


def state_of(run_dir: Path, last_state_event: str) -> str:
    """running / finished / stopped / crashed / created, from the lock and the last state event."""
    if lock_holder(run_dir) is not None:
        return "running"
    if last_state_event == "started":
        return "crashed"  # started but the process is gone without saying goodbye
    return last_state_event or "created"


def run_state(run_dir: Path) -> RunState:
    """A run directory's state (state_of its last state event), step and total steps."""
    run_dir = Path(run_dir)
    tail = JsonlTail(run_dir / EVENTS, max_rows=10**9)
    events = [e for e in tail.read_new() if e["event"] in STATE_EVENTS]
    last = events[-1]["event"] if events else ""
    total = next((e.get("total_steps") for e in reversed(events) if e["event"] == "started"), None)
    row, skipped = _last_row(run_dir / METRICS)
    return RunState(run_dir.name, run_dir, state_of(run_dir, last), row[schema.STEP] if row else 0, total, last,
                    tail.skipped + skipped)


def list_runs(root: Path) -> list[RunState]:
    root = Path(root)
    if not root.is_dir():
        return []
    dirs = [d for d in root.iterdir() if d.is_dir() and ((d / CONFIG).exists() or (d / EVENTS).exists())]
    return [run_state(d) for d in sorted(dirs, key=lambda d: d.stat().st_mtime, reverse=True)]


def as_number(value) -> float | None:
    """A row's value as a float, or None when it is not a number (null, a string, a list ...)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def run_summaries(root: Path) -> list[dict]:
    """One row per run under `root` (newest first): what `grpo-studio runs` and the runs screen list."""
    rows = []
    for st in list_runs(root):
        last = last_metrics_row(st.path) or {}
        try:
            cfg = tomllib.loads((st.path / CONFIG).read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            cfg = {}
        model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
        rows.append({"path": st.path, "name": st.name, "state": st.state, "step": st.step, "total": st.total_steps,
                     "dtype": model.get("dtype", "?"), "model": model.get("name", "?"),
                     "reward": as_number(last.get(schema.REWARD)), "k3": as_number(last.get(schema.K3)),
                     "skipped": st.skipped_rows})
    return rows
