"""The tolerant readers of a run directory: every odd file is a warning and a best effort, never a traceback.

Used by `grpo-studio runs`, `report`, `attach`, the studio (studio/rundata.py) and resume. A reader takes
complete lines only (a row being appended is never half-read) and:
- reads a file it cannot open (no permission, a folder where a file belongs, an I/O error) as empty;
- skips and counts every line that is not a JSON object with the fields its file needs (`parse_row`),
  a line longer than MAX_LINE_BYTES included, so one bad line never stops it;
- reads NaN, Infinity and numbers beyond a float's range as null (missing): JSON has none of them, and
  the writer writes non-finite values as null, so charts never receive one;
- reads config.toml that is not UTF-8, not TOML, or whose sections are not tables as what is left;
- finds a run's last row and last state event from the end of its file, however long it is.
What it could not read it says through `warn`, one line each, naming the file ("metrics.jsonl: cannot be
read (permission denied); read as empty"); commands print them as `warning: RUN/...` on stderr.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from grpo_studio.contract import metrics as schema
from grpo_studio.contract.errors import describe
from grpo_studio.contract.run_files import CONFIG, EVENTS, HISTOGRAMS, METRICS, SAMPLES, SETUP, STATE_EVENTS

Warn = Callable[[str], None]
MAX_LINE_BYTES = 16 << 20  # a longer line is skipped (and counted) without being held in memory
CHUNK = 1 << 16  # reading from the end: this many bytes at a time
_FLOAT_MAX = int(sys.float_info.max)
_BIG = (re.compile(rb"[eE]\+?0*[1-9]\d{2}|\d{300}"), re.compile(r"[eE]\+?0*[1-9]\d{2}|\d{300}"))  # maybe beyond a float


class Warnings(list):
    """A `warn` that keeps each distinct line once, in order."""

    def __call__(self, line: str) -> None:
        if line not in self:
            self.append(line)


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


def _why(err: OSError) -> str:
    if isinstance(err, IsADirectoryError):
        return "a folder, not a file"
    return err.strerror.lower() if err.strerror else describe(err)


def open_file(path: Path, warn: Warn | None = None, missing_ok: bool = True) -> BinaryIO | None:
    """`path` opened for reading bytes, or None: absent (said only unless `missing_ok`), or unreadable
    (said through `warn`: "NAME: cannot be read (permission denied); read as empty")."""
    path = Path(path)
    try:
        return open(path, "rb")
    except FileNotFoundError:
        if not missing_ok:
            _say(warn)(f"{path.name}: missing; read as empty")
        return None
    except OSError as err:
        _say(warn)(f"{path.name}: cannot be read ({_why(err)}); read as empty")
        return None


def _lines_forward(fh: BinaryIO) -> Iterator[bytes | None]:
    """The complete lines of `fh` from the start (None for a line over MAX_LINE_BYTES); the part after
    the last newline is being written and is left out."""
    while True:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line.endswith(b"\n"):
            if len(line) <= MAX_LINE_BYTES:
                return  # the end: nothing, or a line being written
            while line and not line.endswith(b"\n"):  # an oversized line: skip the rest of it
                line = fh.readline(MAX_LINE_BYTES)
            if not line:
                return
            yield None
            continue
        yield line


def _lines_backward(fh: BinaryIO) -> Iterator[bytes | None]:
    """The complete lines of `fh` from the end (None for a line over MAX_LINE_BYTES), reading CHUNK bytes
    at a time; the part after the last newline is left out."""
    pos = os.fstat(fh.fileno()).st_size
    carry, partial, oversized = b"", True, False
    while pos > 0:
        n = min(CHUNK, pos)
        pos -= n
        fh.seek(pos)
        data = fh.read(n)
        pieces = (data + carry).split(b"\n")
        carry = pieces[0]
        for piece in reversed(pieces[1:]):
            if partial:  # after the last newline: being written
                partial = oversized = False
                continue
            yield None if oversized else piece + b"\n"
            oversized = False
        if len(carry) > MAX_LINE_BYTES:
            carry, oversized = b"", True
    if not partial:
        yield None if oversized else carry + b"\n"


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


def read_rows(path: Path, warn: Warn | None = None) -> list[dict]:
    """Every whole row of a run directory's JSONL file, however long (malformed lines and a partial last
    line are skipped, as parse_row and JsonlTail skip them; said through `warn`, as an unreadable file is)."""
    path = Path(path)
    fh = open_file(path, warn)
    if fh is None:
        return []
    counts = _Counts(path.name)
    with fh:
        try:
            rows = [row for row in map(counts.take, _lines_forward(fh)) if row is not None]
        except OSError as err:
            _say(warn)(f"{path.name}: cannot be read ({_why(err)}); read as empty")
            return []
    if counts.skipped:
        _say(warn)(malformed(path.name, counts.skipped))
    counts.say(warn)
    return rows


def read_events(run_dir: Path, warn: Warn | None = None) -> list[dict]:
    return read_rows(Path(run_dir) / EVENTS, warn)


def rows_from_end(path: Path, last: Callable[[dict], bool], warn: Warn | None = None) -> tuple[list[dict], int]:
    """Rows of a JSONL file read from its end, newest first, up to the first for which `last(row)` holds (or
    the file's start): (the rows, how many malformed lines were passed on the way)."""
    path = Path(path)
    fh = open_file(path, warn)
    if fh is None:
        return [], 0
    counts, rows = _Counts(path.name), []
    with fh:
        try:
            for line in _lines_backward(fh):
                row = counts.take(line)
                if row is not None:
                    rows.append(row)
                    if last(row):
                        break
        except OSError as err:
            _say(warn)(f"{path.name}: cannot be read ({_why(err)}); read as empty")
    counts.say(warn)
    return rows, counts.skipped


def last_row(path: Path, warn: Warn | None = None) -> tuple[dict | None, int]:
    """The last whole row of a JSONL file and how many malformed lines follow it."""
    rows, skipped = rows_from_end(path, lambda row: True, warn)
    return (rows[0] if rows else None), skipped


def last_metrics_row(run_dir: Path, warn: Warn | None = None) -> dict | None:
    return last_row(Path(run_dir) / METRICS, warn)[0]


def last_state(run_dir: Path, warn: Warn | None = None) -> tuple[str, int | None, int]:
    """From the end of events.jsonl: (the last state event's name or "", the total_steps of the last
    `started`, how many malformed lines were passed on the way)."""
    rows, skipped = rows_from_end(Path(run_dir) / EVENTS, lambda row: row["event"] == "started", warn)
    states = [row["event"] for row in rows if row["event"] in STATE_EVENTS]
    total = next((row.get("total_steps") for row in rows if row["event"] == "started"), None)
    total = total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None
    return (states[0] if states else ""), total, skipped


# ---- config -------------------------------------------------------------------------------------


def read_toml(path: Path, warn: Warn | None = None) -> dict | None:
    """A run directory's TOML file as a dict of tables, or None when it is absent or unreadable. A
    top-level key that is not a table is left out, and said."""
    path = Path(path)
    fh = open_file(path, warn)
    if fh is None:
        return None
    say = _say(warn)
    try:
        with fh:
            data = tomllib.loads(fh.read().decode())
    except OSError as err:
        say(f"{path.name}: cannot be read ({_why(err)}); read as empty")
        return None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
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
    """Incrementally reads complete lines appended to a run directory's JSONL file (partial last lines
    wait; one over MAX_LINE_BYTES is skipped). Lines that `parse_row` refuses are skipped and counted in
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
        self.warnings = Warnings()

    def read_new(self) -> list[dict]:
        self.restarted = False
        fh = open_file(self.path, self.warnings)
        if fh is None:
            return []
        try:
            with fh:
                st = os.fstat(fh.fileno())
                if st.st_size < self.offset or self._inode not in (None, st.st_ino):  # rewritten: start over
                    self.offset, self._partial, self._oversized = 0, b"", False
                    self.skipped, self.odd, self.restarted = 0, 0, True
                self._inode = st.st_ino
                fh.seek(self.offset)
                chunk = fh.read(max(0, min(st.st_size - self.offset, 8 << 20)))  # back-pressure: 8 MiB a poll
        except OSError as err:
            self.warnings(f"{self.path.name}: cannot be read ({_why(err)}); read as empty")
            return []
        self.offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if lines and self._oversized:  # the rest of a line that was too long: skip it, and count it
            del lines[0]
            self.skipped, self._oversized = self.skipped + 1, False
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial, self._oversized = b"", True
        rows = []
        for line in lines[-self.max_rows :] if len(lines) > self.max_rows else lines:
            if line.strip():
                row, odd = parse_line(self.path.name, line)
                self.odd += odd
                if row is None:
                    self.skipped += 1
                else:
                    rows.append(row)
        return rows
