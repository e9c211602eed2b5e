"""`grpo-studio bench faults [--json] [--fast]`: the fault suite, as a hostile user would run it.

Every generated case (benchmarks/fault_cases.py) runs as a real `grpo-studio` process in a folder of its
own, with a time limit, and is judged:

  held        what the case expects: a refusal is exit code 2 with one line on stderr and no run directory
              left behind; a reader shows what it can with exit code 0
  traceback   "Traceback" on stderr
  hang        still running at the time limit
  wrong       anything else (a refusal in two lines, a refused run that left files, exit 1, ...)

The hostile cases of each feature follow (benchmarks/fault_probes.py: environments, model text, the rollout
server, readers, resume, data, signals, the model cache), command lines and probes alike.

Then, unless --fast, the slow trials (benchmarks/fault_trials.py: kill -9 and resume, a full disk, divergence,
two trainers on one run directory), which also count the steps a run directory lost or holds twice.

The report is one row per category: tried, held, each way of failing, and steps lost / duplicated.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .fault_cases import CRASHED, REFUSED, Case, fast_cases
from .fault_probes import Probe, hostile_cases

TIMEOUT_S = 120
VERDICTS = ("held", "traceback", "hang", "wrong", "skipped")


@dataclass
class Outcome:
    code: int | None  # None: it hung
    stdout: str
    stderr: str

    def verdict(self, case: Case, tmp: Path) -> str:
        if self.code is None:
            return "hang"
        if "Traceback" in self.stderr:
            return "traceback"
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        if case.expect == REFUSED:
            held = self.code == 2 and len(lines) == 1 and not (tmp / "run").exists()
        elif case.expect == CRASHED:
            held = self.code not in (0, 2) and len(lines) == 1
        else:  # READ
            held = self.code == 0 or (self.code == 2 and len(lines) == 1)
        return "held" if held else "wrong"


def run_process(argv: list[str], cwd: Path, timeout: float = TIMEOUT_S) -> Outcome:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "grpo_studio.cli.main", *argv],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=env,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            errors="backslashreplace",  # a command's odd bytes are part of what is judged, not a decode error
        )
    except subprocess.TimeoutExpired as late:
        return Outcome(None, str(late.stdout or ""), str(late.stderr or ""))
    return Outcome(done.returncode, done.stdout, done.stderr)


def run_in_process(argv: list[str], cwd: Path, main: Callable[[list[str]], int]) -> Outcome:
    """The same command through the CLI's `main` in this process (tens of milliseconds instead of a second; the
    test suite hands it cli.main.main, as a benchmark never imports the front door), with file descriptors 1
    and 2 captured, so a child the command starts is captured too. An exception that escapes main() is what a
    user would see as a traceback."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, _fds_to(out, err), _cwd(cwd):
        try:
            code = main(argv)
        except BaseException as escaped:  # noqa: BLE001 - exactly what the suite looks for
            print(f"Traceback (escaped main): {escaped!r}", file=sys.stderr)
            code = 1
        sys.stdout.flush(), sys.stderr.flush()
        out.seek(0), err.seek(0)
        return Outcome(code, out.read().decode(errors="replace"), err.read().decode(errors="replace"))


@contextlib.contextmanager
def _fds_to(out, err):
    """File descriptors 1 and 2 into `out` and `err`, and sys.stdout / sys.stderr onto them (a test runner may
    have replaced those objects with its own)."""
    saved, streams = (os.dup(1), os.dup(2)), (sys.stdout, sys.stderr)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
    sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)  # noqa: SIM115
    try:
        yield
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        os.close(saved[0]), os.close(saved[1])


@contextlib.contextmanager
def _cwd(path: Path):
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def judge(case: Case | Probe, main: Callable[[list[str]], int] | None = None) -> tuple[str, Outcome]:
    """A command-line case or a probe (benchmarks/fault_probes.py), in a fresh folder; a probe's detail is its
    Outcome's stderr. With the CLI's `main`, both run in this process; without, each in a fresh one."""
    from . import fault_probes

    with tempfile.TemporaryDirectory(prefix="fault-") as folder:
        tmp = Path(folder)
        if isinstance(case, Probe):
            verdict, detail = (fault_probes.run_in_process if main else fault_probes.run_process)(case, tmp)
            return verdict, Outcome(0 if verdict == "held" else 1, "", detail)
        argv = case.materialise(tmp)
        outcome = run_in_process(argv, tmp, main) if main else run_process(argv, tmp)
        return outcome.verdict(case, tmp), outcome


def run(cases: list[Case] | None = None, slow: bool = True) -> dict:
    table: dict[str, dict[str, int]] = {}
    failures = []
    t0 = time.perf_counter()

    def record(category: str, name: str, verdict: str, lost: int = 0, twice: int = 0, detail: str = "") -> None:
        row = table.setdefault(category, {"tried": 0, **dict.fromkeys(VERDICTS, 0), "lost": 0, "twice": 0})
        row["tried"] += 1
        row[verdict] += 1
        row["lost"] += lost
        row["twice"] += twice
        if verdict not in ("held", "skipped") or lost or twice:
            failures.append({"category": category, "case": name, "verdict": verdict, "detail": detail})

    for case in fast_cases() + hostile_cases() if cases is None else cases:
        if case.slow and not slow:
            record(case.category, case.name, "skipped", detail="slow: runs without --fast")
            continue
        verdict, outcome = judge(case)
        record(case.category, case.name, verdict, detail=f"exit {outcome.code}: {outcome.stderr.strip()[-400:]}")
    if slow:
        from .fault_trials import trials

        for category, name, trial in trials():
            with tempfile.TemporaryDirectory(prefix="fault-") as folder:
                result = trial(Path(folder))
            record(category, name, result["verdict"], result["lost"], result["twice"], result["detail"])
    return {"table": table, "failures": failures, "seconds": round(time.perf_counter() - t0, 1)}


def print_report(report: dict) -> None:
    columns = (*VERDICTS, "lost", "twice")
    print(f"{'category':<13} {'tried':>6} " + " ".join(f"{c:>9}" for c in columns))
    for category, row in report["table"].items():
        print(f"{category:<13} {row['tried']:>6} " + " ".join(f"{row[c]:>9}" for c in columns))
    total = {c: sum(row[c] for row in report["table"].values()) for c in ("tried", *columns)}
    print(f"{'all':<13} {total['tried']:>6} " + " ".join(f"{total[c]:>9}" for c in columns))
    for f in report["failures"]:
        print(f"  {f['verdict']:<9} {f['category']}: {f['case']}: {f['detail'][-240:]}")
    print(f"{report['seconds']} s")
