"""Export a run's checkpoint (default: the newest complete one) as a merged safetensors folder, a GGUF file,
or a push of the merged model to the Hugging Face Hub. See docs/export.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..contract.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, metavar="RUN", help="run directory")
    parser.add_argument("--step", type=int, help="the checkpoint's step (default: the newest complete checkpoint)")
    to = parser.add_mutually_exclusive_group(required=True)
    to.add_argument(
        "--merged",
        type=Path,
        metavar="DIR",
        help="write the LoRA-merged model (safetensors, config, tokenizer) to a new or empty folder",
    )
    to.add_argument("--gguf", type=Path, metavar="FILE", help="write a GGUF file for llama.cpp")
    to.add_argument("--push", metavar="REPO", help="upload the merged model to this Hugging Face Hub repo")
    parser.add_argument("--quant", help="GGUF tensor type: f32, f16 (default), bf16, q8_0")


def run(args: argparse.Namespace) -> int:
    if args.quant is not None and args.gguf is None:
        raise UserError("applies to --gguf only", kind="export", key="--quant", value=args.quant)
    from ..engine.out import export

    if args.merged is not None:
        line = export.export_merged(args.run, args.step, args.merged)
    elif args.gguf is not None:
        line = export.export_gguf(args.run, args.step, args.gguf, args.quant or "f16")
    else:
        line = export.push(args.run, args.step, args.push)
    print(line)
    return 0
