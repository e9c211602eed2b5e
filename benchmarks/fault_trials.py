"""The fault suite's slow categories, each a real training of the bundled tiny model: `kill -9` then
`--resume`, a disk that fills, a run that diverges, two trainers on one run directory. Each trial ends in
one of the verdicts of faults_bench.py, and those that resume count the steps the run directory lost or
holds twice: the suite's promise is zero of both.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..contract import rundir

STEPS = 8
SMALL = [
    "train.prompts_per_step=4",
    "rollout.num_generations=4",
    f"train.steps={STEPS}",
    "train.save_every=2",
    "rollout.backend=hf",
]


def start(*args: str, sets: list[str] = SMALL, cwd: Path | None = None) -> subprocess.Popen:
    """`grpo-studio train ...` in a session of its own, so a kill of its group kills the trainer too."""
    argv = [sys.executable, "-m", "grpo_studio.cli.main", "train", *args, *[a for s in sets for a in ("--set", s)]]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int | None, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return None, proc.communicate()[1]
    return proc.returncode, err


def step_counts(run: Path) -> tuple[int, int]:
    """Steps 1..STEPS missing from metrics.jsonl, and steps it holds more than once."""
    steps = [row["step"] for row in rundir.read_rows(run / rundir.METRICS)]
    lost = sum(1 for s in range(1, STEPS + 1) if s not in steps)
    return lost, sum(steps.count(s) - 1 for s in set(steps))


def verdict_of(code: int | None, err: str, ok: bool) -> str:
    if code is None:
        return "hang"
    if "Traceback" in err:
        return "traceback"
    return "held" if ok else "wrong"


def kill_and_resume(tmp: Path, seed: int) -> dict:
    """SIGKILL the whole train command at a random moment, then resume until the run is finished."""
    run = tmp / "run"
    proc = start("tiny-arith", "--run-dir", str(run))
    time.sleep(random.Random(seed).uniform(4.0, 14.0))
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    code, err = finish(start("--resume", str(run)))
    lost, twice = step_counts(run)
    return {
        "verdict": verdict_of(code, err, code == 0 and lost == twice == 0),
        "lost": lost,
        "twice": twice,
        "detail": err.strip()[-300:],
    }


def disk_full_then_resume(tmp: Path, size_mib: int) -> dict:
    """Train on a tmpfs of `size_mib`: a full disk is one line and exit 2; grown, the run resumes to the end."""
    disk = tmp / "disk"
    disk.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(disk)], capture_output=True
        ).returncode
        != 0
    ):
        return {"verdict": "skipped", "lost": 0, "twice": 0, "detail": "cannot mount a tmpfs (needs root)"}
    try:
        run = disk / "run"
        code, err = finish(start("tiny-arith", "--run-dir", str(run), sets=[*SMALL, "train.save_every=1"]))
        lines = [line for line in err.splitlines() if line.strip()]
        full_ok = code == 0 or (code == 2 and "no space left on device" in lines[-1])
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        code2, err2 = (code, err) if code == 0 else finish(start("--resume", str(run)))
        lost, twice = step_counts(run)
        ok = full_ok and code2 == 0 and lost == twice == 0
        return {
            "verdict": verdict_of(code2, err + err2, ok),
            "lost": lost,
            "twice": twice,
            "detail": (lines[-1] if lines else "")[-300:],
        }
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def diverge_then_resume(tmp: Path, dtype: str) -> dict:
    """train.lr = 50: the run must say so (a `diverged` or `collapsed` event, not "finished"), every step it ran
    has its row, and a resume with a sane lr starts from the last good checkpoint."""
    run = tmp / "run"
    sets = [*SMALL, "train.lr=50", f"model.dtype={dtype}", "train.save_every=1"]
    code, err = finish(start("tiny-arith", "--run-dir", str(run), sets=sets))
    events = rundir.read_events(run)
    bad = [e for e in events if e["event"] in ("diverged", "collapsed")]
    said = bool(bad) and not any(e["event"] == "finished" for e in events)
    last_good = bad[-1].get("last_good_step") if bad else None
    code2, err2 = finish(start("--resume", str(run), sets=[*SMALL, f"model.dtype={dtype}", "train.lr=1e-4"]))
    started = [e["message"] for e in rundir.read_events(run) if e["event"] == "started"]
    resumed_at = started[-1] if len(started) > 1 else None
    from_good = last_good is not None and resumed_at == f"resumed at step {last_good}"
    lost, twice = step_counts(run)
    ok = said and from_good and code2 == 0 and lost == twice == 0
    return {
        "verdict": verdict_of(code2, err + err2, ok),
        "lost": lost,
        "twice": twice,
        "detail": f"events {[e['event'] for e in bad]}, last good {last_good}, {resumed_at}",
    }


def two_trainers(tmp: Path, how: str) -> dict:
    """Two trainers, one run directory: exactly one trains; the other is one line, exit 2, and writes nothing."""
    run = tmp / "run"
    first = start("tiny-arith", "--run-dir", str(run))
    if how == "at once":
        second = start("tiny-arith", "--run-dir", str(run))
    else:
        deadline = time.monotonic() + 120
        while not (run / rundir.METRICS).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        args = ("--resume", str(run)) if how == "resume while running" else ("tiny-arith", "--run-dir", str(run))
        second = start(*args)
    (c1, e1), (c2, e2) = finish(first), finish(second)
    if how == "after it finished":
        c2, e2 = finish(start("tiny-arith", "--run-dir", str(run)))
    codes = sorted([c1, c2], key=lambda c: (c is None, c))
    refused = [e for c, e in ((c1, e1), (c2, e2)) if c == 2]
    one_line = len(refused) == 1 and len([ln for ln in refused[0].splitlines() if ln.strip()]) == 1
    lost, twice = step_counts(run)
    started = sum(e["event"] == "started" for e in rundir.read_events(run))
    ok = codes == [0, 2] and one_line and lost == twice == 0 and started == 1
    return {
        "verdict": verdict_of(c1 if c1 is None else c2, e1 + e2, ok),
        "lost": lost,
        "twice": twice,
        "detail": f"exit codes {c1}, {c2}; {started} started; {(refused or [''])[0].strip()[:200]}",
    }


def trials(kills: int = 10) -> list[tuple[str, str, callable]]:
    """(category, name, fn(tmp) -> result) for every slow trial."""
    out = [("kill -9", f"kill {i}", lambda tmp, i=i: kill_and_resume(tmp, i)) for i in range(kills)]
    out += [("disk full", f"{m} MiB", lambda tmp, m=m: disk_full_then_resume(tmp, m)) for m in (2, 3, 4, 5, 6, 8, 12)]
    out += [
        ("divergence", f"lr=50 {d}", lambda tmp, d=d: diverge_then_resume(tmp, d)) for d in ("fp32", "bf16", "fp16")
    ]
    out += [
        ("two trainers", how, lambda tmp, how=how: two_trainers(tmp, how))
        for how in ("at once", "second mid-run", "resume while running", "after it finished")
    ]
    return out
