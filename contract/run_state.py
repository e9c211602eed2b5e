"""A run's state, derived in one place from the lock and the last state event, and the runs list.

running / finished / stopped / crashed / created: `state_of` (the lock, then the last state event, read
from the end of events.jsonl however long it is). `run_state` and `run_summaries` read through the
tolerant readers (run_reader): what they could not read is a line in RunState.warnings, never an error.
`held_run`: whether a directory already holds a run a new trainer must not start over. Pure python.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from . import metrics as schema
from .errors import UserError
from .run_files import CHECKPOINTS, CONFIG, EVENTS, METRICS, PIDFILE, STREAMS
from .run_lock import lock_holder, read_lock
from .run_reader import (
    Warnings,
    as_number,
    first_row,
    last_state,
    last_step_row,
    malformed,
    read_config,
    setting,
    total_steps,
)


@dataclass
class RunState:
    name: str
    path: Path
    state: str  # running | finished | stopped | crashed | created
    step: int = 0  # the highest step in metrics.jsonl within total_steps (last_step_row), never its last line
    total_steps: int | None = None  # run_reader.total_steps: the last `started` event's, else config.toml's
    last_event: str = ""
    started: float = 0.0  # when the run started (started_at): the runs list's order
    row: dict = field(default_factory=dict)  # the metrics row of `step`
    config: dict = field(default_factory=dict)  # config.toml (else setup.toml) as read_config reads it
    warnings: list[str] = field(default_factory=list)  # what could not be read, one line each ("FILE: why")


def state_of(run_dir: Path, last_state_event: str) -> str:
    """running / finished / stopped / crashed / created, from the lock and the last state event."""
    if lock_holder(run_dir) is not None:
        return "running"
    if last_state_event == "started":
        return "crashed"  # started but the process is gone without saying goodbye
    return last_state_event or "created"


def _odd_entries(run_dir: Path, warn: Warnings) -> None:
    """Say a lock that cannot be read and a checkpoints entry that is not a folder."""
    pidfile, checkpoints = run_dir / PIDFILE, run_dir / CHECKPOINTS
    try:
        if (pidfile.exists() or pidfile.is_symlink()) and read_lock(run_dir) is None:
            warn(f"{PIDFILE}: cannot be read (not a trainer's lock); read as no trainer holding the run")
        if checkpoints.exists() and not checkpoints.is_dir():
            warn(f"{CHECKPOINTS}: a file, not a folder; read as no checkpoints")
    except OSError:
        pass


def run_state(run_dir: Path) -> RunState:
    """A run's state (state_of its last state event), total steps (total_steps: the last `started` event's,
    else config.toml's) and highest step within them, read from the ends of events.jsonl and metrics.jsonl;
    malformed lines passed on the way are a warning naming their file, as the full readers say them."""
    run_dir = Path(run_dir)
    warn = Warnings()
    last, started, skipped_events = last_state(run_dir, warn)
    cfg = read_config(run_dir, warn)
    total = total_steps(started, cfg)
    row, skipped = last_step_row(run_dir / METRICS, warn, total)
    for name, n in ((EVENTS, skipped_events), (METRICS, skipped)):
        if n:
            warn(malformed(name, n))
    _odd_entries(run_dir, warn)
    return RunState(
        run_dir.name,
        run_dir,
        state_of(run_dir, last),
        row[schema.STEP] if row else 0,
        total,
        last,
        started=started_at(run_dir),
        row=row or {},
        config=cfg,
        warnings=list(warn),
    )


def started_at(run_dir: Path) -> float:
    """When the run started: the time of events.jsonl's first row (a resume appends, so it stays), else
    config.toml's modification time, else 0. Unlike the folder's mtime it does not move as the run writes."""
    started = as_number((first_row(run_dir / EVENTS) or {}).get("time"))
    return started if started is not None else _mtime(run_dir / CONFIG)


def _is_run(path: Path) -> bool:
    try:
        return path.is_dir() and ((path / CONFIG).exists() or (path / EVENTS).exists())
    except OSError:
        return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def list_runs(root: Path) -> list[RunState]:
    root = Path(root)
    try:
        dirs = [d for d in root.iterdir() if _is_run(d)]
    except OSError:
        return []
    return sorted(map(run_state, dirs), key=lambda st: (-st.started, st.name))  # newest first, then by name


def run_summaries(root: Path) -> list[dict]:
    """One row per run under `root` (list_runs' order: newest start first, then by name): what `grpo-studio
    runs` and the runs screen list; "warnings": what could not be read, one line each."""
    rows = []
    for st in list_runs(root):
        last, cfg = st.row, st.config
        rows.append(
            {
                "path": st.path,
                "name": st.name,
                "state": st.state,
                "step": st.step,
                "total": st.total_steps,
                "dtype": setting(cfg, "model", "dtype", str, "?"),
                "model": setting(cfg, "model", "name", str, "?"),
                "reward": as_number(last.get(schema.REWARD)),
                "k3": as_number(last.get(schema.K3)),
                "warnings": st.warnings,
            }
        )
    return rows


def held_run(run_dir: Path) -> str | None:
    """The run `run_dir` already holds, as "finished at step 6", or None when a new run may start there.
    A directory holds a run once a trainer has written its config.toml, a state event, a stream row or a
    checkpoint; what the studio writes before it launches (setup.toml, stdout.log) and the `info` lines of a
    trainer that stopped before it started do not count. The lock is not consulted: its holder is
    `lock_holder`'s question."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    last, started, _ = last_state(run_dir)
    checkpoints = run_dir / CHECKPOINTS
    if not (
        (run_dir / CONFIG).exists()
        or last
        or any(_size(run_dir / name) for name in STREAMS)
        or _has_entries(checkpoints)
    ):
        return None
    state = "crashed" if last == "started" else last or "created"  # started, and nobody holds it: it died
    row = last_step_row(run_dir / METRICS, total=total_steps(started, read_config(run_dir)))[0]
    step = row[schema.STEP] if row else 0
    return f"{state} at step {step}" if step or state != "created" else "created, no step yet"


def _has_entries(folder: Path) -> bool:
    try:
        return folder.is_dir() and any(folder.iterdir())
    except OSError:
        return True  # there, but unreadable: it may hold checkpoints


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def refuse_held_run(run_dir: Path) -> None:
    """A new run (no --resume) into a directory that already holds one: one UserError line."""
    held = held_run(run_dir)
    if held is not None:
        raise UserError(
            f"already holds a run ({held}); allowed: --resume {shlex.quote(str(Path(run_dir)))} to "
            f"continue it, or a new or empty directory",
            key="--run-dir",
            value=str(Path(run_dir)),
        )
