"""Checkpoints: checkpoints/step-N/ holds the PEFT adapter (or full weights) in the layout
`PeftModel.from_pretrained` / `from_pretrained` load, plus trainer_state.pt with the optimizer,
LR schedule, fp16 loss scaler, RNG, data cursor and the trainer's counters, config.toml (the config the weights were
trained with, which a resume compares against: contract/resume_rules.py) and manifest.json (step,
every file's size and sha256), written last. The folder is written as .step-N.tmp and renamed into
place, so a step-N folder is whole; the manifest still catches what a rename cannot (a file the disk
lost or damaged).

`prune` keeps the newest N complete checkpoints (train.keep_checkpoints), the one just written and the best
by train.best_metric; each other one is renamed to .step-N.deleted.tmp before it is removed, so no step-N
folder is ever half deleted (restore clears a leftover like a cut-short write).

`restore` takes the newest checkpoint that passes its manifest and loads; each one it passes over is
reported (`on_skip(step, path, why)`) and moved aside to step-N.skipped, so the run can write step-N again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import torch

from ...contract.errors import UserError
from ...contract.run_files import checkpoint_folders as folders
from ...contract.run_reader import Warnings, read_bytes
from ...contract.rundir import CHECKPOINTS, CONFIG

STATE = "trainer_state.pt"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20  # a manifest lists a handful of files
# Test hook (tests/test_crash_consistency.py): seconds to sleep after the weights are written and
# before the trainer state, so a test can kill the trainer in the middle of a checkpoint write.
TEST_PAUSE_ENV = "GRPO_STUDIO_TEST_CHECKPOINT_PAUSE_S"


class BadCheckpoint(Exception):
    """A checkpoint that cannot be trusted; str() says why, in one line."""


def step_of(path: str | Path) -> int:
    """N of a checkpoints/step-N folder."""
    return int(re.fullmatch(r"step-(\d+)", Path(path).name).group(1))


def supersede(run_dir: Path, after: int) -> list[int]:
    """Move the checkpoints saved after step `after` aside (step-N.superseded): a resume that went back to an
    earlier one (the last good before a divergence, or where the metrics end) trains those steps again, and save()
    never overwrites a folder. Returns their steps."""
    moved = []
    for step, path in folders(run_dir):
        if step > after:
            aside = path.with_name(f"{path.name}.superseded")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(path, aside)
            moved.append(step)
    return moved


def newest(run_dir: Path, at_most: int) -> Path | None:
    """The newest checkpoint folder saved at a step <= at_most, or None."""
    return next((path for step, path in reversed(folders(run_dir)) if step <= at_most), None)


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(
    run_dir: Path,
    step: int,
    policy,
    optimizer,
    schedule,
    scaler,
    data_cursor: dict,
    counters: dict,
    full: tuple[dict, dict] | None = None,
    config_text: str | None = None,
) -> Path | None:
    """Write checkpoints/step-N (None if it exists). `counters`: the trainer's own running counts. `full`:
    the (model, optimizer) state dicts gathered from a sharded policy (FSDP, engine/model/fsdp.py full_state),
    saved in the same layout as the policy's own: a consolidated adapter or HF folder. `config_text`: the run's
    config as TOML, remembered as the checkpoint's config.toml."""
    final = Path(run_dir) / CHECKPOINTS / f"step-{step}"
    if final.exists():
        return None
    tmp = final.with_name(f".step-{step}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp, safe_serialization=True, **({"state_dict": full[0]} if full else {}))
    time.sleep(float(os.environ.get(TEST_PAUSE_ENV, 0)))
    torch.save(
        {
            "step": step,
            "optimizer": full[1] if full else optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "data_cursor": data_cursor,
            "counters": counters,
        },
        tmp / STATE,
    )
    if config_text is not None:
        (tmp / CONFIG).write_text(config_text)
    files = {}
    for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
        _fsync(f)
        files[f.relative_to(tmp).as_posix()] = {"size": f.stat().st_size, "sha256": _sha256(f)}
    manifest = tmp / MANIFEST
    manifest.write_text(json.dumps({"step": step, "files": files}, indent=1))
    _fsync(manifest)
    _fsync(tmp)
    os.replace(tmp, final)
    _fsync(final.parent)
    return final


def prune(run_dir: Path, keep: int, just_saved: int, scores: dict[int, float]) -> list[int]:
    """Delete the complete checkpoints older than the newest `keep` (0 = keep all), but for `just_saved` and
    the best one (the highest of `scores`, step -> train.best_metric, the newest of equals); returns their
    steps. The newest, the one a resume takes, always stays."""
    found = folders(run_dir)
    kept = {step for step, _ in found[-keep:]} | {just_saved}
    best = max(((scores[step], step) for step, _ in found if step in scores), default=None)
    if best is not None:
        kept.add(best[1])
    removed = []
    for step, path in found:
        if step not in kept:
            doomed = path.with_name(f".step-{step}.deleted.tmp")
            os.replace(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            removed.append(step)
    return removed


def restore(
    run_dir: Path, policy, optimizer, schedule, scaler, on_skip, into=None, at_most: int | None = None
) -> dict | None:
    """Load the newest trustworthy checkpoint (saved at a step <= at_most, when given) into the trainer's objects
    and return its trainer state; None when there is none. The newer ones that failed are then moved aside to
    step-N.skipped (on_skip says each); when every one fails, NoUsableCheckpoint, with nothing moved. Leftover
    .step-N.tmp folders (writes cut short) are removed. `into(policy, optimizer, weights, optimizer_state)` loads the weights and optimizer state instead
    (FSDP: sharding them)."""
    for tmp in (Path(run_dir) / CHECKPOINTS).glob(".step-*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
    bad = []  # (step, path, why) of the newer ones that failed, moved aside once an older one reads
    candidates = [(step, path) for step, path in reversed(folders(run_dir)) if at_most is None or step <= at_most]
    for step, path in candidates:
        try:
            weights, state = _read(path, step, policy)
        except BadCheckpoint as why:
            bad.append((step, path, str(why)))
            continue
        for bad_step, bad_path, why in bad:
            aside = bad_path.with_name(f"{bad_path.name}.skipped")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(bad_path, aside)
            on_skip(bad_step, bad_path, f"{why} (moved to {aside.name})")
        try:
            if into:
                into(policy, optimizer, weights, state["optimizer"])
            else:
                _weights_into(policy, weights)
                optimizer.load_state_dict(state["optimizer"])
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, ValueError, KeyError) as err:  # sound, but trained with another model or shape
            raise UserError(
                f"checkpoint {path.name} does not fit the model this config builds ({_first_mismatch(err)}); "
                f"resume with the model settings it was trained with, or start a new run",
                kind="resume",
            ) from None
        schedule.load_state_dict(state["schedule"])
        scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        return state
    if bad:  # a run with checkpoints never silently restarts from the base weights and loses its steps
        raise NoUsableCheckpoint(
            "no checkpoint can be resumed from: "
            + "; ".join(f"{path.name}: {why}" for _, path, why in bad)
            + f"; to restart from the base weights instead, move {Path(run_dir) / CHECKPOINTS} away and resume again",
            kind="resume",
        )
    return None


class NoUsableCheckpoint(UserError):
    """Every checkpoint a resume could start from failed its check or its load: refused, nothing moved."""


def _first_mismatch(err: Exception) -> str:
    """The first line of a load error that names a tensor (torch lists every mismatched one), else its first line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    line = next((line for line in lines if "size mismatch" in line or "Missing key" in line), lines[0])
    return line.rstrip(".")[:240]


def check(path: Path, step: int, digests: bool = True) -> None:
    """Raise BadCheckpoint, saying why, unless `path` holds the manifest of `step` and every file it lists at
    the listed size (and sha256 with `digests`; export's cheap listing leaves that to the load)."""
    unread = Warnings()
    text = read_bytes(path / MANIFEST, MAX_MANIFEST_BYTES, unread)  # a FIFO or a device is never opened
    if text is None and not unread:
        raise BadCheckpoint(f"no {MANIFEST} (written before this version, or cut short)")
    try:
        manifest = json.loads(text or b"")
        files = {name: (int(f["size"]), str(f["sha256"])) for name, f in manifest["files"].items()}
        listed_step = manifest["step"]
    except (ValueError, TypeError, KeyError, AttributeError):
        raise BadCheckpoint(f"{MANIFEST} is unreadable") from None
    if listed_step != step:
        raise BadCheckpoint(f"{MANIFEST} is for step {listed_step}")
    for name in (STATE, *sorted(files)):
        if name not in files:
            raise BadCheckpoint(f"{MANIFEST} does not list {name}")
        file, (size, digest) = path / name, files[name]
        if not file.is_file():
            raise BadCheckpoint(f"{name} is missing")
        if file.stat().st_size != size:
            raise BadCheckpoint(f"{name} is {file.stat().st_size} bytes, the manifest says {size}")
        if digests and _sha256(file) != digest:
            raise BadCheckpoint(f"{name} fails its sha256 check")


def _read(path: Path, step: int, policy) -> tuple[dict, dict]:
    """Check `path` against its manifest and read its weights and trainer state into memory."""
    check(path, step)
    try:
        return _weights_from(policy, path), torch.load(path / STATE, weights_only=False)
    except Exception as err:  # whatever a reader raises, this checkpoint cannot be used
        reason = (str(err).strip().splitlines() or [""])[0][:160]
        raise BadCheckpoint(f"cannot be loaded ({type(err).__name__}: {reason})") from None


def _weights_from(policy, path: Path) -> dict:
    """The weights of checkpoint `path` as a state dict for `policy` (adapters only with LoRA)."""
    from peft import PeftModel
    from safetensors.torch import load_file

    if isinstance(policy, PeftModel):
        return load_file(path / "adapter_model.safetensors")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=next(policy.parameters()).dtype).state_dict()


def _weights_into(policy, weights: dict) -> None:
    from peft import PeftModel, set_peft_model_state_dict

    if isinstance(policy, PeftModel):
        set_peft_model_state_dict(policy, weights)
    else:
        policy.load_state_dict(weights)
