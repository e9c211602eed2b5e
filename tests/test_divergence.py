"""Divergence and resource faults end a run with one line, an event that says why, and the data intact.

* fp16 with a far too large learning rate: the sampler's probabilities turn NaN at step 2; steps are
  skipped and counted, and after train.max_bad_steps in a row the run stops with a `diverged` event,
  exit code 2 and one line (no torch.multinomial traceback);
* a NaN streak injected in-process (parameters set to NaN after step 2): the exact events, the last
  good checkpoint, the metrics rows (null loss and k3, never 0.0), train.max_bad_steps = 0 never stops;
* out of memory names the phase it happened in;
* a full disk (a small tmpfs) is one line naming the run directory and "no space left on device",
  with every checkpoint written before it intact.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli

from grpo_studio.contract import config, rundir
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.precision.mismatch import mismatch_metrics
from grpo_studio.engine.run.trainer import Trainer
from grpo_studio.engine.sampler.base import NonFiniteSampling, Sampling

SMALL = ["train.prompts_per_step=4", "rollout.num_generations=4", "train.eval_every=0"]
SETS = [a for s in SMALL for a in ("--set", s)]


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def poisoned_after(trainer: Trainer, step: int) -> None:
    """Set every trainable parameter to NaN once step `step` has finished (the sampler keeps the good
    weights it was synced with until the next step's sync)."""
    original = trainer.step

    def step_then_poison():
        row = original()
        if trainer.step_no == step:
            with torch.no_grad():
                for p in trainer.grpo.params:
                    p.fill_(math.nan)
        return row

    trainer.step = step_then_poison


# ---- divergence -------------------------------------------------------------------------------------


def test_fp16_with_a_huge_lr_ends_diverged_with_one_line(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(
        "train",
        "tiny-arith",
        "--set",
        "model.dtype=fp16",
        "--set",
        "train.lr=1e3",
        "--set",
        "train.steps=30",
        *SETS,
        "--run-dir",
        str(run),
        cwd=tmp_path,
        timeout=300,
    )
    message = (
        "diverged: steps 2-6 all skipped (train.max_bad_steps = 5), the last for non-finite sampler "
        "probabilities; last good checkpoint: none; try a lower train.lr (now 1000); --resume starts from the last "
        "good checkpoint"
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == f"run error: {message}"
    assert "Traceback" not in proc.stdout + proc.stderr
    events = jsonl(run / "events.jsonl")
    skipped = [e for e in events if e["event"] == "skipped_step"]
    assert [(e["step"], e["cause"]) for e in skipped] == [(s, "non-finite sampler probabilities") for s in range(2, 7)]
    assert skipped[0]["message"] == "non-finite sampler probabilities at step 2: step skipped, loss scale now 65536"
    diverged = [e for e in events if e["event"] == "diverged"]
    assert [{k: e[k] for k in ("message", "step", "cause", "bad_steps", "last_good_checkpoint")} for e in diverged] == [
        {
            "message": message,
            "step": 6,
            "cause": "non-finite sampler probabilities",
            "bad_steps": 5,
            "last_good_checkpoint": None,
        }
    ]
    assert events[-1]["event"] == "crashed" and events[-1]["message"].endswith(message)
    rows = jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # the step that stopped the run has its row too
    assert [r["precision/bad_streak"] for r in rows] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert all(r["loss"] is None for r in rows[1:])
    assert rundir.run_state(run).state == "crashed"


def test_a_nan_streak_stops_the_run_naming_cause_and_last_good_checkpoint(tmp_path):
    run = tmp_path / "run"
    cfg = config.load("tiny-arith", [*SMALL, "train.steps=20", "train.save_every=1", "train.max_bad_steps=3"])
    trainer = Trainer(cfg, run)
    poisoned_after(trainer, 2)
    message = (
        f"diverged: steps 3-5 all skipped (train.max_bad_steps = 3), the last for non-finite sampler "
        f"probabilities; last good checkpoint: {run}/checkpoints/step-1; try a lower train.lr (now 0.002); "
        f"--resume starts from the last good checkpoint"
    )
    with pytest.raises(UserError) as err:
        trainer.run()
    assert str(err.value) == f"run error: {message}"
    events = jsonl(run / "events.jsonl")
    assert [(e["step"], e["cause"]) for e in events if e["event"] == "skipped_step"] == [
        (3, "non-finite loss"),
        (4, "non-finite sampler probabilities"),
        (5, "non-finite sampler probabilities"),
    ]
    (diverged,) = [e for e in events if e["event"] == "diverged"]
    assert (diverged["message"], diverged["bad_steps"], diverged["last_good_checkpoint"]) == (
        message,
        3,
        f"{run}/checkpoints/step-1",
    )
    assert events[-1]["event"] == "crashed" and events[-1]["message"].endswith(message)
    rows = jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # step 5's row too: it ended the run, unsaved
    assert rows[1]["loss"] is not None and rows[1]["mismatch/k3"] is not None
    # step 3: π is NaN, so the mismatch estimates are null with the tokens counted, never a reassuring 0.0
    assert rows[2]["loss"] is None and rows[2]["mismatch/k3"] is None and rows[2]["mismatch/nonfinite_tokens"] > 0
    assert rows[3]["loss"] is None and rows[3]["grad_norm"] is None  # nothing sampled, nothing trained
    assert [r["precision/bad_steps"] for r in rows] == [0.0, 0.0, 1.0, 2.0, 3.0]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1", "step-2", "step-3", "step-4"]


def test_max_bad_steps_0_never_stops(tmp_path):
    cfg = config.load("tiny-arith", [*SMALL, "train.steps=3", "train.save_every=0", "train.max_bad_steps=0"])
    trainer = Trainer(cfg, tmp_path / "run")
    with torch.no_grad():
        for p in trainer.grpo.params:
            p.fill_(math.nan)
    assert trainer.run() == "finished"
    rows = jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["precision/bad_streak"] for r in rows] == [1.0, 2.0, 3.0]


def test_hf_sampler_with_nan_weights_raises_nonfinite_not_a_multinomial_error():
    from grpo_studio.contract import precision_plan
    from grpo_studio.engine.model import policy_loader
    from grpo_studio.engine.sampler.hf import HFBackend

    cfg = config.load("tiny-arith")
    path = policy_loader.resolve_model_path(cfg.model.name)
    sampler = HFBackend(path, policy_loader.load_tokenizer(path), precision_plan.resolve(cfg))
    with torch.no_grad():
        for p in sampler.model.parameters():
            p.fill_(math.nan)
    with pytest.raises(NonFiniteSampling, match="^non-finite sampler probabilities$"):
        sampler.generate([[1, 2, 3]], Sampling(n=2, max_tokens=4))


def test_mismatch_of_a_nan_policy_is_nan_with_the_tokens_counted():
    mu = torch.tensor([[-1.0, -2.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    out = mismatch_metrics(mu, torch.tensor([[math.nan, -2.0, 0.0]]), mask)
    assert (out["mismatch/tokens"], out["mismatch/nonfinite_tokens"]) == (1.0, 1.0)
    assert all(math.isnan(v) for k, v in out.items() if k not in ("mismatch/tokens", "mismatch/nonfinite_tokens"))
    out = mismatch_metrics(mu, torch.full((1, 3), math.nan), mask)
    assert math.isnan(out["mismatch/k3"]) and out["mismatch/nonfinite_tokens"] == 2.0


# ---- out of memory ----------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["rollout", "training"])
def test_out_of_memory_names_the_phase(tmp_path, phase):
    """A real out-of-memory cannot be produced safely on a shared CPU machine, so the fault is injected:
    in the rollout a real allocation of 2**60 bytes, which the CPU allocator refuses at once (nothing is
    touched); in training a torch.OutOfMemoryError, CUDA's error, raised by a fake micro-batch loop."""
    trainer = Trainer(config.load("tiny-arith", [*SMALL, "train.steps=1"]), tmp_path / "run")

    def fail(*args, **kwargs):
        if phase == "rollout":
            torch.empty(2**60, dtype=torch.uint8)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    if phase == "rollout":
        trainer.grpo.sampler.generate = fail
    else:
        trainer.grpo._accumulate = fail
    with pytest.raises(UserError) as err:
        trainer.step()
    text = str(err.value)
    lower = {
        "rollout": "lower rollout.num_generations, train.prompts_per_step or rollout.max_completion_len",
        "training": "set train.micro_batch_size, model.gradient_checkpointing = true or model.logits_chunk",
    }
    assert text.startswith(f"run error: out of memory in the {phase} of step 1 (")
    assert text.endswith(f"); {lower[phase]}; `grpo-studio vram {tmp_path}/run/config.toml` shows what fits")
    if phase == "training":
        assert text == (
            f"run error: out of memory in the training of step 1 (OutOfMemoryError: CUDA out of memory. "
            f"Tried to allocate 2.00 GiB); {lower[phase]}; `grpo-studio vram {tmp_path}/run/config.toml` "
            f"shows what fits"
        )
    assert len(text.splitlines()) == 1


# ---- a full disk ------------------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A 4 MiB tmpfs: room for two checkpoints of the bundled model (1.6 MB each) and the logs."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_is_one_line_and_the_checkpoints_before_it_are_intact(tiny_disk, tmp_path):
    run = tiny_disk / "run"
    proc = run_cli(
        "train",
        "tiny-arith",
        "--set",
        "train.steps=6",
        "--set",
        "train.save_every=1",
        *SETS,
        "--run-dir",
        str(run),
        cwd=tmp_path,
        timeout=300,
    )
    message = (
        f"run error: {run}: no space left on device; the run stopped after step 3 (last checkpoint: "
        f"{run}/checkpoints/step-2); free some space, then `grpo-studio train --resume {run}` continues "
        f"from the last checkpoint"
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == message
    assert "Traceback" not in proc.stdout + proc.stderr
    saved = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    assert saved == ["step-1", "step-2"]
    for name in saved:  # every file as long as its manifest says
        manifest = json.loads((run / "checkpoints" / name / "manifest.json").read_text())
        assert manifest["files"] and all(
            (run / "checkpoints" / name / f).stat().st_size == meta["size"] for f, meta in manifest["files"].items()
        )
    assert [r["step"] for r in jsonl(run / "metrics.jsonl")] == [1, 2, 3]
    events = jsonl(run / "events.jsonl")
    assert events[-1]["event"] == "crashed" and events[-1]["message"].endswith(message)
