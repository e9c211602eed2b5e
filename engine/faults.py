"""Resource faults as the one line a user reads: out of memory in a phase of a step, a full disk.

    out_of_memory(phase, step, run_dir)   a context: MemoryError, torch.OutOfMemoryError or the CPU
                                          allocator's failure inside it becomes a UserError naming the
                                          phase and what to lower, pointing at `grpo-studio vram`
    disk_full(err, path)                  whether `err`, raised while writing under `path`, means the
                                          disk is full (whatever the writer wrapped the ENOSPC in)
    disk_full_error(path, done, last)     the one line for it: the path, "no space left on device",
                                          the last checkpoint, how to continue

They are UserErrors of kind "run": the CLI's error boundary prints the line and exits with code 2.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from pathlib import Path

import torch

from ..contract.errors import UserError, describe
from ..contract.rundir import CONFIG

# What takes less memory in each phase of a step (the VRAM planner's keys).
LOWER = {
    "rollout": "lower rollout.num_generations, train.prompts_per_step or rollout.max_completion_len",
    "training": "set train.micro_batch_size, model.gradient_checkpointing = true or model.logits_chunk",
}
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NEARLY_FULL_BYTES = 1 << 20  # a write that failed with less than this free was the disk filling up


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA's OutOfMemoryError, Python's MemoryError, or the CPU allocator's RuntimeError."""
    return isinstance(err, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err)
    )


@contextlib.contextmanager
def out_of_memory(phase: str, step: int, run_dir: Path):
    """Run one phase of step `step` ("rollout" or "training"); running out of memory in it is one line."""
    try:
        yield
    except Exception as err:
        if not is_out_of_memory(err):
            raise
        raise UserError(
            f"out of memory in the {phase} of step {step} ({describe(err)}); {LOWER[phase]}; "
            f"`grpo-studio vram {Path(run_dir) / CONFIG}` shows what fits",
            kind="run",
        ) from None


def disk_full(err: BaseException, path: Path) -> bool:
    """ENOSPC/EDQUOT however it arrives: an OSError, safetensors' "No space left on device (os error 28)",
    or torch.save's bare "file write failed" on a file system with nothing left."""
    if isinstance(err, OSError):
        return err.errno in FULL_DISK_ERRNOS
    if "No space left on device" in str(err) or "os error 28" in str(err):
        return True
    try:
        return isinstance(err, RuntimeError) and shutil.disk_usage(path).free < NEARLY_FULL_BYTES
    except OSError:
        return False


def disk_full_error(path: Path, done: int, last_checkpoint: str | None) -> UserError:
    """The run in `path` stopped for a full disk after `done` steps; its checkpoints were written whole or not
    at all (a temporary folder, then a rename), so `last_checkpoint` is intact."""
    return UserError(
        f"{path}: no space left on device; the run stopped after step {done} (last checkpoint: "
        f"{last_checkpoint or 'none'}); free some space, then `grpo-studio train --resume {path}` "
        f"continues from the last checkpoint",
        kind="run",
    )
