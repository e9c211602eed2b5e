"""An index of samples.jsonl: where each row starts, with the few numbers the Samples tab's filters pick and sort
on, so the tab pages through every row and searches the whole file while holding about 25 bytes a row.

`update()` reads what the trainer appended since the last call (complete lines only, at most `poll_bytes` a call,
like run_reader.JsonlTail): each line is parsed once (run_reader.parse_line, so the same lines are skipped and
counted) and kept as its offset, length, step, advantage, truncation flag and group. A partial last line waits for
its end. A file rewritten underneath (a resume cut it; truncated; replaced by another file or by something that is
not a regular file) starts the index over: `generation` counts those restarts, so a search begun before one is
known stale. `row(i)` reads one row back by its offset; `search()` streams the file and confirms each hit by
parsing its row. Files only: no torch, no UI."""

from __future__ import annotations

import bisect
import json
import os
import stat
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path

from .config_bounds import MAX_STEPS
from .diagnosis import FLAT  # the doctor's zero-variance test (diagnosis.no_signal): every advantage within FLAT of 0
from .metrics import STEP
from .run_files import SAMPLES
from .run_reader import (
    MAX_LINE_BYTES,
    MAX_READ_BYTES,
    ROW_CHECKS,
    Warnings,
    _finite,
    _why,
    as_number,
    open_file,
    parse_line,
)

POLL_BYTES = 2 << 20  # read per update(): about 0.1 s of parsing on one core; a 100 MB backlog takes 48 polls
SEARCH_BLOCK = 8 << 20  # search() reads the file this much at a time
MAX_HITS = 10_000  # search() stops here; the tab then says "10,000+"
TRUNCATED = 1  # flags: ran to max_completion_len (an episode stopped by length counts too)


def group_key(row: dict) -> tuple:
    """The group a row belongs to: one prompt's completions of one step."""
    return row.get(STEP), row.get("group"), row.get("prompt")


class SamplesIndex:
    def __init__(self, path, poll_bytes: int = POLL_BYTES):
        self.path = Path(path)
        self.poll_bytes = poll_bytes
        self.generation = 0  # bumped by every restart: row ids of an older generation mean nothing now
        self.max_step: int | None = None  # rows of a later step are left out, counted in `beyond`
        self.warnings = Warnings()
        self._clear()

    def _clear(self) -> None:
        self.offset = 0  # bytes indexed: every row ends before it
        self.offsets, self.lengths = array("q"), array("i")  # a line is at most MAX_LINE_BYTES
        self.steps, self.advantages, self.flags = array("q"), array("f"), array("b")  # f: enough to sort on
        self.group_ids = array("i")  # into _group_rows / _group_flat, one entry per (step, group, prompt)
        self._groups: dict[int, int] = {}  # hash(group_key) -> group id
        self._group_rows, self._group_flat = array("i"), array("i")
        self._inode: int | None = None
        self._skip_to_line_end = False  # inside a line longer than MAX_LINE_BYTES
        self.skipped = self.odd = self.beyond = 0
        self.restarted = False
        self.pending = 0  # bytes on disk the last update left for the next

    def __len__(self) -> int:
        return len(self.offsets)

    # ---- indexing ---------------------------------------------------------------------------
    def update(self) -> int:
        """Index the complete lines appended since the last call (at most poll_bytes of them); how many rows."""
        self.restarted = False
        fh = open_file(self.path, self.warnings)
        if fh is None:  # gone, or replaced by a FIFO or a folder: nothing of the old file holds
            if self.offset:
                self._restart()
            self.pending = 0
            return 0
        try:
            with fh:
                st = os.fstat(fh.fileno())
                if self._rewritten(fh, st):
                    self._restart()
                self._inode = st.st_ino
                end = min(st.st_size, MAX_READ_BYTES)
                fh.seek(self.offset)
                chunk = fh.read(max(0, min(end - self.offset, self.poll_bytes)))
                if chunk and b"\n" not in chunk:  # a line longer than a poll: read on to its end, or past the cap
                    chunk += fh.read(max(0, min(end - self.offset, MAX_LINE_BYTES + 1) - len(chunk)))
        except OSError as err:
            self.warnings(f"{SAMPLES}: cannot be read ({_why(err)}); read as empty")
            self.pending = 0
            return 0
        self.pending = max(0, end - self.offset - len(chunk)) if chunk else 0
        return self._index(chunk)

    def _rewritten(self, fh, st: os.stat_result) -> bool:
        """Another file, a shorter one, or one whose byte before `offset` is no longer the end of a line."""
        if self._inode not in (None, st.st_ino) or st.st_size < self.offset:
            return True
        if not self.offset or self._skip_to_line_end or not stat.S_ISREG(st.st_mode):
            return False
        fh.seek(self.offset - 1)
        return fh.read(1) != b"\n"

    def _restart(self) -> None:
        self._clear()
        self.generation += 1
        self.restarted = True

    def _index(self, chunk: bytes) -> int:
        start, added = self.offset, 0
        last = chunk.rfind(b"\n")
        if last < 0:  # a partial line: it waits, unless it is already too long to keep (skipped to its end)
            if self._skip_to_line_end or len(chunk) > MAX_LINE_BYTES:
                self.offset, self._skip_to_line_end = start + len(chunk), True
            return 0
        at = 0
        while at <= last:
            stop = chunk.index(b"\n", at)
            line = chunk[at:stop]
            if self._skip_to_line_end:  # the end of a line too long to keep
                self._skip_to_line_end = False
                self.skipped += 1
            elif len(line) > MAX_LINE_BYTES:
                self.skipped += 1
            elif line.strip():
                added += self._add(start + at, line)
            at = stop + 1
        self.offset = start + last + 1
        if len(chunk) - last - 1 > MAX_LINE_BYTES:  # a partial last line already too long: skip it too
            self.offset, self._skip_to_line_end = start + len(chunk), True
        return added

    def _add(self, offset: int, line: bytes) -> int:
        try:  # parse_line's rules, less its per-line regex (a third of the cost): every number is checked after
            row = json.loads(line)
        except (ValueError, RecursionError):
            row = None
        if not isinstance(row, dict) or not ROW_CHECKS[SAMPLES](row):
            self.skipped += 1
            return 0
        row, odd = _finite(row)  # NaN, Infinity, beyond a float's range: None, counted
        self.odd += odd
        step = row[STEP]
        if step > MAX_STEPS:  # not a step any trainer wrote (nor one an array of int64 holds)
            self.skipped += 1
            return 0
        if self.max_step is not None and step > self.max_step:
            self.beyond += 1
            return 0
        advantage = as_number(row.get("advantage"))
        episode = row.get("episode")
        cut = bool(row.get("truncated")) or (isinstance(episode, dict) and episode.get("stop") == "length")
        gid = self._groups.setdefault(hash(group_key(row)), len(self._groups))  # the hash: no prompt held
        if gid == len(self._group_rows):
            self._group_rows.append(0), self._group_flat.append(0)
        self._group_rows[gid] += 1
        self._group_flat[gid] += advantage is not None and abs(advantage) <= FLAT
        self.offsets.append(offset), self.lengths.append(len(line)), self.steps.append(step)
        self.advantages.append(advantage if advantage is not None else 0.0)
        self.flags.append(TRUNCATED * cut), self.group_ids.append(gid)
        return 1

    # ---- reading rows back ------------------------------------------------------------------
    def rows(self, ids: Sequence[int]) -> list[dict | None]:
        """The rows `ids` as parsed from the file (None for one the file no longer holds as indexed)."""
        fh = open_file(self.path, self.warnings)
        if fh is None:
            return [None] * len(ids)
        out = []
        with fh:
            for i in ids:
                try:
                    fh.seek(self.offsets[i])
                    out.append(parse_line(SAMPLES, fh.read(self.lengths[i]))[0])
                except (OSError, IndexError):
                    out.append(None)
        return out

    def row(self, i: int) -> dict | None:
        return self.rows([i])[0]

    def tail(self, n: int) -> list[dict]:
        """The last `n` rows, oldest first."""
        return [r for r in self.rows(range(max(0, len(self) - n), len(self))) if r is not None]

    def group(self, i: int) -> list[int]:
        """The ids of row i's group (its step, group and prompt), in file order: rows of one step lie together."""
        step, gid = self.steps[i], self.group_ids[i]
        lo, hi = bisect.bisect_left(self.steps, step), bisect.bisect_right(self.steps, step)
        if not (lo <= i < hi):  # steps out of order in the file: look at every row
            lo, hi = 0, len(self)
        return [j for j in range(lo, hi) if self.group_ids[j] == gid]

    def step_range(self) -> tuple[int, int] | None:
        return (min(self.steps), max(self.steps)) if len(self) else None

    # ---- filters ----------------------------------------------------------------------------
    def order(self, mode: str, ids: Sequence[int] | None = None) -> Sequence[int]:
        """Row ids under a filter (sample_view.FILTERS' names), of `ids` (a search's hits) or of every row:
        newest first; best and worst by advantage; zero-variance groups; truncated."""
        ids = range(len(self) - 1, -1, -1) if ids is None else sorted(ids, reverse=True)
        if mode in ("best", "worst"):  # ties keep newest first either way
            return sorted(ids, key=self.advantages.__getitem__, reverse=mode == "best")
        if mode == "zero-variance":
            rows, flat, gids = self._group_rows, self._group_flat, self.group_ids
            return [i for i in ids if rows[gids[i]] > 1 and flat[gids[i]] == rows[gids[i]]]
        if mode == "truncated":
            return [i for i in ids if self.flags[i] & TRUNCATED]
        return ids

    def search(
        self, query: str, cancel: Callable[[], bool] = lambda: False, first: int = 0, upto: int | None = None
    ) -> tuple[list[int], bool]:
        """Ids of the rows whose prompt or completion holds `query` (case-insensitive), of rows first..upto-1
        (every indexed row by default), and whether there may be more (MAX_HITS reached). The file is read SEARCH_BLOCK at a time and a row is
        parsed only where its bytes hold the query as the trainer writes it (JSON with \\u escapes), so the cost
        is one read of the file; a query beyond ASCII is matched by parsing every row. `cancel()` true stops it."""
        q = query.lower()
        needle = json.dumps(q)[1:-1].encode() if q.isascii() else b""
        n = len(self) if upto is None else min(upto, len(self))
        hits: list[int] = []
        fh = open_file(self.path, self.warnings) if q and first < n else None
        if fh is None:
            return hits, False
        offsets, lengths = self.offsets, self.lengths
        with fh:
            i = first
            while i < n and not cancel():
                at = offsets[i]  # rows i..j-1 in one read: whole rows, at least one (a 10 MB row is read whole)
                j = bisect.bisect_right(offsets, at + SEARCH_BLOCK, i + 1, n)
                while j > i + 1 and offsets[j - 1] + lengths[j - 1] > at + SEARCH_BLOCK:
                    j -= 1
                fh.seek(at)
                block = fh.read(offsets[j - 1] + lengths[j - 1] - at)
                low = block.lower()
                k = i
                while k < j:
                    start = offsets[k] - at
                    if needle:  # on to the row of the next candidate
                        found = low.find(needle, start)
                        if found < 0:
                            break
                        k = bisect.bisect_right(offsets, at + found, k, j) - 1
                        start = offsets[k] - at
                        if start + lengths[k] <= found:  # between rows (a skipped line)
                            k += 1
                            continue
                    row = parse_line(SAMPLES, block[start : start + lengths[k]])[0] or {}
                    if q in f"{row.get('prompt', '')}\0{row.get('completion', '')}".lower():
                        hits.append(k)
                        if len(hits) >= MAX_HITS:
                            return hits, True
                    k += 1
                i = j
        return hits, False
