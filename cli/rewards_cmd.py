"""List the built-in reward functions (name, what it scores, score range). Use them in rewards.funcs,
or give 'file.py:function' for your own (TRL signature)."""

from __future__ import annotations

import argparse
import json

from .output import stdout_to_stderr


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    with stdout_to_stderr():
        from ..rewards import describe

        rows = describe()
    if args.json:
        print(json.dumps([{"name": n, "description": d, "range": r} for n, d, r in rows], indent=2))
        return 0
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:  # plain text without rich
        width = max(len(n) for n, _, _ in rows)
        for name, about, span in rows:
            print(f"{name:<{width}}  {span:<14}  {about}")
        return 0
    table = Table(title="built-in rewards (rewards.funcs); your own: 'file.py:function'")
    table.add_column("name", style="bold")
    table.add_column("description")
    table.add_column("range", no_wrap=True)
    for name, about, span in rows:
        table.add_row(name, escape(about), escape(span))
    Console().print(table)
    return 0
