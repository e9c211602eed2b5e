"""`grpo-studio vram`: the VRAM planner on the command line (rich table or --json). No torch import.

    grpo-studio vram [PRESET|FILE.toml] [--set k=v]... [--gpu-mem 24GiB]
                     [--mode documented|accurate] [--variant efficient|standard] [--solve KEY] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from grpo_studio.engine.contract import config as config_mod
from grpo_studio.engine.contract import model_card, vram
from grpo_studio.engine.contract.config import ConfigError

UNITS = {"": 1.0, "g": 1.0, "gib": 1.0, "gb": 1e9 / 2 ** 30, "m": 1 / 1024, "mib": 1 / 1024,
         "mb": 1e6 / 2 ** 30, "t": 1024.0, "tib": 1024.0, "tb": 1e12 / 2 ** 30}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise ConfigError(f"vram error: {message}")


def parse_gpu_mem(text: str) -> float:
    """'24GiB', '24G', '24' (GiB), '80GB' (decimal), '16384MiB' -> GiB."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text or "")
    unit = match.group(2).lower() if match else ""
    if not match or unit not in UNITS or float(match.group(1)) <= 0:
        raise ConfigError(f"vram error: --gpu-mem = {text!r}: expected a positive size like 24GiB, 80GB or 16384MiB")
    return float(match.group(1)) * UNITS[unit]


def detect_gpu_gib() -> tuple[float | None, str]:
    """Total memory of GPU 0 via pynvml (nvidia-ml-py); (None, reason) when there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        finally:
            pynvml.nvmlShutdown()
        return total / 2 ** 30, name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no driver, no GPU, no pynvml: all mean "no GPU"
        return None, "no GPU detected"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="grpo-studio vram", description="Estimate GPU memory for a GRPO run.")
    p.add_argument("recipe", nargs="?", help="preset name or FILE.toml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    p.add_argument("--gpu-mem", help="GPU budget, e.g. 24GiB (default: detected GPU)")
    p.add_argument("--mode", default="accurate", help="documented | accurate")
    p.add_argument("--variant", default="efficient", help="documented mode: efficient | standard")
    p.add_argument("--solve", help=f"largest value that fits: {' | '.join(vram.SOLVE_KEYS)}")
    p.add_argument("--json", action="store_true")
    return p


def run_vram(args: argparse.Namespace) -> int:
    if args.mode not in vram.MODES:
        raise ConfigError(f"vram error: --mode = {args.mode!r}: allowed: {', '.join(vram.MODES)}")
    if args.solve is not None and args.solve not in vram.SOLVE_KEYS:
        raise ConfigError(f"vram error: --solve = {args.solve!r}: allowed: {', '.join(vram.SOLVE_KEYS)}")
    if args.gpu_mem is not None:
        gpu_gib, gpu_name = parse_gpu_mem(args.gpu_mem), f"--gpu-mem {args.gpu_mem}"
    else:
        gpu_gib, gpu_name = detect_gpu_gib()
    cfg = config_mod.load(args.recipe, args.overrides)
    card = model_card.load(cfg.model.name)
    est = vram.estimate(card, cfg, args.mode, gpu_gib, args.variant)
    solution = None
    if args.solve:
        if gpu_gib is None:
            raise ConfigError("vram error: --solve needs a GPU budget: no GPU detected, give --gpu-mem (e.g. 24GiB)")
        solution = vram.solve(card, cfg, args.solve, gpu_gib, args.mode, args.variant)
    if args.json:
        out = est.to_json()
        out["gpu"] = gpu_name
        if solution:
            out["solve"] = vars(solution)
        print(json.dumps(out, indent=1))
        return 0
    _render(est, gpu_name, solution)
    return 0


def _render(est: vram.Breakdown, gpu_name: str, solution) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"VRAM · {est.model} · {est.mode} mode", show_lines=False)
    table.add_column("row")
    table.add_column("GiB", justify="right")
    table.add_column("formula", overflow="fold")
    for row in est.rows:
        style = None if row.in_total else "dim"
        table.add_row(row.name + ("" if row.in_total else " *"), f"{row.gib:.2f}", row.formula, style=style)
    table.add_section()
    table.add_row("total (phase peak)", f"{est.total_gib:.2f}", est.peak_rule, style="bold")
    console.print(table)
    if any(not r.in_total for r in est.rows):
        console.print("[dim]* shown, not in the GPU total[/dim]")
    if est.gpu_gib is None:
        console.print(f"[yellow]{gpu_name}: give --gpu-mem to get a verdict[/yellow]")
    elif est.fits:
        console.print(f"[green]fits[/green]: {est.total_gib:.2f} of {est.gpu_gib:.2f} GiB ({gpu_name})")
    else:
        console.print(f"[red]does not fit[/red]: {est.total_gib:.2f} > {est.gpu_gib:.2f} GiB ({gpu_name})")
    if solution:
        console.print(f"--solve {solution.key}: {solution.value} fits ({solution.total_gib:.2f} GiB); "
                      f"{solution.value + solution.step} needs {solution.next_total_gib:.2f} GiB; "
                      f"limiting row: {solution.limiting_row}")


def main(argv: list[str] | None = None) -> int:
    try:
        return run_vram(build_parser().parse_args(argv))
    except ConfigError as err:
        msg = str(err)
        print(msg if msg.startswith("vram error") else f"vram error: {msg.removeprefix('config error: ')}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
