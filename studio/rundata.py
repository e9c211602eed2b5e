"""A run directory as the studio sees it: tails of its JSONL files, one growing column per metric.

`poll()` reads what the trainer appended since the last call (JsonlTail: complete lines only,
at most 8 MiB a poll, so a huge backlog is drained over several polls) and bumps `version`
when anything changed, so charts redraw only on new data. Everything is read through the tolerant
readers (contract/run_reader.py): a file that cannot be read, a malformed line, a NaN or a number beyond
a float's range, a config.toml that is not UTF-8 or has a section of the wrong type is a `warning` event
(and a line of `warnings()`), never an exception; charts never receive a non-finite value.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

from grpo_studio.contract import metrics
from grpo_studio.contract.metrics import EVAL_KEYS  # poll() names its rows `metrics`
from grpo_studio.contract.run_files import CONFIG, EVENTS, HISTOGRAMS, METRICS, SAMPLES, STATE_EVENTS
from grpo_studio.contract.run_reader import JsonlTail, Warnings, as_number, malformed, odd_numbers, read_config, setting
from grpo_studio.contract.run_state import run_state, state_of


class RunData:
    def __init__(self, run_dir: Path, max_samples: int = 200, max_events: int = 500):
        self.dir = Path(run_dir)
        self.name = self.dir.name
        self._tails = {
            name: JsonlTail(self.dir / name, max_rows=10**9) for name in (METRICS, EVENTS, SAMPLES, HISTOGRAMS)
        }
        self.steps: list[int] = []
        self.columns: dict[str, list[float | None]] = {}
        self.times: list[float] = []
        self.events: deque[dict] = deque(maxlen=max_events)
        self.samples: deque[dict] = deque(maxlen=max_samples)
        self.histogram: dict | None = None
        self.total_steps: int | None = None
        self.last_state_event = ""
        self.start_time: float | None = None
        self.eval_before: dict[str, float] = {}  # eval/* of the starting weights (the step-0 `eval` event)
        self.version = 0
        self._reported: dict[str, int] = {}  # skipped lines already reported, per file
        self._reported_odd: dict[str, int] = {}  # non-finite numbers already reported, per file
        self._notes = Warnings()  # what could not be read (files, config.toml), one line each
        self._noted = 0  # how many of them are in the events already
        self.config: dict = {}
        self._read_config()

    # ---- reading ----------------------------------------------------------------------------
    def _read_config(self) -> None:
        self.config = read_config(self.dir, self._notes)  # config.toml, else the studio's setup.toml
        if self.total_steps is None:
            steps = setting(self.config, "train", "steps", int)
            self.total_steps = steps if steps and steps > 0 else None

    def add_metrics(self, rows: list[dict]) -> None:
        for row in rows:
            step = row.get(metrics.STEP)
            if step is None:
                continue
            if self.steps and step <= self.steps[-1]:  # a resume rewrote history: start over from there
                self._truncate(step)
            n = len(self.steps)
            self.steps.append(int(step))
            self.times.append(as_number(row.get(metrics.TIME)) or 0.0)
            for key, value in row.items():
                if key in (metrics.STEP, metrics.TIME):
                    continue
                col = self.columns.get(key)
                if col is None:
                    col = self.columns[key] = [None] * n
                col.append(as_number(value))
            for col in self.columns.values():
                if len(col) < n + 1:
                    col.append(None)

    def _truncate(self, step: int) -> None:
        keep = next((i for i, s in enumerate(self.steps) if s >= step), len(self.steps))
        del self.steps[keep:], self.times[keep:]
        for col in self.columns.values():
            del col[keep:]

    def poll(self) -> bool:
        changed = False
        tails = self._tails
        metrics = tails[METRICS].read_new()
        if metrics:
            if not (self.dir / CONFIG).exists() or not self.config:
                self._read_config()
            self.add_metrics(metrics)
            changed = True
        events = tails[EVENTS].read_new()
        if tails[EVENTS].restarted:  # a resume rewrote events.jsonl: it holds the whole history again
            self.events.clear()
        for event in events:
            self.events.append(event)
            kind = event["event"]
            if kind in STATE_EVENTS:
                self.last_state_event = kind
            if kind == "eval" and event.get("step") == 0:
                values = {key: as_number(event.get(key.removeprefix("eval/"))) for key in EVAL_KEYS}
                self.eval_before = {key: value for key, value in values.items() if value is not None}
            if kind == "started":
                total = event.get("total_steps")
                self.total_steps = (
                    total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else self.total_steps
                )
                self.start_time = as_number(event.get("time"))
            changed = True
        samples = tails[SAMPLES].read_new()
        if tails[SAMPLES].restarted:
            self.samples.clear()
        if samples:
            self.samples.extend(samples)
            changed = True
        hists = tails[HISTOGRAMS].read_new()
        if hists:
            self.histogram = hists[-1]
            changed = True
        changed = self._report_skipped() or changed
        changed = self._report_notes() or changed
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

    def warnings(self) -> list[str]:
        """What could not be read so far, one line each, naming the file (what `report` and `attach` print)."""
        lines = list(self._notes)
        lines += [malformed(name, tail.skipped) for name, tail in self._tails.items() if tail.skipped]
        return lines

    def drain(self, limit: int = 1000) -> None:
        """Read everything already on disk (attach / compare)."""
        for _ in range(limit):
            if not self.poll():
                break

    # ---- derived ----------------------------------------------------------------------------
    def state(self) -> str:
        if not self.last_state_event:  # not polled yet: ask the run directory itself
            return run_state(self.dir).state
        return state_of(self.dir, self.last_state_event)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric; eval/* start at step 0 with the starting weights' scores."""
        col = self.columns.get(key)
        if not col:
            return [], []
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
