"""Tracker fan-out (`report.to`): every metrics row, and the samples as a table where the tracker has
tables, mirrored to TensorBoard, trackio and W&B as the run goes. metrics.jsonl stays the seam: the
trackers get the row the run directory just stored, and the samples rows read back from samples.jsonl.

Each tracker is run as its library documents it, named after the run directory, with the run's resolved
config (the HF Trainer callbacks do the same: transformers.integrations.integration_utils). A package
that is not installed is one line naming the extra; a tracker that fails while the run goes on is a
`warning` event and is dropped, never a crashed run. docs/trackers.md is the user's page.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from pathlib import Path

from ...contract import metrics as schema
from ...contract.config import Config
from ...contract.errors import UserError, describe
from ...contract.rundir import SAMPLES, JsonlTail, RunWriter, atomic_write_text

TB_DIR = "tensorboard"  # report.to tensorboard: the event files, under the run directory
IDS = "trackers.json"  # what a resumed run needs to continue the same tracker runs (W&B's run id)


class TensorBoard:
    """torch.utils.tensorboard's SummaryWriter (what transformers' TensorBoardCallback uses). TensorBoard has
    no tables: the samples are left out."""

    module = "tensorboard"

    def start(self, name: str, project: str, config: dict, run_dir: Path, before: dict | None) -> dict:
        """Start (or, `before` holding what the last start returned, continue) this run's tracker run;
        returns what a resumed run needs to continue it. TensorBoard appends to the same folder."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / TB_DIR))
        self.writer.add_text("config", f"```\n{json.dumps(config, indent=2)}\n```")
        return {}

    def log(self, values: dict, step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def table(self, columns: list[str], rows: list[list], step: int) -> None:
        pass

    def finish(self) -> None:
        self.writer.close()


class Trackio:
    """trackio, local by default (TRACKIO_DIR; a Space with its own settings)."""

    module = "trackio"

    def start(self, name: str, project: str, config: dict, run_dir: Path, before: dict | None) -> dict:
        import trackio

        self.lib = trackio
        self.run = trackio.init(
            project=project, name=name, config=config, resume="never" if before is None else "allow"
        )  # trackio resumes by name
        return {}

    def log(self, values: dict, step: int) -> None:
        self.lib.log(values, step=step)

    def table(self, columns: list[str], rows: list[list], step: int) -> None:
        self.lib.log({"samples": self.lib.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.lib.finish()


class Wandb:
    """W&B, online or offline as WANDB_MODE says; its files in WANDB_DIR, else in the run directory."""

    module = "wandb"

    def start(self, name: str, project: str, config: dict, run_dir: Path, before: dict | None) -> dict:
        import wandb

        self.lib = wandb
        self.run = wandb.init(
            project=project,
            name=name,
            config=config,
            dir=os.environ.get("WANDB_DIR", str(run_dir)),
            **({"id": before["id"], "resume": "allow"} if before else {}),
        )  # W&B resumes by id
        return {"id": self.run.id}

    def log(self, values: dict, step: int) -> None:
        self.run.log(values, step=step)

    def table(self, columns: list[str], rows: list[list], step: int) -> None:
        self.run.log({"samples": self.lib.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.run.finish()


KINDS = {"tensorboard": TensorBoard, "trackio": Trackio, "wandb": Wandb}


def check_installed(names: list[str]) -> None:
    """Each tracker's package imports, or one line naming the extra that installs it (before the model loads)."""
    for i, name in enumerate(names):
        try:
            importlib.import_module(KINDS[name].module)
        except ImportError:
            raise UserError(
                f"the {name} package is not installed; pip install 'grpo-studio[{name}]'",
                key=f"report.to[{i}]",
                value=name,
            ) from None


class Trackers:
    """The trackers of `report.to`, started at the first row (so a run that fails to load starts none)."""

    def __init__(self, cfg: Config, writer: RunWriter):
        check_installed(cfg.report.to)
        self.cfg, self.writer = cfg, writer
        self.live = {name: KINDS[name]() for name in dict.fromkeys(cfg.report.to)}
        self.started = False
        self.samples = JsonlTail(writer.dir / SAMPLES, max_rows=10**9)

    def row(self, row: dict) -> None:
        if not self.live:
            return
        if not self.started:
            self.started = True
            self._start()
        step = row[schema.STEP]
        # step is the trackers' own axis, and each stamps its own wall time (trackio reserves "time")
        self._each("log", {k: _number(v) for k, v in row.items() if k not in (schema.STEP, schema.TIME)}, step)
        # the step's own samples (written just before its row); a resumed run's earlier ones went to the run before
        samples = []
        while batch := self.samples.read_new():  # the tail reads at most 8 MiB at a time
            samples += [s for s in batch if s[schema.STEP] == step]
        if samples:
            funcs = list(samples[0].get("rewards", {}))
            columns = ["step", "prompt", "completion", "advantage", *funcs]
            rows = [
                [
                    s["step"],
                    s.get("prompt"),
                    s.get("completion"),
                    s.get("advantage"),
                    *[s.get("rewards", {}).get(f) for f in funcs],
                ]
                for s in samples
            ]
            self._each("table", columns, rows, step)

    def _start(self) -> None:
        """Start every tracker; a resumed run (trackers.json holds what its first start returned) continues
        the same tracker runs."""
        path = self.writer.dir / IDS
        before = json.loads(path.read_text()) if path.exists() else {}
        started = {
            name: self._call(
                name,
                tracker,
                "start",
                self.writer.dir.name,
                self.cfg.report.project,
                self.cfg.to_dict(),
                self.writer.dir,
                before.get(name),
            )
            for name, tracker in list(self.live.items())
        }
        atomic_write_text(path, json.dumps({**before, **{k: v for k, v in started.items() if k in self.live}}))

    def close(self) -> None:
        if self.started:
            self._each("finish")
        self.live = {}

    def _each(self, method: str, *args) -> None:
        for name, tracker in list(self.live.items()):
            self._call(name, tracker, method, *args)

    def _call(self, name: str, tracker, method: str, *args):
        try:
            return getattr(tracker, method)(*args)
        except Exception as err:  # a tracker's failure (network, disk, its own bug) never stops training
            del self.live[name]
            self.writer.event(
                "warning",
                f"report.to {name}: {method} failed: {describe(err)}; it no longer receives this run's metrics",
                tracker=name,
            )


def _number(value) -> float:
    """A row value as the trackers take it: a float, NaN for a null (JSON's spelling of a non-finite number)."""
    return math.nan if value is None else float(value)
