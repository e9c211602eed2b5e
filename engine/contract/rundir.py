"""The run directory: the seam between the engine (writer) and the studio (reader).

Layout (see DESIGN.md):
    config.toml  metrics.jsonl  samples.jsonl  events.jsonl  histograms.jsonl
    checkpoints/step-N/  trainer.pid  stdout.log

Pure python, no torch: the studio imports the reader side.
Every append is flushed and fsync'ed; whole files are written atomically (tmp + rename).
"""

from __future__ import annotations

import json
import math
import os
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from grpo_studio.engine.contract import metrics as schema

METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
EVENTS = "events.jsonl"
HISTOGRAMS = "histograms.jsonl"
CONFIG = "config.toml"
PIDFILE = "trainer.pid"
CHECKPOINTS = "checkpoints"
STDOUT = "stdout.log"
RUNS = Path("runs")  # where runs live unless told (--runs-dir): the studio, attach, runs, train's new runs


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


class RunLock(RuntimeError):
    pass


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_pid(run_dir: Path) -> int | None:
    try:
        return int((Path(run_dir) / PIDFILE).read_text().strip())
    except (OSError, ValueError):
        return None


class RunWriter:
    """Appends the trainer's rows. One per run directory, guarded by trainer.pid."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / CHECKPOINTS).mkdir(exist_ok=True)
        self._files: dict[str, object] = {}

    def acquire(self) -> None:
        """Create trainer.pid exclusively; a live pid means another trainer owns this run."""
        pidfile = self.dir / PIDFILE
        other = read_pid(self.dir)
        if other is not None and other != os.getpid() and pid_alive(other):
            raise RunLock(f"run error: {self.dir} is in use by trainer pid {other}; stop it or pick another --run-dir")
        pidfile.unlink(missing_ok=True)
        fd = os.open(pidfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))

    def release(self) -> None:
        if read_pid(self.dir) == os.getpid():
            (self.dir / PIDFILE).unlink(missing_ok=True)
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def _append(self, name: str, row: dict) -> None:
        fh = self._files.get(name)
        if fh is None:
            fh = self._files[name] = open(self.dir / name, "a")
        fh.write(json.dumps(_clean(row), separators=(",", ":")) + "\n")
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

    def truncate_metrics_after(self, step: int) -> None:
        """On resume: drop rows past the checkpoint so the stream stays 1..N without duplicates."""
        for name in (METRICS, SAMPLES, HISTOGRAMS):
            path = self.dir / name
            if not path.exists():
                continue
            kept = [line for line in path.read_text().splitlines()
                    if line.strip() and _row_step(line) <= step]
            atomic_write_text(path, "".join(line + "\n" for line in kept))


def _row_step(line: str) -> int:
    try:
        return int(json.loads(line).get(schema.STEP, 0))
    except (ValueError, AttributeError):
        return 0


class JsonlTail:
    """Incrementally reads complete lines appended to a JSONL file (partial last lines wait)."""

    def __init__(self, path: Path, max_rows: int = 5000):
        self.path = Path(path)
        self.offset = 0
        self._partial = b""
        self.max_rows = max_rows

    def read_new(self) -> list[dict]:
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self.offset:  # truncated (resume rewrote it): start over
                    self.offset, self._partial = 0, b""
                fh.seek(self.offset)
                chunk = fh.read(max(0, min(size - self.offset, 8 << 20)))  # back-pressure: 8 MiB a poll
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        rows = []
        for line in lines[-self.max_rows:] if len(lines) > self.max_rows else lines:
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return rows


STATE_EVENTS = ("started", "finished", "stopped", "crashed")  # the events that change a run's state


@dataclass
class RunState:
    name: str
    path: Path
    state: str  # running | finished | stopped | crashed | created
    step: int = 0
    total_steps: int | None = None
    last_event: str = ""
    extra: dict = field(default_factory=dict)


def read_events(run_dir: Path) -> list[dict]:
    return JsonlTail(Path(run_dir) / EVENTS, max_rows=10**9).read_new()


def last_metrics_row(run_dir: Path) -> dict | None:
    path = Path(run_dir) / METRICS
    if not path.exists():
        return None
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - 65536))
        lines = [line for line in fh.read().splitlines() if line.strip()]
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def state_of(run_dir: Path, last_state_event: str) -> str:
    """running / finished / stopped / crashed / created, from pid liveness and the last state event."""
    pid = read_pid(run_dir)
    if pid is not None and pid_alive(pid):
        return "running"
    if last_state_event == "started":
        return "crashed"  # started but the process is gone without saying goodbye
    return last_state_event or "created"


def run_state(run_dir: Path) -> RunState:
    """A run directory's state (state_of its last state event), step and total steps."""
    run_dir = Path(run_dir)
    events = [e for e in read_events(run_dir) if e.get("event") in STATE_EVENTS]
    last = events[-1]["event"] if events else ""
    total = next((e.get("total_steps") for e in reversed(events) if e["event"] == "started"), None)
    row = last_metrics_row(run_dir) or {}
    return RunState(run_dir.name, run_dir, state_of(run_dir, last), int(row.get(schema.STEP, 0)), total, last)


def list_runs(root: Path) -> list[RunState]:
    root = Path(root)
    if not root.is_dir():
        return []
    dirs = [d for d in root.iterdir() if d.is_dir() and ((d / CONFIG).exists() or (d / EVENTS).exists())]
    return [run_state(d) for d in sorted(dirs, key=lambda d: d.stat().st_mtime, reverse=True)]


def run_summaries(root: Path) -> list[dict]:
    """One row per run under `root` (newest first): what `grpo-studio runs` and the runs screen list."""
    rows = []
    for st in list_runs(root):
        last = last_metrics_row(st.path) or {}
        try:
            cfg = tomllib.loads((st.path / CONFIG).read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            cfg = {}
        model = cfg.get("model", {})
        rows.append({"path": st.path, "name": st.name, "state": st.state, "step": st.step, "total": st.total_steps,
                     "dtype": model.get("dtype", "?"), "model": model.get("name", "?"),
                     "reward": last.get(schema.REWARD), "k3": last.get(schema.K3)})
    return rows
