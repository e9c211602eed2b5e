"""List every config key: its type, default, allowed values and what it does (`--set KEY=VALUE`, or the
key in a recipe's [section])."""

from __future__ import annotations

import argparse
import dataclasses
import json

from ..contract import config
from ..contract.errors import show


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", action="store_true", required=True, help="list every key")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def about(info: config.KeyInfo) -> str:
    """The key's help, then what it allows: 'trainer precision; allowed: fp32, bf16, fp16, fp8'."""
    allowed = info.allowed()
    return "; ".join(part for part in (info.help, allowed and f"allowed: {allowed}") if part)


def run(args: argparse.Namespace) -> int:
    infos = config.key_info()
    if args.json:
        print(json.dumps([dataclasses.asdict(i) for i in infos], indent=1))
        return 0
    table = [("KEY", "TYPE", "DEFAULT", "HELP")]
    table += [(i.key, i.type, show(i.default), about(i)) for i in infos]
    widths = [max(len(row[c]) for row in table) for c in range(3)]
    for row in table:
        print("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[3]]).rstrip())
    return 0
