"""The tolerant readers of a run directory: every odd file is a warning and a best effort, never a traceback.

Used by `grpo-studio runs`, `report`, `doctor`, `attach`, the studio (studio/rundata.py), resume and export's
checkpoint listing. A reader never waits and never misleads. It takes complete lines only (a row being appended
is never half-read, even when it is already a whole JSON object) and:
- reads only regular files: a FIFO, a device, a socket or a link to one is judged before it is opened (and
  again once open, without blocking) and reads as empty, as does a file it cannot open (no permission, a folder
  where a file belongs, a symlink loop, an I/O error);
- reads a file as long as it was when opened, and at most MAX_READ_BYTES of it (a config MAX_TOML_BYTES);
- reads the streams in step order: rows out of order are put in place, a step written twice keeps its last row
  (in_step_order), and the runs list's row is the highest step's, never merely the last line (last_step_row);
- leaves out, in one line, stream rows whose step is beyond the run's total steps (within_total, total_steps);
- skips and counts every line that is not a JSON object with the fields its file needs (`parse_row`),
  a line longer than MAX_LINE_BYTES included, so one bad line never stops it;
- reads NaN, Infinity and numbers beyond a float's range as null (missing): JSON has none of them, and
  the writer writes non-finite values as null, so charts never receive one;
- reads config.toml that is not UTF-8, not TOML, or whose sections are not tables as what is left;
- finds a run's highest step and last state event from the end of its file (its last MAX_READ_BYTES at most).
What it could not read it says through `warn`, one line each, naming the file ("metrics.jsonl: cannot be
read (permission denied); read as empty"); commands print them as `warning: RUN/...` on stderr.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
import tomllib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from . import metrics as schema
from .errors import describe
from .run_files import CONFIG, EVENTS, HISTOGRAMS, METRICS, SAMPLES, SETUP, STATE_EVENTS

Warn = Callable[[str], None]
MAX_LINE_BYTES = 16 << 20  # a longer line is skipped (and counted) without being held in memory
CHUNK = 1 << 18  # reading from the end: this many bytes at a time
_FLOAT_MAX = int(sys.float_info.max)
_BIG = (re.compile(rb"[eE]\+?0*[1-9]\d{2}|\d{300}"), re.compile(r"[eE]\+?0*[1-9]\d{2}|\d{300}"))  # maybe beyond a float


class Warnings(list):
    """A `warn` that keeps each distinct line once, in order."""

    def __call__(self, line: str) -> None:
        if line not in self:
            self.append(line)


def printable(text: str) -> str:
    """`text` (a run's name, a config value) as it may be printed on one line of a terminal: control characters
    escaped (a newline as \\n, an escape sequence's ESC as \\x1b) and a name's bytes that are not UTF-8 as \\xNN."""
    if text.isprintable():
        return text
    return "".join(
        c
        if c.isprintable()
        else f"\\x{ord(c) - 0xDC00:02x}"
        if 0xDC80 <= ord(c) <= 0xDCFF  # a byte that is not UTF-8, as the file system gave it (surrogateescape)
        else ascii(c)[1:-1]
        for c in text
    )


def _say(warn: Warn | None) -> Warn:
    """`warn`, or a sink when there is none (a Warnings list is a `warn` even while empty)."""
    return warn if warn is not None else _ignore


def _ignore(line: str) -> None:
    pass


# ---- rows: what a reader accepts ----------------------------------------------------------------


def _is_step(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


ROW_CHECKS = {  # file -> the fields its readers rely on
    METRICS: lambda row: _is_step(row.get(schema.STEP)),
    SAMPLES: lambda row: _is_step(row.get(schema.STEP)) and isinstance(row.get("rewards", {}), dict),
    HISTOGRAMS: lambda row: (
        _is_step(row.get(schema.STEP)) and isinstance(row.get("edges"), list) and isinstance(row.get("counts"), list)
    ),
    EVENTS: lambda row: isinstance(row.get("event"), str) and as_number(row.get("time", 0.0)) is not None,
}


def _finite(value) -> tuple[object, int]:
    """`value` with every number beyond a float's range (or not finite) replaced by None, and how many."""
    if isinstance(value, float):
        return (value, 0) if math.isfinite(value) else (None, 1)
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, 0) if -_FLOAT_MAX <= value <= _FLOAT_MAX else (None, 1)
    if isinstance(value, dict):
        n = 0
        for key, item in value.items():
            value[key], k = _finite(item)
            n += k
        return value, n
    if isinstance(value, list):
        n = 0
        for i, item in enumerate(value):
            value[i], k = _finite(item)
            n += k
        return value, n
    return value, 0


def parse_line(name: str, line: bytes | str) -> tuple[dict | None, int]:
    """One line of the run directory's file `name` as readers take it: (the row, or None when it is not a
    JSON object with the fields that file needs; how many of its numbers were NaN, Infinity or beyond a
    float's range, read as None)."""
    odd = 0

    def constant(_name: str) -> None:  # NaN, Infinity, -Infinity: not JSON, read as null
        nonlocal odd
        odd += 1

    try:
        row = json.loads(line, parse_constant=constant)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or an integer of more than 4300 digits
        return None, 0
    if not isinstance(row, dict):
        return None, 0
    if _BIG[isinstance(line, str)].search(line):
        row, big = _finite(row)
        odd += big
    check = ROW_CHECKS.get(name)
    return (row, odd) if check is None or check(row) else (None, 0)


def parse_row(name: str, line: bytes | str) -> dict | None:
    """parse_line's row: a JSON object with the fields its file needs, non-finite numbers as None."""
    return parse_line(name, line)[0]


def as_number(value) -> float | None:
    """A row's value as a finite float, or None when it is not one (null, a string, a list, beyond range)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


# ---- files --------------------------------------------------------------------------------------

MAX_READ_BYTES = 1 << 30  # a reader takes at most this much of one file (a real run's metrics: 250,000 steps)
MAX_TOML_BYTES = 4 << 20  # config.toml and setup.toml are a few KiB
TAIL_BYTES = 1 << 18  # the runs list's last row: this much of a stream's end (and start) is checked for step order
READ_CHUNK = 1 << 20  # reading forward: this many bytes at a time
POLL_BYTES = 8 << 20  # following a file (JsonlTail): at most this many bytes a read (back-pressure)
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _why(err: OSError) -> str:
    if isinstance(err, IsADirectoryError):
        return "a folder, not a file"
    return err.strerror.lower() if err.strerror else describe(err)


def not_regular(path: Path, mode: int) -> str:
    """What `path` (of file mode `mode`, not a regular file) is: "a folder, not a file", "not a regular file
    (a FIFO)", "not a regular file (a link to a character device)"."""
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    link = "a link to " if os.path.islink(path) else ""
    return f"not a regular file ({link}{_KINDS.get(stat.S_IFMT(mode), 'not a file')})"


def _not_regular(path: Path, mode: int) -> str:
    """Why `path` (of file mode `mode`) is not read: "metrics.jsonl: not a regular file (a FIFO); read as empty"."""
    if stat.S_ISDIR(mode):
        return f"{path.name}: cannot be read (a folder, not a file); read as empty"
    return f"{path.name}: {not_regular(path, mode)}; read as empty"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def over_cap(name: str, size: int, part: str) -> str:
    return f"{name}: {_gib(size)}, over the {_gib(MAX_READ_BYTES)} a reader takes of a file; read its {part}"


def open_file(path: Path, warn: Warn | None = None, missing_ok: bool = True) -> BinaryIO | None:
    """`path` opened for reading bytes when it is a regular file (or a link to one), else None: absent (said only
    unless `missing_ok`), not a regular file (a FIFO, a device, a socket, a folder: never opened, so never waited
    on), or unreadable (said through `warn`: "NAME: cannot be read (permission denied); read as empty"). It is
    opened without blocking and checked again once open, so a file swapped for a FIFO meanwhile is not read."""
    path = Path(path)
    say = _say(warn)
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                os.set_blocking(fd, True)
                return os.fdopen(fd, "rb")
            os.close(fd)
    except FileNotFoundError:
        if not missing_ok:
            say(f"{path.name}: missing; read as empty")
        return None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the name
        say(f"{path.name}: cannot be read ({_why(err) if isinstance(err, OSError) else describe(err)}); read as empty")
        return None
    say(_not_regular(path, st.st_mode))
    return None


def read_bytes(path: Path, limit: int, warn: Warn | None = None) -> bytes | None:
    """A small regular file whole (trainer.pid, config.toml), or None: absent, not a regular file, unreadable,
    or longer than `limit` bytes (said through `warn`, as open_file says the rest)."""
    path = Path(path)
    fh = open_file(path, warn)
    if fh is None:
        return None
    with fh:
        try:
            data = fh.read(limit + 1)
        except OSError as err:
            _say(warn)(f"{path.name}: cannot be read ({_why(err)}); read as empty")
            return None
    if len(data) > limit:
        _say(warn)(f"{path.name}: over {limit} bytes, more than it ever holds; read as empty")
        return None
    return data


def _size(fh: BinaryIO) -> int:
    return os.fstat(fh.fileno()).st_size


def _lines_forward(fh: BinaryIO, end: int) -> Iterator[bytes | None]:
    """The complete lines of `fh` from the start up to byte `end` (its size when opened, at most MAX_READ_BYTES:
    what is appended meanwhile waits for the next read), None for a line over MAX_LINE_BYTES; the part after the
    last newline is being written and is left out. A file cut short meanwhile ends where it now ends."""
    pos, head, held, oversized = 0, [], 0, False  # head: the start of the line being gathered
    while pos < end:
        data = fh.read(min(READ_CHUNK, end - pos))
        if not data:
            return
        pos += len(data)
        start = 0
        while (newline := data.find(b"\n", start)) >= 0:
            piece = data[start : newline + 1]
            start = newline + 1
            if oversized or held + len(piece) > MAX_LINE_BYTES + 1:
                yield None
            else:
                yield b"".join((*head, piece)) if head else piece
            head, held, oversized = [], 0, False
        if start < len(data) and not oversized:
            head.append(data[start:])
            held += len(data) - start
            if held > MAX_LINE_BYTES:
                head, held, oversized = [], 0, True


def _lines_backward(fh: BinaryIO, end: int, budget: int) -> Iterator[bytes | None]:
    """The complete lines of `fh` from byte `end` backwards (None for a line over MAX_LINE_BYTES), reading CHUNK
    bytes at a time and at most `budget` bytes; the part after the last newline is being written and is left
    out, and so is a line that starts before the budget's first byte."""
    pos, floor = end, max(0, end - budget)
    tail, held, oversized, partial = [], 0, False, True  # tail: the end of the line being gathered, last first
    while pos > floor:
        n = min(CHUNK, pos - floor)
        pos -= n
        fh.seek(pos)
        data = fh.read(n)
        if len(data) < n:  # cut short meanwhile: what was read is all there is
            return
        pieces = data.split(b"\n")
        for i in range(len(pieces) - 1, -1, -1):
            if not oversized:
                tail.append(pieces[i])
                held += len(pieces[i])
                if held > MAX_LINE_BYTES:
                    tail, held, oversized = [], 0, True
            if i == 0:  # the line goes on before this chunk
                break
            if not partial:
                yield None if oversized else b"".join(reversed(tail)) + b"\n"
            tail, held, oversized, partial = [], 0, False, False
    if floor == 0 and not partial:
        yield None if oversized else b"".join(reversed(tail)) + b"\n"


class _Counts:
    """What a reader skipped in one file: malformed lines and non-finite numbers."""

    def __init__(self, name: str):
        self.name, self.skipped, self.odd = name, 0, 0

    def take(self, line: bytes | None) -> dict | None:
        if line is None:
            self.skipped += 1
            return None
        if not line.strip():
            return None
        row, odd = parse_line(self.name, line)
        self.skipped += row is None
        self.odd += odd
        return row

    def say(self, warn: Warn | None) -> None:
        if self.odd:
            _say(warn)(odd_numbers(self.name, self.odd))


def odd_numbers(name: str, n: int) -> str:
    return f"{name}: {n} numbers NaN, Infinity or beyond a float's range; read as missing"


def malformed(name: str, n: int) -> str:
    return f"{name}: skipped {n} malformed lines (not a JSON object with the fields the file needs)"


# ---- step order -----------------------------------------------------------------------------------

ONE_PER_STEP = (METRICS, HISTOGRAMS)  # the streams with one row per step (samples.jsonl has a step's G rows)


def disorder(name: str, moved: int, repeated: int) -> str:
    """The one line for rows of a stream read in step order rather than file order."""
    what = [f"{moved} rows out of step order"] * bool(moved) + [f"{repeated} rows repeating a step"] * bool(repeated)
    kept = "; a repeated step's last row kept" if repeated else ""
    return f"{name}: {' and '.join(what)}; read in step order{kept}"


def step_disorder(name: str, steps: Iterable[int]) -> tuple[int, int]:
    """(rows whose step is below an earlier row's, rows repeating an earlier row's step) of a stream's steps in
    file order; a step's G rows in samples.jsonl repeat nothing."""
    moved = repeated = top = 0
    seen: set[int] = set()
    for step in steps:
        if name in ONE_PER_STEP and step in seen:
            repeated += 1
        elif step < top:
            moved += 1
        seen.add(step)
        top = max(top, step)
    return moved, repeated


def in_step_order(name: str, rows: list[dict], warn: Warn | None = None) -> list[dict]:
    """A stream's rows (file order) in step order, as the writer appends them. Rows out of order (a file that was
    edited, concatenated or shuffled) are put in place and a step written twice keeps its last row (the later
    write is the newer record of that step, as in any append-only log), said in one line through `warn`. Other
    files' rows are returned as they are."""
    if name not in (*ONE_PER_STEP, SAMPLES):
        return rows
    moved, repeated = step_disorder(name, (row[schema.STEP] for row in rows))
    if not (moved or repeated):
        return rows
    _say(warn)(disorder(name, moved, repeated))
    if name in ONE_PER_STEP:
        rows = list({row[schema.STEP]: row for row in rows}.values())
    return sorted(rows, key=lambda row: row[schema.STEP])


# ---- reading a whole file, or its end -------------------------------------------------------------


def _read(path: Path, warn: Warn | None) -> tuple[list[dict], int]:
    """(every whole row of a JSONL file in file order, how many malformed lines were skipped); an unreadable
    file, non-finite numbers and the size cap are said through `warn`."""
    fh = open_file(path, warn)
    if fh is None:
        return [], 0
    counts = _Counts(path.name)
    with fh:
        try:
            size = _size(fh)
            if size > MAX_READ_BYTES:
                _say(warn)(over_cap(path.name, size, f"first {_gib(MAX_READ_BYTES)}"))
            rows = [row for row in map(counts.take, _lines_forward(fh, min(size, MAX_READ_BYTES))) if row is not None]
        except OSError as err:
            _say(warn)(f"{path.name}: cannot be read ({_why(err)}); read as empty")
            return [], 0
    counts.say(warn)
    return rows, counts.skipped


def read_rows(path: Path, warn: Warn | None = None, total: int | None = None) -> list[dict]:
    """Every whole row of a run directory's JSONL file up to MAX_READ_BYTES (malformed lines and a partial last
    line are skipped, as parse_row and JsonlTail skip them); a stream's rows within the run's `total` steps
    (within_total), in step order (in_step_order). What it could not read, skipped, left out or reordered is said
    through `warn`."""
    path = Path(path)
    rows, skipped = _read(path, warn)
    if skipped:
        _say(warn)(malformed(path.name, skipped))
    return in_step_order(path.name, within_total(path.name, rows, total, warn), warn)


def first_row(path: Path) -> dict | None:
    """The first line of a JSONL file as a row, when it is whole (ends in a newline) and well formed."""
    fh = open_file(path)
    if fh is None:
        return None
    with fh:
        try:
            line = next(_lines_forward(fh, min(_size(fh), MAX_LINE_BYTES + 1)), None)
        except OSError:
            return None
    return parse_row(Path(path).name, line) if line else None


def read_events(run_dir: Path, warn: Warn | None = None) -> list[dict]:
    return read_rows(Path(run_dir) / EVENTS, warn)


def _from_end(path: Path, last: Callable[[dict], bool], warn: Warn | None, budget: int):
    """Rows of a JSONL file read from its end, newest first, up to the first for which `last(row)` holds (or the
    file's start, or `budget` bytes): ([(row, its non-finite numbers)], malformed lines passed, the file's size)."""
    fh = open_file(path, warn)
    if fh is None:
        return [], 0, 0
    counts, rows, size = _Counts(path.name), [], 0
    with fh:
        try:
            size = _size(fh)
            for line in _lines_backward(fh, size, budget):
                odd = counts.odd
                row = counts.take(line)
                if row is not None:
                    rows.append((row, counts.odd - odd))
                    if last(row):
                        break
        except OSError as err:
            _say(warn)(f"{path.name}: cannot be read ({_why(err)}); read as empty")
    return rows, counts.skipped, size


def rows_from_end(path: Path, last: Callable[[dict], bool], warn: Warn | None = None) -> tuple[list[dict], int]:
    """Rows of a JSONL file read from its end, newest first, up to the first for which `last(row)` holds (or
    the file's start, or MAX_READ_BYTES): (the rows, how many malformed lines were passed on the way)."""
    path = Path(path)
    pairs, skipped, size = _from_end(path, last, warn, MAX_READ_BYTES)
    if size > MAX_READ_BYTES and not (pairs and last(pairs[-1][0])):
        _say(warn)(over_cap(path.name, size, f"last {_gib(MAX_READ_BYTES)}"))
    odd = sum(n for _, n in pairs)
    if odd:
        _say(warn)(odd_numbers(path.name, odd))
    return [row for row, _ in pairs], skipped


def total_steps(started: object, cfg: dict) -> int | None:
    """A run's total steps: its last `started` event's total_steps, else config.toml's train.steps (a run still
    loading, or one whose events.jsonl cannot be read); None when neither is a positive integer. The runs list,
    report, doctor and the studio all take it from here."""
    for value in (started, setting(cfg, "train", "steps", int)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def beyond_total(name: str, n: int, total: int) -> str:
    """The one line for rows of a stream whose step is beyond the run's total steps."""
    return f"{name}: {n} rows with a step beyond the run's {total} steps; left out"


def within_total(name: str, rows: list[dict], total: int | None, warn: Warn | None = None) -> list[dict]:
    """A stream's rows without those whose step is beyond the run's `total` steps (a row appended by hand, or a
    step of 10**30), said in one line: no reader shows one as the run's state or charts it."""
    if total is None or name not in (*ONE_PER_STEP, SAMPLES):
        return rows
    kept = [row for row in rows if row[schema.STEP] <= total]
    if len(kept) < len(rows):
        _say(warn)(beyond_total(name, len(rows) - len(kept), total))
    return kept


def _head(path: Path, end: int) -> tuple[list[dict], int]:
    """(the whole rows of a file's first `end` bytes, the malformed lines among them)."""
    fh = open_file(path)
    if fh is None:
        return [], 0
    counts = _Counts(path.name)
    with fh:
        try:
            rows = [row for row in map(counts.take, _lines_forward(fh, end)) if row is not None]
        except OSError:
            return [], 0
    return rows, counts.skipped


def last_step_row(path: Path, warn: Warn | None = None, total: int | None = None) -> tuple[dict | None, int]:
    """The row of a stream's highest step (metrics.jsonl, histograms.jsonl) within the run's `total` steps
    (within_total), never merely its last line, and how many malformed lines its reading passed. A file of at
    most TAIL_BYTES is read whole; a longer one by its last TAIL_BYTES and its first (up to TAIL_BYTES more),
    and whole (up to MAX_READ_BYTES) when those are out of step order together (a row out of order at the start
    or in the tail, a file concatenated in the wrong order), repeat a step, or hold no whole row within `total`.
    The writer only appends, in step order, so a file it wrote passes with its two ends read; a row moved into
    the middle of a long file by hand is the one disorder this misses (report and doctor read the whole file).
    The warnings are the full readers' lines. Only the returned row's non-finite numbers are said."""
    path = Path(path)
    pairs, skipped, size = _from_end(path, lambda row: False, warn, TAIL_BYTES)
    pairs.reverse()
    if size > TAIL_BYTES:
        head, head_skipped = _head(path, min(TAIL_BYTES, size - TAIL_BYTES))
        steps = [row[schema.STEP] for row in head] + [row[schema.STEP] for row, _ in pairs]
        if any(step_disorder(path.name, steps)) or not within_total(path.name, [row for row, _ in pairs], total):
            rows, skipped = _read(path, warn)
            pairs = [(row, 0) for row in rows]
        else:
            skipped += head_skipped
    odd = {row[schema.STEP]: n for row, n in pairs}  # a repeated step: its last row's
    rows = within_total(path.name, [row for row, _ in pairs], total, warn)
    rows = in_step_order(path.name, rows, warn)
    if rows and odd[rows[-1][schema.STEP]]:
        _say(warn)(odd_numbers(path.name, odd[rows[-1][schema.STEP]]))
    return (rows[-1] if rows else None), skipped


def last_metrics_row(run_dir: Path, warn: Warn | None = None) -> dict | None:
    """The metrics row of the run's highest step (last_step_row)."""
    return last_step_row(Path(run_dir) / METRICS, warn)[0]


def last_state(run_dir: Path, warn: Warn | None = None) -> tuple[str, object, int]:
    """From the end of events.jsonl: (the last state event's name or "", the total_steps of the last `started`
    as written (total_steps judges it), how many malformed lines were passed on the way)."""
    rows, skipped = rows_from_end(Path(run_dir) / EVENTS, lambda row: row["event"] == "started", warn)
    states = [row["event"] for row in rows if row["event"] in STATE_EVENTS]
    total = next((row.get("total_steps") for row in rows if row["event"] == "started"), None)
    return (states[0] if states else ""), total, skipped


# ---- config -------------------------------------------------------------------------------------


def read_toml(path: Path, warn: Warn | None = None) -> dict | None:
    """A run directory's TOML file as a dict of tables, or None when it is absent or unreadable. A
    top-level key that is not a table is left out, and said."""
    path = Path(path)
    data = read_bytes(path, MAX_TOML_BYTES, warn)
    if data is None:
        return None
    say = _say(warn)
    try:
        data = tomllib.loads(data.decode())
    except (ValueError, RecursionError) as err:  # not UTF-8, not TOML, an integer of 4300 digits, deep nesting
        reason = describe(err) if isinstance(err, UnicodeDecodeError) else f"not TOML ({err})"
        say(f"{path.name}: {reason}; its settings are not shown")
        return None
    for key in [k for k, v in data.items() if not isinstance(v, dict)]:
        say(f"{path.name}: {key} = {_show(data.pop(key))} is not a [{key}] table; left out")
    return data


def _show(value) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def read_config(run_dir: Path, warn: Warn | None = None) -> dict:
    """The run's resolved config.toml, else the setup.toml the studio wrote before launch, else {}."""
    for name in (CONFIG, SETUP):
        data = read_toml(Path(run_dir) / name, warn)
        if data is not None:
            return data
    return {}


def setting(cfg: dict, section: str, key: str, kind: type | tuple[type, ...], default=None):
    """cfg[section][key] when it has the type `kind` (a bool is not a number), else `default`."""
    table = cfg.get(section)
    value = table.get(key, default) if isinstance(table, dict) else default
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        return default
    return value if isinstance(value, kind) else default


# ---- following a file as it grows ---------------------------------------------------------------


class JsonlTail:
    """Incrementally reads complete lines appended to a run directory's JSONL file, at most POLL_BYTES a read
    and MAX_READ_BYTES in all (partial last lines wait; one over MAX_LINE_BYTES is skipped). Lines that `parse_row` refuses are skipped and counted in
    `skipped`, non-finite numbers (read as None) in `odd`; a file that cannot be read is said once in
    `warnings`. When the file was rewritten (a resume cut it) the tail starts over and `restarted` is True
    after that read."""

    def __init__(self, path: Path, max_rows: int = 5000):
        self.path = Path(path)
        self.offset = 0
        self._partial = b""
        self._oversized = False
        self._inode: int | None = None
        self.max_rows = max_rows
        self.skipped = 0
        self.odd = 0
        self.restarted = False
        self.pending = 0  # bytes on disk the last read left for the next (POLL_BYTES a poll)
        self.warnings = Warnings()

    def read_new(self) -> list[dict]:
        self.restarted = False
        fh = open_file(self.path, self.warnings)
        if fh is None:
            self.pending = 0
            return []
        try:
            with fh:
                st = os.fstat(fh.fileno())
                if st.st_size < self.offset or self._inode not in (None, st.st_ino):  # rewritten: start over
                    self.offset, self._partial, self._oversized = 0, b"", False
                    self.skipped, self.odd, self.restarted = 0, 0, True
                self._inode = st.st_ino
                end = min(st.st_size, MAX_READ_BYTES)
                if st.st_size > MAX_READ_BYTES:
                    self.warnings(over_cap(self.path.name, st.st_size, f"first {_gib(MAX_READ_BYTES)}"))
                fh.seek(self.offset)
                chunk = fh.read(max(0, min(end - self.offset, POLL_BYTES)))
        except OSError as err:
            self.warnings(f"{self.path.name}: cannot be read ({_why(err)}); read as empty")
            self.pending = 0
            return []
        self.offset += len(chunk)
        self.pending = max(0, end - self.offset) if chunk else 0  # 0: cut short meanwhile, read again next poll
        if self._oversized:  # the rest of a line that was too long: skip it, and count it at its end
            end_of_line = chunk.find(b"\n")
            if end_of_line < 0:
                return []
            chunk, self.skipped, self._oversized = chunk[end_of_line + 1 :], self.skipped + 1, False
        last = chunk.rfind(b"\n")
        if last < 0:  # no line ends here: gather it, unless it is already too long to keep
            if len(self._partial) + len(chunk) > MAX_LINE_BYTES:
                self._partial, self._oversized = b"", True
            else:
                self._partial += chunk
            return []
        lines = (self._partial + chunk[:last]).split(b"\n")
        self._partial = chunk[last + 1 :]
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial, self._oversized = b"", True
        rows = []
        for line in lines[-self.max_rows :] if len(lines) > self.max_rows else lines:
            if len(line) > MAX_LINE_BYTES:  # ended in this chunk, yet too long: skipped, as the other readers do
                self.skipped += 1
            elif line.strip():
                row, odd = parse_line(self.path.name, line)
                self.odd += odd
                if row is None:
                    self.skipped += 1
                else:
                    rows.append(row)
        return rows
