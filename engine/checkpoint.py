"""Checkpoints: checkpoints/step-N/ holds the PEFT adapter (or full weights) in the layout
`PeftModel.from_pretrained` / `from_pretrained` load, plus trainer_state.pt with the optimizer,
LR schedule, fp16 loss scaler, RNG and data cursor. Written to a temp folder, then renamed.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

from grpo_studio.engine.contract.rundir import CHECKPOINTS

STATE = "trainer_state.pt"


def _dirs(run_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in (Path(run_dir) / CHECKPOINTS).glob("step-*"):
        match = re.fullmatch(r"step-(\d+)", path.name)
        if match and (path / STATE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def save(run_dir: Path, step: int, policy, optimizer, schedule, scaler, data_cursor: dict) -> Path | None:
    final = Path(run_dir) / CHECKPOINTS / f"step-{step}"
    if final.exists():
        return None
    tmp = final.with_name(f".step-{step}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp, safe_serialization=True)
    torch.save({
        "step": step,
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": torch.get_rng_state(),
        "data_cursor": data_cursor,
    }, tmp / STATE)
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


def load_latest(run_dir: Path, policy, optimizer, schedule, scaler) -> dict | None:
    found = _dirs(run_dir)
    if not found:
        return None
    _, path = found[-1]
    _load_weights(policy, path)
    state = torch.load(path / STATE, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    return state


def _load_weights(policy, path: Path) -> None:
    from peft import PeftModel, set_peft_model_state_dict
    from safetensors.torch import load_file

    if isinstance(policy, PeftModel):
        set_peft_model_state_dict(policy, load_file(path / "adapter_model.safetensors"))
    else:
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=next(policy.parameters()).dtype)
        policy.load_state_dict(loaded.state_dict())
