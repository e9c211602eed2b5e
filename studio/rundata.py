"""A run directory as the studio sees it: tails of its JSONL files, one growing column per metric.

`poll()` reads what the trainer appended since the last call (JsonlTail: complete lines only,
at most 8 MiB a poll, so a huge backlog is drained over several polls) and bumps `version`
when anything changed, so charts redraw only on new data. samples.jsonl is indexed rather than held
(contract/samples_index.py: each row's offset and the numbers the Samples tab filters on), so the tab reaches
every row of a run of any length. Everything is read through the tolerant
readers (contract/run_reader.py): a file that cannot be read, a malformed line, a NaN or a number beyond
a float's range, a config.toml that is not UTF-8 or has a section of the wrong type is a `warning` event
(and a line of `warnings()`), never an exception; charts never receive a non-finite value.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from pathlib import Path

from ..contract import metrics
from ..contract.metrics import STEP, eval_fields  # poll() names its rows `metrics`
from ..contract.run_files import CONFIG, EVENTS, HISTOGRAMS, METRICS, SAMPLES, STATE_EVENTS
from ..contract.run_reader import (
    JsonlTail,
    Warnings,
    as_number,
    beyond_total,
    disorder,
    malformed,
    odd_numbers,
    read_config,
    setting,
    total_steps,
)
from ..contract.run_state import run_state, state_of
from ..contract.samples_index import SamplesIndex

RECENT_SAMPLES = 200  # RunData.samples: the newest rows, for a glance (the Samples tab pages through all)


class RunData:
    def __init__(self, run_dir: Path, max_events: int = 500):
        self.dir = Path(run_dir)
        self.name = self.dir.name
        self.samples_index = SamplesIndex(self.dir / SAMPLES)
        self._tails = {  # the index reads like a tail: skipped lines, warnings, restarts, pending bytes
            name: self.samples_index if name == SAMPLES else JsonlTail(self.dir / name, max_rows=10**9)
            for name in (METRICS, EVENTS, SAMPLES, HISTOGRAMS)
        }
        self.steps: list[int] = []
        self.columns: dict[str, list[float | None]] = {}
        self.times: list[float] = []
        self.events: deque[dict] = deque(maxlen=max_events)
        self.histogram: dict | None = None
        self.total_steps: int | None = None  # run_reader.total_steps: the last `started` event's, else the config's
        self._started_total = None  # the last `started` event's total_steps, as written
        self._beyond: dict[str, int] = {}  # stream rows left out: a step beyond total_steps
        self.last_state_event = ""
        self.start_time: float | None = None
        self.eval_before: dict[str, float] = {}  # eval/* of the starting weights (the step-0 `eval` event)
        self.rehearsal: dict | None = None  # the last `rehearsal` event: phase "running", then "done" with its peak
        self.version = 0
        self._reported: dict[str, int] = {}  # skipped lines already reported, per file
        self._reported_odd: dict[str, int] = {}  # non-finite numbers already reported, per file
        self._notes = Warnings()  # what could not be read (files, config.toml), one line each
        self._noted = 0  # how many of them are in the events already
        self._moved = self._repeated = 0  # metrics rows read out of step order, or repeating a step
        self._disorder_said = (0, 0)  # the counts the events have been told
        self.config: dict = {}
        self._read_config()

    # ---- reading ----------------------------------------------------------------------------
    def _read_config(self) -> None:
        self.config = read_config(self.dir, self._notes)  # config.toml, else the studio's setup.toml
        self.total_steps = total_steps(self._started_total, self.config)

    def _within(self, name: str, rows: list[dict]) -> list[dict]:
        """A stream's new rows without those whose step is beyond the run's total steps (said as a warning)."""
        total = self.total_steps
        kept = rows if total is None else [row for row in rows if row[STEP] <= total]
        self._left_out(name, len(rows) - len(kept))
        return kept

    def _left_out(self, name: str, n: int) -> None:
        """Say `n` more rows of the stream `name` left out, their step beyond the run's total steps."""
        if n > 0:
            self._beyond[name] = self._beyond.get(name, 0) + n
            line = beyond_total(name, self._beyond[name], self.total_steps)
            self.events.append({"time": time.time(), "event": "warning", "message": line})
            self.version += 1

    def add_metrics(self, rows: list[dict]) -> None:
        """Rows into the columns in step order: a row below the highest step so far goes in its place, and one
        repeating a step replaces that step's row (the later write wins), each counted for `warnings()` (the
        file was edited, concatenated or shuffled: the trainer appends in step order, and a resume's rewrite
        starts the columns over in poll)."""
        for row in rows:
            step = int(row[metrics.STEP])
            i = bisect.bisect_left(self.steps, step)
            repeat = i < len(self.steps) and self.steps[i] == step
            self._moved += i < len(self.steps) and not repeat
            self._repeated += repeat
            if repeat:
                del self.steps[i], self.times[i]
                for col in self.columns.values():
                    del col[i]
            n = len(self.steps)
            self.steps.insert(i, step)
            self.times.insert(i, as_number(row.get(metrics.TIME)) or 0.0)
            for key, value in row.items():
                if key in (metrics.STEP, metrics.TIME):
                    continue
                col = self.columns.get(key)
                if col is None:
                    col = self.columns[key] = [None] * n
                col.insert(i, as_number(value))
            for col in self.columns.values():
                if len(col) < n + 1:
                    col.insert(i, None)

    def _start_over(self) -> None:
        """metrics.jsonl was rewritten (a resume cut it): its rows come again from the start."""
        self.steps.clear(), self.times.clear(), self.columns.clear()
        self._moved = self._repeated = 0
        self._disorder_said = (0, 0)
        self._beyond.pop(METRICS, None)

    def poll(self) -> bool:
        changed = False
        tails = self._tails
        events = tails[EVENTS].read_new()  # first: a `started` event's total_steps bounds the streams' rows
        if tails[EVENTS].restarted:  # a resume rewrote events.jsonl: it holds the whole history again
            self.events.clear()
            self.rehearsal = None
        for event in events:
            self.events.append(event)
            kind = event["event"]
            if kind in STATE_EVENTS:
                self.last_state_event = kind
            if kind == "rehearsal":
                self.rehearsal = event
            if kind == "eval" and event.get("step") == 0:
                values = {key: as_number(value) for key, value in eval_fields(event).items()}
                self.eval_before = {key: value for key, value in values.items() if value is not None}
            if kind == "started":
                self._started_total = event.get("total_steps")
                self.total_steps = total_steps(self._started_total, self.config)
                self.start_time = as_number(event.get("time"))
            changed = True
        metrics = tails[METRICS].read_new()
        if tails[METRICS].restarted:
            self._start_over()
            changed = True
        if metrics:
            if not (self.dir / CONFIG).exists() or not self.config:
                self._read_config()
            self.add_metrics(self._within(METRICS, metrics))
            changed = True
        index = self.samples_index
        index.max_step, beyond = self.total_steps, index.beyond
        if index.update() or index.restarted:
            changed = True
        if index.restarted:
            self._beyond.pop(SAMPLES, None)
        else:
            self._left_out(SAMPLES, index.beyond - beyond)
        hists = tails[HISTOGRAMS].read_new()
        if tails[HISTOGRAMS].restarted:
            self.histogram = None
            self._beyond.pop(HISTOGRAMS, None)
        for hist in self._within(HISTOGRAMS, hists):  # the highest step's (a repeated step: its later row)
            if self.histogram is None or hist[STEP] >= self.histogram[STEP]:
                self.histogram = hist
            changed = True
        changed = self._report_skipped() or changed
        changed = self._report_notes() or changed
        changed = self._report_disorder() or changed
        if changed:
            self.version += 1
        return changed

    @property
    def skipped_rows(self) -> int:
        """Malformed lines skipped so far (not a JSON object with the fields its file needs)."""
        return sum(tail.skipped for tail in self._tails.values())

    def _report_skipped(self) -> bool:
        """Say once, as a warning in the events, how many more malformed lines a poll skipped."""
        for name, tail in self._tails.items():
            if tail.restarted:  # a resume rewrote the file without the lines reported before
                self._reported.pop(name, None)
        new = {name: tail.skipped - self._reported.get(name, 0) for name, tail in self._tails.items()}
        new = {name: n for name, n in new.items() if n > 0}
        if not new:
            return False
        self._reported.update({name: self._tails[name].skipped for name in new})
        where = ", ".join(f"{n} in {name}" for name, n in new.items())
        self.events.append(
            {
                "time": time.time(),
                "event": "warning",
                "message": f"skipped malformed lines ({where}): not a JSON object with the fields the file needs",
            }
        )
        return True

    def _report_notes(self) -> bool:
        """Say each new line of what could not be read (a file, config.toml, non-finite numbers) as a warning."""
        for tail in self._tails.values():
            for line in tail.warnings:
                self._notes(line)
            if tail.restarted:
                self._reported_odd.pop(tail.path.name, None)
            new = tail.odd - self._reported_odd.get(tail.path.name, 0)
            if new > 0:
                self._reported_odd[tail.path.name] = tail.odd
                self._notes(odd_numbers(tail.path.name, new))
        lines, self._noted = self._notes[self._noted :], len(self._notes)
        for line in lines:
            self.events.append({"time": time.time(), "event": "warning", "message": line})
        return bool(lines)

    def _disorder(self) -> str:
        return disorder(METRICS, self._moved, self._repeated)

    def _report_disorder(self) -> bool:
        """Say, as a warning in the events, metrics rows read out of step order or repeating a step (again as
        more come)."""
        counts = (self._moved, self._repeated)
        if counts == self._disorder_said or not any(counts):
            return False
        self._disorder_said = counts
        self.events.append({"time": time.time(), "event": "warning", "message": self._disorder()})
        return True

    def warnings(self) -> list[str]:
        """What could not be read so far, one line each, naming the file (what `report` and `attach` print)."""
        lines = list(self._notes)
        lines += [malformed(name, tail.skipped) for name, tail in self._tails.items() if tail.skipped]
        lines += [beyond_total(name, n, self.total_steps) for name, n in self._beyond.items()]
        return lines + [self._disorder()] * bool(self._moved or self._repeated)

    def drain(self, limit: int = 1000) -> None:
        """Read everything already on disk (attach / compare, report): until a poll finds nothing new and no
        file has bytes left for the next (a poll of lines too long to keep changes nothing, yet reads on)."""
        for _ in range(limit):
            if not self.poll() and not any(tail.pending for tail in self._tails.values()):
                break

    # ---- derived ----------------------------------------------------------------------------
    def state(self) -> str:
        if not self.last_state_event:  # not polled yet: ask the run directory itself
            return run_state(self.dir).state
        return state_of(self.dir, self.last_state_event)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric; eval/* start at step 0 with the starting weights' scores (kept when the
        run stopped before its first in-run eval)."""
        col = self.columns.get(key) or []
        xs, ys = ([0], [self.eval_before[key]]) if key in self.eval_before else ([], [])
        for s, v in zip(self.steps, col):
            if v is not None:
                xs.append(s)
                ys.append(v)
        return xs, ys

    def last(self, key: str) -> float | None:
        col = self.columns.get(key)
        if not col:
            return None
        for v in reversed(col):
            if v is not None:
                return v
        return None

    @property
    def samples(self) -> list[dict]:
        """The last RECENT_SAMPLES rows of samples.jsonl, oldest first (every row: samples_index)."""
        return self.samples_index.tail(RECENT_SAMPLES)

    @property
    def step(self) -> int:
        return self.steps[-1] if self.steps else 0

    def reward_funcs(self) -> list[str]:
        names = [fn for fn in map(metrics.reward_fn, self.columns) if fn is not None]
        return names or [fn for fn in setting(self.config, "rewards", "funcs", list, []) if isinstance(fn, str)]

    def eta_s(self, now: float | None = None) -> float | None:
        total = self.total_steps
        if not total or not self.steps:
            return None
        step_s = [v for v in (self.columns.get(metrics.STEP_S) or [])[-20:] if v]
        per = sum(step_s) / len(step_s) if step_s else None
        if per is None and self.start_time:
            per = ((now or time.time()) - self.start_time) / max(self.step, 1)
        return None if per is None else max(0.0, (total - self.step) * per)

    def beta(self) -> float:
        return as_number(setting(self.config, "algo", "beta", (int, float), 0.0)) or 0.0

    def dtype(self) -> str:
        train = setting(self.config, "model", "dtype", str, "?")
        return f"{train}/{setting(self.config, 'rollout', 'dtype', str, '') or train}"
