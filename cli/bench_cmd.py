"""Run a benchmark (benchmarks/<name>_bench.py). Each reports ratios against a baseline measured in the same
process; --json prints one JSON object on stdout."""

from __future__ import annotations

import argparse
import dataclasses
import importlib

from .bench_workloads import (
    logprobs_arguments,
    measure_and_show,
    mismatch_arguments,
    run_logprobs,
    run_mismatch,
    run_scaling,
    run_step,
    scaling_arguments,
    step_arguments,
)


def _module(name: str):
    return importlib.import_module(f"grpo_studio.benchmarks.{name.replace('-', '_')}_bench")


# ---- rollout -----------------------------------------------------------------------------


def _rollout_arguments(p: argparse.ArgumentParser) -> None:
    from ..benchmarks.rollout_bench import ROLLOUT_DTYPES

    p.add_argument(
        "--model",
        default="random:8x1024",
        help="preset id, local folder, or random:LAYERSxHIDDEN (a random Qwen3 with the bundled "
        "char tokenizer, e.g. random:8x1024, built in a temp folder)",
    )
    p.add_argument("--dtype", default="bf16", choices=ROLLOUT_DTYPES)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=1, help="timed calls per backend (after a warm-up call)")
    p.add_argument("--lora-sync", action="store_true", help="also compare LoRA merge-and-load vs vLLM adapters")
    p.add_argument("--eager", action="store_true", help="vLLM without torch.compile (rollout.vllm_enforce_eager = on)")


def _rollout(args: argparse.Namespace) -> int:
    from ..benchmarks import rollout_bench as rollout

    workload = rollout.Workload(**{f.name: getattr(args, f.name) for f in dataclasses.fields(rollout.Workload)})
    measure_and_show(args, lambda: rollout.run(workload, args.lora_sync), rollout.print_report)
    return 0


# ---- ui ----------------------------------------------------------------------------------


def _ui_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="fresh processes timed to the first frame (default 5)")
    p.add_argument(
        "--history", type=int, default=10_000, help="steps of history behind the chart refresh (default 10000)"
    )


def _ui(args: argparse.Namespace) -> int:
    from ..benchmarks import ui_bench as ui

    measure_and_show(args, lambda: ui.run(args.repeats, args.history), ui.print_report)
    return 0


# ---- faults ------------------------------------------------------------------------------


def _faults_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fast",
        action="store_true",
        help="the generated cases only, not the slow trials (kill -9, a full disk, divergence, two trainers)",
    )


def _faults(args: argparse.Namespace) -> int:
    from ..benchmarks import faults_bench

    report = measure_and_show(args, lambda: faults_bench.run(slow=not args.fast), faults_bench.print_report)
    return 0 if not report["failures"] else 1


# ---- vram-accuracy -----------------------------------------------------------------------


def _vram_accuracy(args: argparse.Namespace) -> int:
    import logging
    import os

    from ..benchmarks import vram_accuracy_bench as vram_accuracy

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.disable(logging.WARNING)
    report = measure_and_show(
        args, lambda: vram_accuracy.report(vram_accuracy.run()), vram_accuracy.print_report, indent=1
    )
    return 0 if report["ok"] else 1


BENCHMARKS = {  # NAME -> (one line for --help, its flags, how it runs); the error message lists them in this order
    "faults": (
        "the fault suite as a hostile user: generated bad input, damaged runs, kill -9, full disk, "
        "divergence, two trainers; tracebacks, hangs, lost and duplicated steps",
        _faults_arguments,
        _faults,
    ),
    "logprobs": (
        "log-probs at a 151,936 vocabulary: materialised logits vs chunked (vs Triton on CUDA), "
        "peak memory, time, differences",
        logprobs_arguments,
        run_logprobs,
    ),
    "mismatch": (
        "rollout/train mismatch per precision on the same prompts and seeds",
        mismatch_arguments,
        run_mismatch,
    ),
    "rollout": ("rollout tokens/s, hf vs vLLM, on the same prompts", _rollout_arguments, _rollout),
    "scaling": (
        "data-parallel training, 1 vs N processes (torchrun): steps/s, tokens/s, communication per step",
        scaling_arguments,
        run_scaling,
    ),
    "step": (
        "whole optimizer steps: TRL's GRPOTrainer vs ours, s/step, tokens/s, memory, MFU",
        step_arguments,
        run_step,
    ),
    "ui": ("studio responsiveness: first frame and chart refresh", _ui_arguments, _ui),
    "vram-accuracy": (
        "the VRAM planner's accurate mode against real training steps",
        lambda p: None,
        _vram_accuracy,
    ),  # a fixed set of configs: no flags but --json
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = parser.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, (about, flags, _) in BENCHMARKS.items():
        sub = names.add_parser(
            name,
            prog=f"grpo-studio bench {name}",
            help=about,
            description=_module(name).__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        flags(sub)
        sub.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def run(args: argparse.Namespace) -> int:
    return BENCHMARKS[args.bench][2](args)
