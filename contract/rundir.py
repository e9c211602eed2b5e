"""The run directory: the seam between the engine (writer) and the studio (reader). This module is the
writer: RunWriter appends the trainer's rows and takes the lock; record_exit writes the goodbye of a
trainer that died without one.

The run directory's modules, lowest first (see docs/design.md, "The run directory"):
    run_files   the file names, and how a whole file is written (atomic_write_text)
    run_reader  the tolerant readers: parse_row, read_rows, rows from a file's end, JsonlTail, read_config
    run_lock    trainer.pid: which live trainer holds a run directory
    run_state   a run's state (state_of, run_state), the runs list, held_run
    rundir      the writer (this module)

Pure python, no torch. Every append is flushed and fsync'ed; whole files are written atomically (tmp +
rename). Names importers outside the contract still take from here: the file names, RUNS, STDOUT,
atomic_write_text, as_number, read_rows, JsonlTail, RunLock, list_runs, run_summaries, run_state.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import stat
import sys
import time
from pathlib import Path

from . import metrics as schema
from .errors import UserError
from .run_files import (  # noqa: F401  (CONFIG, RUNS, STDOUT, atomic_write_text: importers)
    CHECKPOINTS,
    CONFIG,
    EVENTS,
    HISTOGRAMS,
    METRICS,
    PIDFILE,
    RUNS,
    SAMPLES,
    STATE_EVENTS,
    STDOUT,
    STREAMS,
    atomic_write_text,
)
from .run_lock import (  # noqa: F401  (RunLock: importers)
    Lock,
    RunLock,
    in_use,
    lock_holder,
    read_lock,
    read_pid,
    stale_reason,
    write_lock,
)
from .run_reader import (  # noqa: F401  (as_number, read_rows, JsonlTail: importers)
    JsonlTail,
    as_number,
    last_metrics_row,
    not_regular,
    open_file,
    parse_row,
    read_events,
    read_rows,
)
from .run_state import (  # noqa: F401  (list_runs, run_summaries, run_state: importers)
    list_runs,
    refuse_held_run,
    run_state,
    run_summaries,
)


def _clean(value):
    """JSON has no NaN/inf: write them as null so every reader can parse every line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


WRITTEN = (*STREAMS, EVENTS, CONFIG, STDOUT)  # what a trainer appends to or replaces in its run directory


def refuse_odd_entries(run_dir: Path) -> None:
    """What a trainer would write into but cannot is one UserError line naming it, before anything is written
    (and, from `grpo-studio train`, before anything loads): a trainer.pid that is a folder, a checkpoints entry
    that is a file, and a file it appends to or replaces (WRITTEN) that is not a regular file or a link to one:
    a folder, a FIFO (an append blocks, or fails as not seekable), a device, a socket, a link to one of those,
    a link to nothing or a link loop."""
    odd_entries = [
        (PIDFILE, Path.is_dir, "a folder, not a trainer's lock"),
        (CHECKPOINTS, lambda p: p.exists() and not p.is_dir(), "a file, not a folder"),
    ]
    for name, odd, what in odd_entries:
        if odd(run_dir / name):
            _refuse(run_dir / name, what)
    for name in WRITTEN:
        path = run_dir / name
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            if os.path.islink(path):
                _refuse(path, "a link to nothing")
            continue
        except OSError as err:  # a link loop, a folder that may not be looked into
            _refuse(path, err.strerror.lower() if err.strerror else str(err))
        if not stat.S_ISREG(mode):
            _refuse(path, not_regular(path, mode))


def _refuse(path: Path, what: str) -> None:
    raise UserError(f"{path}: {what}; move it away, then start the trainer again", kind="run")


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
        lock is taken and again once it is held (a run that ended meanwhile). An entry it cannot write into
        (refuse_odd_entries: a FIFO as a stream, a trainer.pid that is a folder) is refused too (UserError).
        A refused trainer writes nothing into the directory."""
        refuse_odd_entries(self.dir)
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
            self.event(
                "stale_lock", f"took over the stale lock of trainer pid {old.pid}: {stale_reason(old)}", pid=old.pid
            )

    def release(self) -> None:
        if read_pid(self.dir) == os.getpid():
            (self.dir / PIDFILE).unlink(missing_ok=True)
        self.close()

    def abandon(self) -> None:
        """A new run refused while it loaded: remove what this trainer wrote (config.toml, events, streams, the
        empty checkpoints folder), release the lock, and remove the directory when nothing else is left in it
        (the studio's setup.toml and stdout.log stay), so the directory takes a new run again."""
        self.close()
        for name in (CONFIG, EVENTS, *STREAMS):
            (self.dir / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # only an empty one
            (self.dir / CHECKPOINTS).rmdir()
        self.release()
        with contextlib.suppress(OSError):
            self.dir.rmdir()

    def close(self) -> None:
        for fh in self._files.values():
            with contextlib.suppress(OSError):  # a write already failed (disk full) and said so
                fh.close()
        self._files.clear()

    def _append(self, name: str, *rows: dict) -> None:
        """Append `rows` to the stream `name`, then flush and fsync once."""
        fh = self._files.get(name)
        if fh is None:
            fh = self._files[name] = open(self.dir / name, "a+b")
            if fh.tell():  # a writer killed mid-line left a torn last line: end it, so ours stays whole
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    fh.write(b"\n")
        fh.write(b"".join(json.dumps(_clean(row), separators=(",", ":")).encode() + b"\n" for row in rows))
        fh.flush()
        os.fsync(fh.fileno())

    def metrics(self, row: dict) -> None:
        """Append one row; a name missing from the metric schema raises UnknownMetric."""
        schema.check_row(row)
        self._append(METRICS, row)

    def samples(self, rows: list[dict]) -> None:
        self._append(SAMPLES, *rows)  # one fsync for the step's rows (one per row: 0.4 s of a 64-row step)

    def histogram(self, row: dict) -> None:
        self._append(HISTOGRAMS, row)

    def event(self, kind: str, message: str = "", **extra) -> None:
        self._append(EVENTS, {"time": time.time(), "event": kind, "message": message, **extra})

    def cut_streams(self, step: int) -> dict[str, dict[str, int]]:
        """On resume: keep the stream rows of steps 1..`step` (the checkpoint the run continues from) and
        drop every line a reader would skip, in the streams and in events.jsonl, and all but the last row of a
        step in the streams of one row per step (metrics, histograms: the row the readers show), so the run goes
        on as one stream of whole rows, each step once. Returns {file: {"past": n, "malformed": m, "repeated": r}}
        for the files that lost lines. A stream that is not a regular file (a FIFO, a device) or cannot be read
        is one line: a resume must read it whole and rewrite it."""
        dropped = {}
        for name in (*STREAMS, EVENTS):
            path = self.dir / name
            if not os.path.lexists(path):
                continue
            why: list[str] = []
            src = open_file(path, why.append)
            if src is None:
                raise UserError(
                    f"{path}: {why[0].split(': ', 1)[-1].removesuffix('; read as empty')}; a resume rewrites it",
                    kind="run",
                )
            tmp, past, malformed, repeated = path.with_name(f".{name}.tmp"), 0, 0, 0
            with src, open(tmp, "wb") as kept:  # line by line: samples can be large
                last = self._last_line_of_each_step(src, name) if name in (METRICS, HISTOGRAMS) else None
                for n, line in enumerate(src):
                    row = parse_row(name, line)
                    if row is None:
                        malformed += 1 if line.strip() else 0
                    elif name != EVENTS and row[schema.STEP] > step:
                        past += 1
                    elif last is not None and last[row[schema.STEP]] != n:
                        repeated += 1
                    else:
                        kept.write(line if line.endswith(b"\n") else line + b"\n")
                if past or malformed or repeated:
                    kept.flush()
                    os.fsync(kept.fileno())
            if not (past or malformed or repeated):
                tmp.unlink()
                continue
            fh = self._files.pop(name, None)
            if fh is not None:  # it is about to be replaced: the next append opens the new file
                fh.close()
            os.replace(tmp, path)
            dropped[name] = {"past": past, "malformed": malformed, "repeated": repeated}
        return dropped

    @staticmethod
    def _last_line_of_each_step(src, name: str) -> dict[int, int]:
        """{step: the index of its last row's line} of an open stream, which is then read again from its start."""
        last = {}
        for n, line in enumerate(src):
            row = parse_row(name, line)
            if row is not None:
                last[row[schema.STEP]] = n
        src.seek(0)
        return last


def detach_output(run_dir: Path) -> None:
    """SIGHUP (the terminal closed) to `grpo-studio train` or its trainer: the run goes on detached, and this
    process's stdout and stderr, where they were a terminal or a pipe, go on into RUN/stdout.log (appended; /dev/null
    when that cannot be opened), so no write fails on the closed terminal. Output already going to a file stays."""
    try:
        fd = os.open(Path(run_dir) / STDOUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    for out in (1, 2):
        with contextlib.suppress(OSError):  # a closed descriptor is replaced as well
            if stat.S_ISREG(os.fstat(out).st_mode):
                continue
        os.dup2(fd, out)
    os.close(fd)


class _DetachingStream:
    """sys.stdout or sys.stderr of `grpo-studio train`: a write or flush that fails because the terminal is gone
    without a SIGHUP reaching this process (EIO: a background job's terminal closed; EPIPE, ENXIO: the reader of
    its pipe went away) detaches as a hang-up does (detach_output) and is made again, into RUN/stdout.log."""

    LOST = (errno.EIO, errno.EPIPE, errno.ENXIO)

    def __init__(self, stream, run_dir: Path):
        self._stream, self._run_dir = stream, run_dir

    def _again(self, call, *args):
        try:
            return call(*args)
        except OSError as err:
            if err.errno not in self.LOST:
                raise
            detach_output(self._run_dir)
            return call(*args)

    def write(self, text: str) -> int:
        return self._again(self._stream.write, text)

    def flush(self) -> None:
        self._again(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def terminal_loss_detaches(run_dir: Path):
    """sys.stdout and sys.stderr detach into RUN/stdout.log when their terminal or pipe is gone (_DetachingStream),
    for the duration of the block; put back after it."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (_DetachingStream(stream, Path(run_dir)) for stream in saved)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def record_exit(run_dir: Path, pid: int, returncode: int) -> str | None:
    """The goodbye of trainer `pid` when it died without one (os._exit in a reward function, SIGKILL from
    the OOM killer): if its `started` is the run's last state event, or it died holding the lock (while it
    loaded: a trainer that refuses releases it), append `crashed` naming the exit status or signal; remove its
    lock if it left one. Returns the crashed message, or None if it had said goodbye."""
    lock = read_lock(run_dir)
    died_holding = lock is not None and lock.pid == pid
    if died_holding:
        if stale_reason(lock) is None:  # the named trainer lives (a refused trainer under torchrun names the holder)
            return None
        (Path(run_dir) / PIDFILE).unlink(missing_ok=True)
    events = [e for e in read_events(run_dir) if e["event"] in STATE_EVENTS]
    started = bool(events) and events[-1]["event"] == "started" and events[-1].get("pid") == pid
    if not (started or died_holding):
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
    when = f"after step {step}" if started else "while it loaded, before its first step"
    message = f"trainer pid {pid} {how} {when}, without saying goodbye"
    writer = RunWriter(run_dir)
    writer.event("crashed", message, step=step, pid=pid, **extra)
    writer.close()
    return message
