"""The flags of the heavier benchmarks, each checked (one-line usage errors) into its workload and run: logprobs,
mismatch, scaling, step; and measure_and_show, the report printer every benchmark of cli/bench_cmd.py shares."""

from __future__ import annotations

import argparse
import json
import sys

from ..contract import config
from ..contract.bundled import DEFAULT_RECIPE
from ..contract.errors import UserError
from .output import stdout_to_stderr


def measure_and_show(args: argparse.Namespace, measure, show, indent: int = 2) -> dict:
    """Measure with library noise on stderr, then print the report: JSON with --json, else `show(report)`."""
    with stdout_to_stderr():
        report = measure()
    if args.json:
        print(json.dumps(report, indent=indent))
    else:
        show(report)
    return report


def at_least(args: argparse.Namespace, low: int, *flags: str) -> None:
    """One line for the first of these flags below `low` (each read from args by its name: --max-tokens, max_tokens)."""
    for flag in flags:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value < low:
            raise UserError(f"must be >= {low}", kind="bench", key=flag, value=value)


def positive(args: argparse.Namespace, flag: str) -> None:
    value = getattr(args, flag.removeprefix("--").replace("-", "_"))
    if not value > 0:  # NaN too
        raise UserError("must be > 0", kind="bench", key=flag, value=value)


# ---- logprobs ----------------------------------------------------------------------------


def logprobs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=512, help="completion tokens (rows of hidden states, default 512)")
    p.add_argument("--hidden", type=int, default=896, help="hidden size (default 896, Qwen2.5-0.5B)")
    p.add_argument("--vocab", type=int, default=151_936, help="vocabulary (default 151936, Qwen2.5/Qwen3)")
    p.add_argument("--chunk", type=int, default=32, help="model.logits_chunk of the chunked paths (default 32)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3, help="timed calls per path, after a warm-up call (default 3)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda when available")
    p.add_argument("--seed", type=int, default=0)


def run_logprobs(args: argparse.Namespace) -> int:
    from ..benchmarks import logprobs_bench as logprobs

    at_least(args, 1, "--tokens", "--hidden", "--vocab", "--chunk", "--repeats")
    positive(args, "--temperature")
    device = args.device
    if device != "cpu":
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise UserError("no CUDA device here; use cpu or auto", kind="bench", key="--device", value=device)
        device = "cuda" if torch.cuda.is_available() else "cpu"
    workload = logprobs.Workload(
        tokens=args.tokens,
        hidden=args.hidden,
        vocab=args.vocab,
        chunk=args.chunk,
        temperature=args.temperature,
        repeats=args.repeats,
        device=device,
        seed=args.seed,
    )
    progress = None if args.json else (lambda n: print(f"measuring {n} ...", file=sys.stderr, flush=True))
    measure_and_show(args, lambda: logprobs.run(workload, progress), logprobs.print_report)
    return 0


# ---- mismatch ----------------------------------------------------------------------------


def mismatch_arguments(p: argparse.ArgumentParser) -> None:
    from ..benchmarks.mismatch_bench import PRECISIONS

    p.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="rollout backend (default hf)")
    p.add_argument("--dtypes", default=",".join(PRECISIONS), help=f"comma list from {', '.join(PRECISIONS)}")
    p.add_argument("--model", default=None, help="model.name (preset id, local folder, hub id); default: the recipe's")
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"recipe preset or TOML file (default {DEFAULT_RECIPE})")
    p.add_argument("--prompts", type=int, default=64, help="prompts (default 64)")
    p.add_argument("--generations", type=int, default=4, help="completions per prompt (default 4)")
    p.add_argument("--max-tokens", type=int, default=8, help="max completion tokens (default 8)")
    p.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="trainer LoRA rank (default 0 = full fine-tune: fp32 master weights under autocast)",
    )
    p.add_argument("--seed", type=int, default=0, help="data and sampling seed (default 0)")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="recipe override, repeatable"
    )
    p.add_argument(
        "--moe",
        action="store_true",
        help="an MoE model (--model, default the tiny Qwen3-MoE): each precision with and without router replay",
    )


def run_mismatch(args: argparse.Namespace) -> int:
    from ..benchmarks import mismatch_bench as mismatch

    names = mismatch.parse_dtypes(args.dtypes)
    at_least(args, 1, "--prompts", "--generations", "--max-tokens")
    progress = None if args.json else (lambda n: print(f"measuring {n} ...", file=sys.stderr, flush=True))
    measure_and_show(
        args,
        lambda: mismatch.run(
            names,
            backend=args.backend,
            model=args.model,
            recipe=args.recipe,
            lora_rank=args.lora_rank,
            prompts=args.prompts,
            generations=args.generations,
            max_tokens=args.max_tokens,
            seed=args.seed,
            overrides=args.overrides,
            progress=progress,
            moe=args.moe,
        ),
        mismatch.print_table,
    )
    return 0


# ---- scaling -----------------------------------------------------------------------------


def scaling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"recipe preset or TOML file (default {DEFAULT_RECIPE})")
    p.add_argument("--nproc", type=int, default=2, help="processes of the data-parallel side (default 2)")
    p.add_argument(
        "--parallel", default="ddp", help="train.parallel of the data-parallel side: ddp or fsdp (default ddp)"
    )
    p.add_argument("--prompts", type=int, default=16, help="prompts per step, all processes together (default 16)")
    p.add_argument("--generations", type=int, default=8, help="completions per prompt (default 8)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per side (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per side before them (default 2)")


def run_scaling(args: argparse.Namespace) -> int:
    from ..benchmarks import scaling_bench as scaling

    at_least(args, 2, "--nproc")
    at_least(args, 1, "--prompts")
    at_least(args, 2, "--generations")
    at_least(args, 1, "--steps")
    at_least(args, 0, "--warmup")
    if args.parallel not in ("ddp", "fsdp"):
        raise UserError(kind="bench", key="--parallel", value=args.parallel, allowed=("ddp", "fsdp"))
    cfg = config.Config()
    cfg.train.parallel, cfg.train.prompts_per_step = args.parallel, args.prompts
    config.check_processes(cfg, args.nproc, "--nproc", kind="bench", prompts_key="--prompts")
    workload = scaling.Workload(
        recipe=args.recipe,
        nproc=args.nproc,
        prompts=args.prompts,
        generations=args.generations,
        steps=args.steps,
        warmup=args.warmup,
        parallel=args.parallel,
    )
    progress = None if args.json else (lambda n: print(f"measuring {n} ...", file=sys.stderr, flush=True))
    measure_and_show(args, lambda: scaling.run(workload, progress), scaling.print_report)
    return 0


# ---- step --------------------------------------------------------------------------------


def step_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--vs",
        default="trl",
        choices=["trl", "none"],
        help="the baseline run first (default trl: TRL's GRPOTrainer; none: ours only)",
    )
    p.add_argument(
        "--workload",
        default="random",
        choices=["random", "short-prompt", "shared-instruction", "gsm8k-shaped"],
        help="random: the tiny-arith recipe on --model; short-prompt: tiny-arith on a random 50M Qwen3, 8 prompts, "
        "32 tokens; shared-instruction: the same with a 160-character system prompt, 64 tokens; gsm8k-shaped: the "
        "word-problems recipe on the real SmolLM2-135M-Instruct (chat template, GSM8K system prompt and rewards), "
        "8 prompts, 128 tokens",
    )
    p.add_argument(
        "--model",
        default=None,
        help="preset id, local folder, or random:LAYERSxHIDDEN[xINTERMEDIATE] (a random Qwen3 with the "
        "bundled char tokenizer and an EOS bias, e.g. random:8x768x2048, ~50M parameters); "
        "default: the workload's (random: tiny-arith; short-prompt and shared-instruction: random:8x768x2048; "
        "gsm8k-shaped: smollm2-135m-instruct)",
    )
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default 16; the others 8)")
    p.add_argument("--generations", type=int, default=8, help="completions per prompt (default 8)")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="max completion tokens (default 8; short-prompt 32, shared-instruction 64, gsm8k-shaped 128)",
    )
    p.add_argument(
        "--mean-len",
        type=int,
        default=0,
        help="random models: mean completion length the EOS bias aims at (default 0: max-tokens / 2)",
    )
    p.add_argument("--steps", type=int, default=5, help="timed steps per side (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per side before them (default 1)")
    p.add_argument("--lora-rank", type=int, default=16, help="LoRA rank, 0 = full fine-tune (default 16)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 2e-3; gsm8k-shaped 5e-4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backends", default="hf", help="our rollout backends, comma list from hf, vllm (default hf)")
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=0,
        help="ours: train.micro_batch_tokens, length-sorted micro-batches under this token budget "
        "(default 0: one padded batch, as TRL)",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile one more step of ours (torch.profiler) and show its top N operators",
    )


def _mean_len(args: argparse.Namespace) -> int:
    """The EOS bias's target length: random models only (a trained model has its own lengths)."""
    if not args.model.startswith("random:"):
        return 0
    return args.mean_len or max(2, args.max_tokens // 2)


def run_step(args: argparse.Namespace) -> int:
    from ..benchmarks import step_bench as step

    for key, value in step.WORKLOADS[args.workload].items():  # the flags left out take the workload's defaults
        if key not in ("recipe", "sets") and getattr(args, key) is None:
            setattr(args, key, value)
    backends = tuple(b for b in args.backends.split(",") if b)
    if not backends or set(backends) - {"hf", "vllm"}:
        raise UserError("a comma list from hf, vllm", kind="bench", key="--backends", value=args.backends)
    at_least(args, 1, "--prompts", "--max-tokens", "--steps")
    if args.generations < 2:
        raise UserError(
            "must be >= 2 (group-relative advantages)", kind="bench", key="--generations", value=args.generations
        )
    positive(args, "--lr")
    at_least(args, 0, "--warmup", "--mean-len", "--lora-rank", "--micro-batch-tokens", "--profile")
    workload = step.Workload(
        model=args.model,
        prompts=args.prompts,
        generations=args.generations,
        max_tokens=args.max_tokens,
        mean_len=_mean_len(args),
        steps=args.steps,
        warmup=args.warmup,
        lora_rank=args.lora_rank,
        lr=args.lr,
        seed=args.seed,
        backends=backends,
        vs=args.vs,
        micro_batch_tokens=args.micro_batch_tokens,
        profile=args.profile,
        recipe=step.WORKLOADS[args.workload]["recipe"],
        name=args.workload,
        sets=step.WORKLOADS[args.workload].get("sets", ()),
    )
    progress = None if args.json else (lambda n: print(f"measuring {n} ...", file=sys.stderr, flush=True))
    measure_and_show(args, lambda: step.run(workload, progress), step.print_report)
    return 0
