"""Run a benchmark (benchmarks/<name>.py). Each reports ratios against a baseline measured in the same
process; --json prints one JSON object on stdout."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys

from grpo_studio.cli.output import stdout_to_stderr
from grpo_studio.engine.contract.bundled import DEFAULT_RECIPE
from grpo_studio.engine.contract.errors import UserError


def _module(name: str):
    return importlib.import_module(f"grpo_studio.benchmarks.{name.replace('-', '_')}")


def _report(args: argparse.Namespace, measure, show, indent: int = 2) -> dict:
    """Measure with library noise on stderr, then print the report: JSON with --json, else `show(report)`."""
    with stdout_to_stderr():
        report = measure()
    if args.json:
        print(json.dumps(report, indent=indent))
    else:
        show(report)
    return report


# ---- mismatch ----------------------------------------------------------------------------

def _mismatch_arguments(p: argparse.ArgumentParser) -> None:
    from grpo_studio.benchmarks.mismatch import PRECISIONS

    p.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="rollout backend (default hf)")
    p.add_argument("--dtypes", default=",".join(PRECISIONS), help=f"comma list from {', '.join(PRECISIONS)}")
    p.add_argument("--model", default=None, help="model.name (preset id, local folder, hub id); default: the recipe's")
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"recipe preset or TOML file (default {DEFAULT_RECIPE})")
    p.add_argument("--prompts", type=int, default=64, help="prompts (default 64)")
    p.add_argument("--generations", type=int, default=4, help="completions per prompt (default 4)")
    p.add_argument("--max-tokens", type=int, default=8, help="max completion tokens (default 8)")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="trainer LoRA rank (default 0 = full fine-tune: fp32 master weights under autocast)")
    p.add_argument("--seed", type=int, default=0, help="data and sampling seed (default 0)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override, repeatable")


def _mismatch(args: argparse.Namespace) -> int:
    from grpo_studio.benchmarks import mismatch

    names = mismatch.parse_dtypes(args.dtypes)
    for opt, value in (("--prompts", args.prompts), ("--generations", args.generations),
                       ("--max-tokens", args.max_tokens)):
        if value < 1:
            raise UserError("must be >= 1", kind="bench", key=opt, value=value)
    progress = None if args.json else (lambda n: print(f"measuring {n} ...", file=sys.stderr, flush=True))
    _report(args, lambda: mismatch.run(names, backend=args.backend, model=args.model, recipe=args.recipe,
                                       lora_rank=args.lora_rank, prompts=args.prompts, generations=args.generations,
                                       max_tokens=args.max_tokens, seed=args.seed, overrides=args.overrides,
                                       progress=progress),
            mismatch.print_table)
    return 0


# ---- rollout -----------------------------------------------------------------------------

def _rollout_arguments(p: argparse.ArgumentParser) -> None:
    from grpo_studio.benchmarks.rollout import ROLLOUT_DTYPES

    p.add_argument("--model", default="random:8x1024",
                   help="preset id, local folder, or random:LAYERSxHIDDEN (a random Qwen3 with the bundled "
                        "char tokenizer, e.g. random:8x1024, built in a temp folder)")
    p.add_argument("--dtype", default="bf16", choices=ROLLOUT_DTYPES)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=1, help="timed calls per backend (after a warm-up call)")
    p.add_argument("--lora-sync", action="store_true", help="also compare LoRA merge-and-load vs vLLM adapters")
    p.add_argument("--eager", action="store_true", help="vLLM without torch.compile (rollout.vllm_enforce_eager = on)")


def _rollout(args: argparse.Namespace) -> int:
    from grpo_studio.benchmarks import rollout

    workload = rollout.Workload(**{f.name: getattr(args, f.name) for f in dataclasses.fields(rollout.Workload)})
    _report(args, lambda: rollout.run(workload, args.lora_sync), rollout.print_report)
    return 0


# ---- ui ----------------------------------------------------------------------------------

def _ui_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="fresh processes timed to the first frame (default 5)")
    p.add_argument("--history", type=int, default=10_000, help="steps of history behind the chart refresh "
                                                               "(default 10000)")


def _ui(args: argparse.Namespace) -> int:
    from grpo_studio.benchmarks import ui

    _report(args, lambda: ui.run(args.repeats, args.history), ui.print_report)
    return 0


# ---- vram-accuracy -----------------------------------------------------------------------

def _vram_accuracy(args: argparse.Namespace) -> int:
    import logging
    import os

    from grpo_studio.benchmarks import vram_accuracy

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.disable(logging.WARNING)
    report = _report(args, lambda: vram_accuracy.report(vram_accuracy.run()), vram_accuracy.print_report, indent=1)
    return 0 if report["ok"] else 1


BENCHMARKS = {  # NAME -> (one line for --help, its flags, how it runs); the error message lists them in this order
    "mismatch": ("rollout/train mismatch per precision on the same prompts and seeds", _mismatch_arguments,
                 _mismatch),
    "rollout": ("rollout tokens/s, hf vs vLLM, on the same prompts", _rollout_arguments, _rollout),
    "ui": ("studio responsiveness: first frame and chart refresh", _ui_arguments, _ui),
    "vram-accuracy": ("the VRAM planner's accurate mode against real training steps",
                      lambda p: None, _vram_accuracy),  # a fixed set of configs: no flags but --json
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = parser.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, (about, flags, _) in BENCHMARKS.items():
        sub = names.add_parser(name, prog=f"grpo-studio bench {name}", help=about, description=_module(name).__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        flags(sub)
        sub.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def run(args: argparse.Namespace) -> int:
    return BENCHMARKS[args.bench][2](args)
