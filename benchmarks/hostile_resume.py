"""The fault suite's hostile cases for resume (benchmarks/fault_probes.py says how they run): `train --resume` with
what a checkpoint cannot carry, by --set and by editing config.toml (contract/resume_rules.py), the changes it can
carry, damaged or missing remembered configs. The refusals read only config files, so most cases build the run
directory a trainer leaves (its config.toml, checkpoints remembering theirs) and run the command in this process;
the slow ones train the bundled tiny model for real."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

from ..contract import config, resume_rules
from ..contract.errors import UserError, show
from ..contract.run_files import CHECKPOINTS, CONFIG, EVENTS, PIDFILE
from ..contract.run_reader import read_events
from .fault_probes import Probe
from .faults_bench import run_process

CATEGORY = "resume"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def run_dir(tmp: Path, sets=(), steps=(2,), remember: bool = True) -> Path:
    """A run directory as a trainer of tiny-arith with `sets` leaves it: config.toml, and checkpoints/step-N (only
    what a refusal reads: the config each remembers, unless `remember` is off, as before checkpoints did)."""
    run = tmp / "run"
    cfg = config.load("tiny-arith", list(sets))
    (run / CHECKPOINTS).mkdir(parents=True)
    config.save(cfg, run / CONFIG)
    for step in steps:
        (run / CHECKPOINTS / f"step-{step}").mkdir()
        if remember:
            config.save(cfg, run / CHECKPOINTS / f"step-{step}" / CONFIG)
    return run


def edit(run: Path, sets: list[str]) -> None:
    """config.toml edited by hand: `sets` applied to what it holds."""
    config.save(config.load(str(run / CONFIG), sets), run / CONFIG)


def resume(run: Path, sets: list[str] = ()) -> tuple[int, str]:
    """`grpo-studio train --resume RUN --set ...` as a user runs it: its exit code and stderr (used only where the
    resume is refused before it starts a trainer)."""
    outcome = run_process(["train", "--resume", str(run), *[a for s in sets for a in ("--set", s)]], run.parent)
    return outcome.code, outcome.stderr


def refusal(step: int, key: str, old, new, via: str, also: str = "") -> str:
    """The one line a refused resume prints."""
    back = f"{key} = {show(old)}" if not also else "the checkpoint's values"
    also = f"; also {also}" if also else ""
    return (
        f"resume error: checkpoint step-{step} cannot carry {key} {show(old)} -> {show(new)} ({via}): "
        f"it decides {resume_rules.CARRIED[key]}{also}; resume with {back}, or start a new run\n"
    )


def untouched(run: Path, before: bytes) -> str | None:
    if (run / CONFIG).read_bytes() != before:
        return "config.toml was rewritten by a refused resume"
    if (run / EVENTS).exists() or (run / PIDFILE).exists():
        return "a refused resume wrote events or took the lock"
    return None


def refused(tmp: Path, key: str, value: str, by_set: bool, base=(), step: int = 2) -> str | None:
    """A changed `key` (by --set, or an edited config.toml) refused in one line naming both values and the source,
    nothing written."""
    run = run_dir(tmp, base, steps=(step,))
    old = config.load(str(run / CONFIG))
    if not by_set:
        edit(run, [f"{key}={value}"])
    before = (run / CONFIG).read_bytes()
    code, err = resume(run, [f"{key}={value}"] if by_set else [])
    new = config.load(str(run / CONFIG), [f"{key}={value}"])
    section, _, name = key.partition(".")
    was, now = getattr(getattr(old, section), name), getattr(getattr(new, section), name)
    want = refusal(step, key, was, now, "--set" if by_set else "edited in config.toml")
    if (code, err) != (2, want):
        return f"exit {code}: {err!r}, expected {want!r}"
    return untouched(run, before)


def two_keys(tmp: Path) -> str | None:
    """model.dtype by --set and model.lora_rank edited: one line, both named with their sources."""
    run = run_dir(tmp)
    edit(run, ["model.lora_rank=4"])
    code, err = resume(run, ["model.dtype=bf16"])
    want = refusal(2, "model.dtype", "fp32", "bf16", "--set", "model.lora_rank 16 -> 4 (edited in config.toml)")
    return None if (code, err) == (2, want) else f"exit {code}: {err!r}, expected {want!r}"


def allowed(tmp: Path, sets: list[str], edits: list[str], base=(), expect: dict | None = None) -> str | None:
    """Changes a checkpoint carries: not refused, and `changes` (the config_changed event) names each with both
    values."""
    run = run_dir(tmp, base)
    old = config.load(str(run / CONFIG))
    edit(run, edits)
    cfg = config.load(str(run / CONFIG), sets)
    try:
        resume_rules.check(run, cfg, {s.partition("=")[0] for s in sets})
    except UserError as err:
        return f"refused: {err}"
    got = config.changes(resume_rules.reference(run)[1], cfg)
    want = expect if expect is not None else config.changes(old, cfg)
    if not want and expect is None:
        return "the case changes nothing"
    return None if got == want else f"changes {got}, expected {want}"


def garbage_config(tmp: Path, text: bytes, want: str) -> str | None:
    """config.toml edited into something that is not a config: one line, nothing written."""
    run = run_dir(tmp)
    (run / CONFIG).write_bytes(text)
    code, err = resume(run)
    if code != 2 or len(err.splitlines()) != 1 or want not in err:
        return f"exit {code}: {err!r}, expected one line with {want!r}"
    return untouched(run, text)


def old_checkpoint_set(tmp: Path) -> str | None:
    """A checkpoint from before checkpoints remembered their config: --set is checked against config.toml."""
    run = run_dir(tmp, remember=False)
    code, err = resume(run, ["model.lora_rank=4"])
    want = refusal(2, "model.lora_rank", 16, 4, "--set")
    return None if (code, err) == (2, want) else f"exit {code}: {err!r}, expected {want!r}"


def old_checkpoint_edit(tmp: Path) -> str | None:
    """The same checkpoint with config.toml edited: not seen before loading (the load refuses it: slow trial);
    the resume is not refused here and finds no remembered config."""
    run = run_dir(tmp, remember=False)
    edit(run, ["model.lora_rank=4"])
    cfg = config.load(str(run / CONFIG))
    resume_rules.check(run, cfg, set())
    name, _ = resume_rules.reference(run)
    return None if name is None else f"reference {name}, expected the run's config.toml"


def damaged_remembered(tmp: Path, text: str) -> str | None:
    """The newest checkpoint's config.toml damaged (or from a version with other keys): the older checkpoint's
    remembered config is the reference, and the edit is still refused naming it."""
    run = run_dir(tmp, steps=(1, 2))
    (run / CHECKPOINTS / "step-2" / CONFIG).write_text(text)
    edit(run, ["model.dtype=bf16"])
    code, err = resume(run)
    want = refusal(1, "model.dtype", "fp32", "bf16", "edited in config.toml")
    return None if (code, err) == (2, want) else f"exit {code}: {err!r}, expected {want!r}"


def no_checkpoint(tmp: Path, folders: tuple[str, ...]) -> str | None:
    """No checkpoint (none yet, or only folders moved aside): the run restarts from the base weights, so a new
    LoRA rank is taken."""
    run = run_dir(tmp, steps=())
    for name in folders:
        (run / CHECKPOINTS / name).mkdir()
        config.save(config.load(str(run / CONFIG)), run / CHECKPOINTS / name / CONFIG)
    cfg = config.load(str(run / CONFIG), ["model.lora_rank=4"])
    try:
        resume_rules.check(run, cfg, {"model.lora_rank"})
    except UserError as err:
        return f"refused: {err}"
    return None


# ---- slow: real runs of the bundled tiny model ------------------------------------------------------


def trained(tmp: Path, *extra: str) -> Path:
    """A finished 2-step tiny-arith run with checkpoints at steps 1 and 2."""
    from .fault_trials import SMALL, finish, start

    run = tmp / "run"
    sets = [s for s in SMALL if not s.startswith(("train.steps", "train.save_every"))]
    code, err = finish(
        start("tiny-arith", "--run-dir", str(run), sets=[*sets, "train.steps=2", "train.save_every=1", *extra])
    )
    if code != 0:
        raise RuntimeError(f"the run to resume failed: exit {code}: {err[-500:]}")
    return run


def real_edit_recorded(tmp: Path) -> str | None:
    """train.lr edited in config.toml: the resume trains with it and config_changed names it with both values."""
    from .fault_trials import finish, start

    run = trained(tmp)
    old = config.load(str(run / CONFIG))
    edit(run, ["train.lr=0.005", "train.steps=3"])
    code, err = finish(start("--resume", str(run), sets=[]))
    changed = [e for e in read_events(run) if e["event"] == "config_changed"]
    want = f"resumed with train.steps 2 -> 3; train.lr {old.train.lr} -> 0.005"
    if code != 0 or [e["message"] for e in changed] != [want]:
        return f"exit {code}, config_changed {[e['message'] for e in changed]}, expected [{want!r}]: {err[-300:]}"
    return None


def real_refused_then_resumed(tmp: Path) -> str | None:
    """A refused rank change leaves the run as it was: the resume without it finishes."""
    from .fault_trials import finish, start

    run = trained(tmp)
    code, err = finish(start("--resume", str(run), sets=["model.lora_rank=4", "train.steps=3"]))
    if code != 2 or err != refusal(2, "model.lora_rank", 16, 4, "--set"):
        return f"exit {code}: {err!r}"
    code, err = finish(start("--resume", str(run), sets=["train.steps=3"]))
    return None if code == 0 else f"the plain resume failed: exit {code}: {err[-300:]}"


def real_old_checkpoint(tmp: Path) -> str | None:
    """A checkpoint without its remembered config and config.toml's rank edited: one line as it loads, exit 2."""
    from .fault_trials import finish, start

    run = trained(tmp)
    for step in (1, 2):
        folder = run / CHECKPOINTS / f"step-{step}"
        (folder / CONFIG).unlink()
        manifest = json.loads((folder / "manifest.json").read_text())
        del manifest["files"][CONFIG]
        (folder / "manifest.json").write_text(json.dumps(manifest))
    edit(run, ["model.lora_rank=4", "train.steps=3"])
    code, err = finish(start("--resume", str(run), sets=[]))
    lines = err.strip().splitlines()
    ok = code == 2 and len(lines) == 1 and lines[0].startswith("resume error: checkpoint step-2 does not fit the model")
    return None if ok and "size mismatch" in lines[0] else f"exit {code}: {err[-500:]!r}"


def real_no_usable_checkpoint(tmp: Path, edits: tuple[str, ...]) -> str | None:
    """Every checkpoint's remembered config.toml deleted (its manifest lists it) and `edits` made to config.toml:
    no checkpoint passes its check, so the resume is refused in one line naming each and how to restart from the
    base weights, exit 2, with the checkpoints and metrics as they were (never a silent restart at step 0)."""
    from .fault_trials import finish, start

    run = trained(tmp)
    for step in (1, 2):
        (run / CHECKPOINTS / f"step-{step}" / CONFIG).unlink()
    edit(run, [*edits, "train.steps=3"])
    metrics = (run / "metrics.jsonl").read_bytes()
    code, err = finish(start("--resume", str(run), sets=[]))
    want = (
        "resume error: no checkpoint can be resumed from: step-2: config.toml is missing; step-1: config.toml is "
        f"missing; to restart from the base weights instead, move {run / CHECKPOINTS} away and resume again\n"
    )
    if (code, err) != (2, want):
        return f"exit {code}: {err[-500:]!r}, expected {want!r}"
    folders = sorted(p.name for p in (run / CHECKPOINTS).iterdir())
    if folders != ["step-1", "step-2"] or (run / "metrics.jsonl").read_bytes() != metrics:
        return f"the refused resume changed the run: checkpoints {folders}"
    return None


def real_older_checkpoint_used(tmp: Path) -> str | None:
    """Only the newest checkpoint's config.toml deleted: the resume goes on from step-1, step-2 moved to
    step-2.skipped, and the skip is a warning line on the terminal besides its checkpoint_skipped event."""
    from .fault_trials import start

    run = trained(tmp)
    (run / CHECKPOINTS / "step-2" / CONFIG).unlink()
    edit(run, ["train.steps=3"])
    proc = start("--resume", str(run), sets=[])
    out, err = proc.communicate(timeout=600)
    code = proc.returncode
    skipped = [e for e in read_events(run) if e["event"] == "checkpoint_skipped"]
    started = [e for e in read_events(run) if e["event"] == "started"]
    want = "skipped checkpoint step-2: config.toml is missing (moved to step-2.skipped)"
    if code != 0 or [e["message"] for e in skipped] != [want] or started[-1]["message"] != "resumed at step 1":
        return f"exit {code}: {err[-300:]!r}; skipped {skipped}, started {started[-1:]}"
    return None if f"warning: {want}\n" in out else f"no warning line on stdout: {out[-300:]!r}"


def real_fork_copy(tmp: Path) -> str | None:
    """A copy of a run (as a fork copies the checkpoint) whose config.toml names another model: refused."""
    run = trained(tmp)
    copy = tmp / "copy"
    shutil.copytree(run, copy)
    edit(copy, [f"model.name={MODEL}"])
    code, err = resume(copy)
    want = refusal(2, "model.name", "tiny-arith", MODEL, "edited in config.toml")
    return None if (code, err) == (2, want) else f"exit {code}: {err!r}"


def cases() -> list:
    out = []
    forbidden = [
        ("model.lora_rank", "4", ()),
        ("model.dtype", "bf16", ()),
        ("model.name", MODEL, ()),
        ("model.lora_target_modules", "['q_proj', 'v_proj']", ()),
        ("model.lora_alpha", "8.0", ()),
        ("model.load_in_4bit", "true", ("model.dtype=bf16",)),
        ("model.double_quant", "false", ("model.dtype=bf16", "model.load_in_4bit=true")),
        ("model.lora_rank", "0", ()),  # LoRA to a full fine-tune
    ]
    for key, value, base in forbidden:
        for by_set in (True, False):
            name = f"{key}={value} by {'--set' if by_set else 'config.toml'}"
            out.append(Probe(CATEGORY, name, partial(refused, key=key, value=value, by_set=by_set, base=base)))
    out += [
        Probe(
            CATEGORY,
            "full fine-tune to LoRA by config.toml",
            partial(refused, key="model.lora_rank", value="8", by_set=False, base=("model.lora_rank=0",)),
        ),
        Probe(CATEGORY, "two keys, one by --set, one edited", two_keys),
        Probe(
            CATEGORY,
            "allowed: train.lr and rollout.dtype by --set",
            partial(allowed, sets=["train.lr=0.01", "rollout.dtype=bf16"], edits=[]),
        ),
        Probe(
            CATEGORY,
            "allowed: edited lr, gradient checkpointing, lora_dropout",
            partial(
                allowed, sets=[], edits=["train.lr=0.01", "model.gradient_checkpointing=true", "model.lora_dropout=0.1"]
            ),
        ),
        Probe(
            CATEGORY,
            "allowed: lora_alpha of a full fine-tune",
            partial(allowed, sets=[], edits=["model.lora_alpha=64.0"], base=("model.lora_rank=0",)),
        ),
        Probe(
            CATEGORY,
            "allowed: double_quant without a 4-bit base",
            partial(allowed, sets=["model.double_quant=false"], edits=[]),
        ),
        Probe(
            CATEGORY,
            "config.toml edited to garbage",
            partial(garbage_config, text=b"[model\nname = 'x'\n", want="invalid TOML"),
        ),
        Probe(
            CATEGORY, "config.toml not UTF-8", partial(garbage_config, text=b"[model]\nname = '\xff'\n", want="error")
        ),
        Probe(
            CATEGORY,
            "config.toml with an unknown key",
            partial(garbage_config, text=b"[model]\nrank = 4\n", want="unknown key"),
        ),
        Probe(CATEGORY, "config.toml emptied", partial(garbage_config, text=b"", want="is empty")),
        Probe(CATEGORY, "checkpoint without its config, --set", old_checkpoint_set),
        Probe(CATEGORY, "checkpoint without its config, edited", old_checkpoint_edit),
        Probe(CATEGORY, "newest remembered config damaged", partial(damaged_remembered, text="[model\n")),
        Probe(
            CATEGORY,
            "newest remembered config from another version",
            partial(damaged_remembered, text="[model]\nquantum = 3\n"),
        ),
        Probe(CATEGORY, "no checkpoint yet", partial(no_checkpoint, folders=())),
        Probe(
            CATEGORY,
            "only skipped and superseded checkpoints",
            partial(no_checkpoint, folders=("step-2.skipped", "step-4.superseded", ".step-6.tmp")),
        ),
        Probe(CATEGORY, "real: edited lr recorded", real_edit_recorded, timeout_s=300, slow=True),
        Probe(CATEGORY, "real: refused, then resumed", real_refused_then_resumed, timeout_s=300, slow=True),
        Probe(CATEGORY, "real: old checkpoint, edited rank", real_old_checkpoint, timeout_s=300, slow=True),
        Probe(CATEGORY, "real: copied run, another model", real_fork_copy, timeout_s=300, slow=True),
        Probe(
            CATEGORY,
            "real: no checkpoint usable, alpha edited",
            partial(real_no_usable_checkpoint, edits=("model.lora_alpha=64.0",)),
            timeout_s=300,
            slow=True,
        ),
        Probe(
            CATEGORY,
            "real: no checkpoint usable, rank edited",
            partial(real_no_usable_checkpoint, edits=("model.lora_rank=4",)),
            timeout_s=300,
            slow=True,
        ),
        Probe(CATEGORY, "real: newest unusable, older used", real_older_checkpoint_used, timeout_s=300, slow=True),
    ]
    return out
