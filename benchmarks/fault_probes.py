"""The fault suite's probes: hostile cases that are not a command line. A probe is a function that does what a
stranger, a careless environment class or a model's odd text would do to one part of grpo-studio (the tool-call
parser, the rollout server's port, a reader of a run directory, ...) and says whether that part held.

  check(tmp) -> None       held
  check(tmp) -> "why"      it did not: what happened instead (the suite's verdict "wrong")

A probe that raises is a "traceback"; one still running at its time limit is a "hang". `grpo-studio bench faults`
runs each probe in a process of its own (`main([CATEGORY, NAME, TMP])` in a fresh Python), so a hang is killed and a crash cannot take the suite down; tests/test_fault_suite.py runs the fast ones in-process,
with the same time limit.

The probes themselves live beside the feature they attack, one module per category (HOSTILE below): each has
`cases() -> list[Case | Probe]`, command-line cases (fault_cases.Case) and probes alike.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# category modules under grpo_studio.benchmarks, each with cases(): the hostile cases of one feature
HOSTILE = (
    "hostile_environments",
    "hostile_model_text",
    "hostile_rollout_server",
    "hostile_readers",
    "hostile_resume",
    "hostile_data",
    "hostile_signals",
    "hostile_cache",
    "hostile_algorithms",
    "hostile_support",
    "hostile_moe",
    "hostile_api",
    "hostile_micro_batch",
    "hostile_samples",
    "hostile_evals",
    "hostile_studio",
)


@dataclass
class Probe:
    category: str
    name: str
    check: Callable[[Path], str | None]  # a module-level function (a fresh process finds it by category and name)
    timeout_s: float = 60.0
    slow: bool = False  # starts vLLM or trains for long: `bench faults` only, not tests/test_fault_suite.py


def named_probes(category: str, checks, *, timeout_s: float = 60.0, slow: bool = False) -> list[Probe]:
    """One probe per check function, named after it (its underscores read as spaces)."""
    return [Probe(category, check.__name__.replace("_", " "), check, timeout_s, slow) for check in checks]


def short_run_rows(tmp: Path, sets: list[str]) -> list[dict] | str:
    """Two steps of tiny-arith (2 prompts × 4 completions, no eval, no checkpoint) with `sets` in tmp/run:
    metrics.jsonl's rows, or why there are none."""
    import json

    from ..contract import config
    from ..engine.run.trainer import Trainer

    short = ["train.steps=2", "train.prompts_per_step=2", "rollout.num_generations=4", "train.eval_every=0"]
    trainer = Trainer(config.load("tiny-arith", [*short, "train.save_every=0", *sets]), tmp / "run")
    try:
        if trainer.run() != "finished":
            return "the run did not finish"
    finally:
        trainer.close()
    return [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]


def hostile_cases() -> list:
    """Every category module's cases, in HOSTILE's order."""
    out = []
    for name in HOSTILE:
        out += importlib.import_module(f"grpo_studio.benchmarks.{name}").cases()
    return out


def find(category: str, name: str) -> Probe:
    for case in hostile_cases():
        if isinstance(case, Probe) and case.category == category and case.name == name:
            return case
    raise LookupError(f"no probe {category}: {name}")


def run_in_process(probe: Probe, tmp: Path) -> tuple[str, str]:
    """(verdict, detail) of probe.check(tmp) on a daemon thread, given up after probe.timeout_s."""
    box: dict = {}

    def work():
        try:
            box["result"] = probe.check(tmp)
        except BaseException:  # noqa: BLE001 - exactly what the suite looks for
            box["traceback"] = traceback.format_exc()

    worker = threading.Thread(target=work, daemon=True, name=f"probe {probe.name}")
    worker.start()
    worker.join(probe.timeout_s)
    if worker.is_alive():
        return "hang", f"still running after {probe.timeout_s:g} s"
    if "traceback" in box:
        return "traceback", box["traceback"][-1500:]
    return ("held", "") if box["result"] is None else ("wrong", str(box["result"]))


def run_process(probe: Probe, tmp: Path) -> tuple[str, str]:
    """The same in a fresh Python process, killed at probe.timeout_s."""
    # main imported, not run as __main__: the category modules' Probe must be this module's class
    call = "import sys; from grpo_studio.benchmarks.fault_probes import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", call, probe.category, probe.name, str(tmp)]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=probe.timeout_s + 30, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return "hang", f"still running after {probe.timeout_s:g} s"
    verdict, _, detail = (done.stdout.strip().splitlines() or ["traceback"])[-1].partition(" ")
    if verdict not in ("held", "wrong", "hang", "traceback"):
        return "traceback", f"exit {done.returncode}: {done.stderr.strip()[-1500:]}"
    return verdict, detail or done.stderr.strip()[-1500:]


def main(argv: list[str]) -> int:
    category, name, tmp = argv
    verdict, detail = run_in_process(find(category, name), Path(tmp))
    print(f"{verdict} {' '.join(detail.split())}", flush=True)
    return 0
