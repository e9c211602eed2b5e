"""Estimate GPU memory for a GRPO run (the VRAM planner: a table per device, or --json), and with --solve the
largest value of a key that fits the GPU. --nproc N plans the N training ranks of `train --nproc N`."""

from __future__ import annotations

import argparse
import json
import re

from ..contract import config as config_mod
from ..contract import model_card
from ..contract.errors import UserError
from ..contract.planner import vram
from .output import stdout_to_stderr

UNITS = {
    "": 1.0,
    "g": 1.0,
    "gib": 1.0,
    "gb": 1e9 / 2**30,
    "m": 1 / 1024,
    "mib": 1 / 1024,
    "mb": 1e6 / 2**30,
    "t": 1024.0,
    "tib": 1024.0,
    "tb": 1e12 / 2**30,
}


def parse_gpu_mem(text: str) -> float:
    """'24GiB', '24G', '24' (GiB), '80GB' (decimal), '16384MiB' -> GiB."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text or "")
    unit = match.group(2).lower() if match else ""
    if not match or unit not in UNITS or float(match.group(1)) <= 0:
        raise UserError(
            "expected a positive size like 24GiB, 80GB or 16384MiB", kind="vram", key="--gpu-mem", value=text
        )
    return float(match.group(1)) * UNITS[unit]


def detect_gpu_gib() -> tuple[float | None, str]:
    """Total memory of the first visible GPU (pynvml, contract/planner/preflight.py); (None, reason) when there
    is none."""
    from ..contract.planner import preflight

    dev = preflight.gpu()
    return (None, "no GPU detected") if dev is None else (dev.total_gib, dev.name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", help="preset name or FILE.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    parser.add_argument("--gpu-mem", help="GPU budget, e.g. 24GiB (default: detected GPU)")
    parser.add_argument("--mode", default="accurate", choices=vram.MODES, metavar="MODE", help=" | ".join(vram.MODES))
    parser.add_argument(
        "--variant",
        default="efficient",
        choices=vram.VARIANTS,
        metavar="VARIANT",
        help=f"documented mode: {' | '.join(vram.VARIANTS)}",
    )
    parser.add_argument(
        "--solve",
        choices=vram.SOLVE_KEYS,
        metavar="KEY",
        help=f"largest value that fits: {' | '.join(vram.SOLVE_KEYS)}",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        metavar="N",
        help="training processes, one device each (train --nproc N with train.parallel ddp or fsdp)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(error_kind="vram")  # a config mistake here reads "vram error: ..."


def run(args: argparse.Namespace) -> int:
    with stdout_to_stderr():
        est, gpu_name, solution = plan(args)
    if args.json:
        out = est.to_json()
        out["gpu"] = gpu_name
        if solution:
            out["solve"] = vars(solution)
        print(json.dumps(out, indent=1))
        return 0
    _render(est, gpu_name, solution)
    return 0


def plan(args: argparse.Namespace) -> tuple[vram.Breakdown, str, vram.Solution | None]:
    """The estimate, the GPU's name and the --solve answer; a --solve with no answer is a UserError."""
    if args.gpu_mem is not None:
        gpu_gib, gpu_name = parse_gpu_mem(args.gpu_mem), f"--gpu-mem {args.gpu_mem}"
    else:
        gpu_gib, gpu_name = detect_gpu_gib()
    cfg = config_mod.load(args.recipe, args.overrides)
    card = model_card.load(cfg.model.name)
    est = vram.estimate(card, cfg, args.mode, gpu_gib, args.variant, world_size=args.nproc)
    if not args.solve:
        return est, gpu_name, None
    if gpu_gib is None:
        raise UserError("--solve needs a GPU budget: no GPU detected, give --gpu-mem (e.g. 24GiB)", kind="vram")
    sol = vram.solve(card, cfg, args.solve, gpu_gib, args.mode, args.variant, world_size=args.nproc)
    key = f"--solve {sol.key}"
    if sol.status == "never_fits":
        raise UserError(
            f"does not fit {gpu_gib:g} GiB even at {sol.key} = {sol.value} ({sol.total_gib:.1f} GiB; "
            f"largest row: {sol.limiting_row})",
            kind="vram",
            key=key,
        )
    if sol.status == "never_outgrows":
        raise UserError(
            f"fits {gpu_gib:g} GiB up to the cap {sol.key} = {sol.value} (in {args.mode} mode "
            f"{sol.key} barely changes the total)",
            kind="vram",
            key=key,
        )
    return est, gpu_name, sol


def _render(est: vram.Breakdown, gpu_name: str, solution) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for names, dev in _alike(est.devices):
        where = "" if names == ["train"] else f" · {_names(names)}" + (" (each)" if len(names) > 1 else "")
        table = Table(title=f"VRAM · {est.model} · {est.mode} mode{where}", show_lines=False)
        table.add_column("row")
        table.add_column("GiB", justify="right")
        table.add_column("formula", overflow="fold")
        for row in dev.rows:
            style = None if row.in_total else "dim"
            table.add_row(row.name + ("" if row.in_total else " *"), f"{row.gib:.2f}", row.formula, style=style)
        table.add_section()
        rule = est.peak_rule if dev.kind == "train" else "vLLM's memory on its own device"
        table.add_row(
            "total (phase peak)" if dev.kind == "train" else "total", f"{dev.total_gib:.2f}", rule, style="bold"
        )
        console.print(table)
    if any(not r.in_total for d in est.devices for r in d.rows):
        console.print("[dim]* shown, not in the GPU total[/dim]")
    if len(est.devices) > 1:
        for dev in est.devices:
            verdict = "" if dev.fits is None else ("  fits" if dev.fits else "  does not fit")
            console.print(f"device {dev.name}: {dev.total_gib:.2f} GiB{verdict}", highlight=False)
    if est.gpu_gib is None:
        console.print(f"[yellow]{gpu_name}: give --gpu-mem to get a verdict[/yellow]")
    elif est.fits:
        console.print(f"[green]fits[/green]: {est.total_gib:.2f} of {est.gpu_gib:.2f} GiB ({gpu_name})")
    else:
        console.print(
            f"[red]does not fit[/red]: {est.largest().name} {est.total_gib:.2f} GiB of "
            f"{est.gpu_gib:.2f} GiB ({gpu_name})"
            if len(est.devices) > 1
            else f"[red]does not fit[/red]: {est.total_gib:.2f} > {est.gpu_gib:.2f} GiB ({gpu_name})"
        )
    if solution:
        console.print(
            f"--solve {solution.key}: {solution.value} fits ({solution.total_gib:.2f} GiB); "
            f"{solution.value + solution.step} needs {solution.next_total_gib:.2f} GiB; "
            f"limiting row: {solution.limiting_row}"
        )


def _alike(devices: list[vram.Device]) -> list[tuple[list[str], vram.Device]]:
    """Devices with the same rows, grouped (every training rank holds the same rows): (names, one of them)."""
    groups: list[tuple[list[str], vram.Device]] = []
    for dev in devices:
        same = next((g for g in groups if g[1].kind == dev.kind and g[1].rows == dev.rows), None)
        if same:
            same[0].append(dev.name)
        else:
            groups.append(([dev.name], dev))
    return groups


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} … {names[-1].rsplit(' ', 1)[-1]}"
