"""`grpo-studio bench NAME [ARGS]`: each benchmark is benchmarks/<name>.py with main(argv) -> int.

Benchmarks report ratios against a baseline measured in the same process, never absolute
wall-clock targets in tests (these machines are shared and noisy).
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import sys
from pathlib import Path


def names() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    available = names()
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: grpo-studio bench NAME [--json]\nbenchmarks: {', '.join(available)}")
        return 0 if argv else 2
    name = argv[0]
    if name not in available:
        close = difflib.get_close_matches(name, available, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"bench error: NAME = {name!r}: allowed: {', '.join(available)}{hint}", file=sys.stderr)
        return 2
    return importlib.import_module(f"grpo_studio.benchmarks.{name.replace('-', '_')}").main(argv[1:])
