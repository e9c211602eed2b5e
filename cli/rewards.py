"""`grpo-studio rewards`: list the built-in reward functions (name, what it scores, score range)."""

from __future__ import annotations

import json
import sys

from grpo_studio.cli.parser import OneLineParser


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="grpo-studio rewards",
                           description="List the built-in reward functions. Use them in rewards.funcs, or "
                                       "give 'file.py:function' for your own (TRL signature).")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from grpo_studio.engine.rewards import describe

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


if __name__ == "__main__":
    sys.exit(main())
