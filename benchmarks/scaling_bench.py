"""`grpo-studio bench scaling [--json]`: data-parallel scaling, 1 process against N (train.parallel = ddp, or
fsdp with --parallel fsdp).

The same recipe and global batch (prompts per step × G) is trained headless by `grpo-studio train`, once
as one process (the baseline) and once with `--nproc N` (torchrun; gloo on CPU, NCCL on CUDA), each for
`--warmup` untimed steps and `--steps` timed ones. From each run's metrics.jsonl (global numbers, written
by rank 0) it reports:

  step_s       median seconds per optimizer step (the slowest rank's)
  steps_s      1 / step_s
  tok_s        completion tokens of the whole step / step_s
  comm_s       median seconds per step in collectives (perf/comm_s: the gradient all-reduce and the global
               token count, including the wait for the slowest rank)
  speedup      the N-process steps/s over the one-process steps/s

The cores are shared out (OMP_NUM_THREADS = cores / processes), so both sides use the same cores: on a
CPU the N processes gain only what one process could not use of them, so expect little gain there.

    grpo-studio bench scaling                       # tiny-arith, 16 prompts × 8, 1 vs 2 processes
    grpo-studio bench scaling --nproc 4 --json      # a 4-GPU box
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..contract.rundir import METRICS, read_rows


@dataclass
class Workload:
    recipe: str
    nproc: int  # processes of the parallel side
    prompts: int  # prompts per step (global)
    generations: int
    steps: int  # timed steps
    warmup: int  # untimed steps first
    parallel: str = "ddp"  # train.parallel of the N-process side


def _side(w: Workload, nproc: int, root: Path) -> dict:
    run = root / f"nproc-{nproc}"
    sets = [
        f"train.steps={w.warmup + w.steps}",
        f"train.prompts_per_step={w.prompts}",
        f"rollout.num_generations={w.generations}",
        "train.save_every=0",
        "train.eval_every=0",
        f"train.parallel={w.parallel if nproc > 1 else 'none'}",
    ]
    cmd = [
        sys.executable,
        "-m",
        "grpo_studio.cli.main",
        "train",
        w.recipe,
        "--run-dir",
        str(run),
        "--nproc",
        str(nproc),
        "--force",
    ]
    for s in sets:
        cmd += ["--set", s]
    threads = max(1, (os.cpu_count() or 1) // nproc)  # the cores shared out: one process may not oversubscribe them
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{nproc}-process run failed:\n{proc.stderr[-2000:]}")
    rows = read_rows(run / METRICS)[w.warmup :]
    step_s = statistics.median(r["perf/step_s"] for r in rows)
    tokens = statistics.median(r["completion/len_mean"] * w.prompts * w.generations for r in rows)
    comm = [r["perf/comm_s"] for r in rows if "perf/comm_s" in r]
    return {
        "nproc": nproc,
        "threads_per_process": threads,
        "step_s": step_s,
        "steps_s": 1 / step_s,
        "tok_s": tokens / step_s,
        "comm_s": statistics.median(comm) if comm else 0.0,
        "reward_mean": statistics.fmean(r["reward/mean"] for r in rows),
    }


def run(w: Workload, progress=None) -> dict:
    import torch

    sides = []
    with tempfile.TemporaryDirectory(prefix="grpo-scaling-") as root:
        for nproc in (1, w.nproc):
            if progress:
                progress(f"{nproc} process{'es' if nproc > 1 else ''}")
            sides.append(_side(w, nproc, Path(root)))
    one, many = sides
    return {
        "workload": asdict(w),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "backend": "nccl" if torch.cuda.is_available() else "gloo",
        "cpu_cores": os.cpu_count(),
        "sides": sides,
        "speedup": many["steps_s"] / one["steps_s"],
    }


def print_report(report: dict) -> None:
    w = report["workload"]
    print(
        f"scaling ({w['parallel']}): {w['recipe']}, {w['prompts']} prompts × {w['generations']} per step, {w['steps']} timed steps "
        f"after {w['warmup']}, {report['device']} ({report['backend']}, {report['cpu_cores']} CPU cores)"
    )
    print(f"  {'processes':>9s} {'s/step':>8s} {'steps/s':>8s} {'tok/s':>9s} {'comm s':>8s} {'reward':>7s}")
    for s in report["sides"]:
        print(
            f"  {s['nproc']:9d} {s['step_s']:8.3f} {s['steps_s']:8.2f} {s['tok_s']:9.1f} {s['comm_s']:8.4f} "
            f"{s['reward_mean']:7.3f}"
        )
    print(f"  speedup {report['speedup']:.2f}x with {w['nproc']} processes")
