"""Try a doctor's suggestion in one key: fork a run with one config change.

The fork is a new run directory beside the parent (in the parent's folder, so `grpo-studio runs` of that folder and
the studio's runs list show both), named by absolute paths in fork.json and its events. It continues from the parent's newest checkpoint when it
can: the checkpoint folder and the parent's streams are copied, config.toml carries the change, and the trainer
resumes there (`train --resume`, which cuts the streams back to the checkpoint's step and applies the config's
train.lr). It starts at step 0 instead when the parent has no checkpoint before its last step, or when the change
is to the model itself (model.*: its dtype, LoRA or weights; the checkpoint's weights would not fit it). fork.json records the parent,
the step forked at and the change; Compare overlays parent and fork. Files only: no torch here."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..contract import config as cfgmod
from ..contract import rundir
from ..contract.config import Config
from ..contract.errors import UserError
from ..contract.run_files import CHECKPOINTS, CONFIG, EVENTS, FORK, STATE_EVENTS, STREAMS, checkpoint_folders
from ..contract.run_reader import read_bytes, read_events
from . import launcher

WEIGHT_KEYS = ("model.",)  # the model, its dtype, its LoRA: changes a checkpoint cannot carry into


@dataclass
class Fork:
    parent: Path
    key: str
    value: str
    cfg: Config  # the parent's config with the change
    old: str  # the parent's value, as config.toml shows it
    step: int  # the parent's checkpoint step the fork continues from; 0: from the start
    why_start: str  # why it starts at step 0 (empty when it continues from a checkpoint)

    def lines(self) -> list[str]:
        """What the fork changes and where it starts: the diff shown before launching."""
        where = (
            f"from: {self.parent.name}'s checkpoint step-{self.step}; steps {self.step + 1}.."
            f"{self.cfg.train.steps} trained with the change"
            if self.step
            else f"from: step 0 ({self.why_start}); same seed and data order as the parent"
        )
        return [f"fork {self.parent.name}", f"  {self.key}: {self.old} → {self.value}", f"  {where}"]


def plan(parent: Path, key: str, value: str) -> Fork:
    """The parent's config with `key` = `value` (refused in one line like --set), and where the fork starts."""
    parent = Path(parent)
    cfg = launcher.load_run_config(parent)
    section, _, name = key.partition(".")
    old = getattr(getattr(cfg, section, None), name, "")
    cfgmod.set_key(cfg, key, value, from_text=True)
    cfgmod.validate(cfg)
    steps = [step for step, _ in checkpoint_folders(parent) if step < cfg.train.steps]
    why = ""
    if key.startswith(WEIGHT_KEYS):
        why = f"{key} changes the model, so the checkpoint's weights cannot carry over"
    elif not steps:
        why = "no checkpoint before the parent's last step"
    shown = ",".join(map(str, old)) if isinstance(old, list) else str(old)
    return Fork(parent, key, value, cfg, shown, 0 if why else steps[-1], why)


def make(fork: Fork) -> Path:
    """Write the fork's run directory beside its parent: config.toml, fork.json and, continuing from a checkpoint,
    that checkpoint and the parent's streams and events less their state changes (the resume cuts the streams back
    to its step). Paths in fork.json and the copied events are absolute, so they hold wherever the fork is read."""
    parent = fork.parent.resolve()
    path = launcher.new_run_dir(parent.parent, f"{parent.name.split('-2')[0]}-fork")
    try:
        _write(fork, parent, path)
    except OSError as err:  # the parent's folder read-only or gone, its checkpoint deleted meanwhile, a full disk
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)  # no half-written fork left to be listed
        reason = err.strerror.lower() if err.strerror else str(err)
        raise UserError(
            f"cannot write the fork of {parent.name} beside it in {parent.parent}: {reason}", kind="fork"
        ) from None
    return path


def _write(fork: Fork, parent: Path, path: Path) -> None:
    path.mkdir(parents=True)
    record = {"parent": str(parent), "path": str(path), "step": fork.step, "set": {fork.key: fork.value}}
    rundir.atomic_write_text(path / FORK, json.dumps(record, indent=2) + "\n")
    if fork.step:
        for name in STREAMS:
            if (parent / name).is_file():
                shutil.copy2(parent / name, path / name)
        # the parent's events less its state changes: the fork's state is its own trainer's
        kept = [_absolute(e, parent) for e in read_events(parent) if e.get("event") not in STATE_EVENTS]
        note = {"time": time.time(), "event": "info", "message": f"fork of {parent.name} at step {fork.step}: "}
        note["message"] += f"{fork.key} = {fork.value}"
        rundir.atomic_write_text(path / EVENTS, "".join(json.dumps(e) + "\n" for e in [*kept, note]))
        shutil.copytree(parent / CHECKPOINTS / f"step-{fork.step}", path / CHECKPOINTS / f"step-{fork.step}")
        cfgmod.save(fork.cfg, path / CONFIG)


def _absolute(event: dict, parent: Path) -> dict:
    """The event with a relative `path` made absolute: a trainer started with a relative run directory wrote it
    relative to its working directory, which holds the parent's folder as `path`'s first parts."""
    where = event.get("path")
    if not isinstance(where, str) or not where or Path(where).is_absolute():
        return event
    rel = Path(where)
    # runs/x/checkpoints/step-2 → the parts from the parent's own name on; else relative to the parent
    parts = rel.parts
    tail = Path(*parts[parts.index(parent.name) + 1 :]) if parent.name in parts else rel
    return {**event, "path": str(parent / tail)}


def parent_of(run_dir: Path) -> Path | None:
    """The run this one was forked from (fork.json), or None."""
    text = read_bytes(Path(run_dir) / FORK, 1 << 20)  # a FIFO or a device is never opened
    try:
        return Path(json.loads(text or b"")["parent"])
    except (ValueError, KeyError, TypeError):
        return None
