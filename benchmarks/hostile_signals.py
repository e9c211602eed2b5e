"""The fault suite's hostile cases for signals (benchmarks/fault_probes.py says how they run): SIGTERM, SIGINT,
SIGHUP, SIGQUIT, SIGUSR1 and SIGKILL sent to `grpo-studio train` (the supervisor) and to its trainer, at each phase
of a run: while python starts, before the lock, while loading, mid-step, while a checkpoint is written, during
eval; twice; and the supervisor killed. The promise (docs/design.md, "Process model"): a stop is graceful and says
so in one line (exit 0), SIGHUP detaches the run (it goes on, its output into RUN/stdout.log), a trainer killed
gets its `crashed` from the supervisor, and a trainer whose supervisor died stops and writes its own `stopped`.
Each case trains the bundled tiny model in real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import psutil

from ..contract import rundir
from ..contract.run_files import CHECKPOINTS, CONFIG, PIDFILE, STATE_EVENTS, STDOUT, checkpoint_folders
from ..contract.run_reader import read_events
from .fault_probes import Probe
from .fault_trials import SMALL, start

CATEGORY = "signals"
LONG = [s for s in SMALL if not s.startswith("train.steps")] + ["train.steps=200"]  # still running when signalled
SHORT = [s for s in SMALL if not s.startswith("train.steps")] + ["train.steps=3"]
PAUSE_ENV = "GRPO_STUDIO_TEST_CHECKPOINT_PAUSE_S"  # engine/out/checkpoint.py's test hook
WAIT_S = 240.0


def wait_for(what: str, ready, proc: subprocess.Popen | None = None, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited ({proc.returncode}) before {what}: {proc.stderr.read()[-500:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {timeout:g} s")
        time.sleep(0.02)


def has(run: Path, event: str) -> bool:
    return any(e["event"] == event for e in read_events(run))


def trainer(proc: subprocess.Popen) -> psutil.Process:
    """The supervisor's child, once it exists."""
    box = []
    wait_for("trainer process", lambda: box.extend(psutil.Process(proc.pid).children()) or box, proc)
    return box[0]


def at(phase: str, run: Path, proc: subprocess.Popen) -> None:
    """Wait until the run is in `phase`."""
    if phase == "starting":  # the trainer's python is starting (its signals held)
        trainer(proc)
    elif phase == "loading":  # the lock is taken, nothing trained yet
        wait_for("config.toml", lambda: (run / CONFIG).exists(), proc)
    elif phase == "step":
        wait_for("step 1", lambda: (run / rundir.METRICS).exists(), proc)
    elif phase == "checkpoint":  # the weights written, the trainer state not yet (PAUSE_ENV)
        wait_for("a checkpoint write", lambda: any((run / CHECKPOINTS).glob(".step-*.tmp")), proc)
    elif phase == "eval":  # train.eval_every = 1: the first step's row waits for its eval
        wait_for("step 1's sampling", lambda: has(run, "started"), proc)
        time.sleep(1.0)


def end(proc: subprocess.Popen, timeout: float = WAIT_S) -> tuple[int | None, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err
    return proc.returncode, out, err


def last_state(run: Path) -> dict:
    states = [e for e in read_events(run) if e["event"] in STATE_EVENTS]
    return states[-1] if states else {}


def stops(tmp: Path, phase: str, sig: int, to: str = "supervisor", times: int = 1) -> str | None:
    """A stop at `phase`: exit 0, one `stopped ...` line on stdout, a `stopped` event (none before the lock: then
    nothing written at all), the lock gone, no traceback."""
    run = tmp / "run"
    env = {**os.environ, PAUSE_ENV: "3"} if phase == "checkpoint" else None
    sets = [*LONG, "train.eval_every=1", "data.eval_size=200"] if phase == "eval" else LONG
    proc = _start(run, sets, env)
    at(phase, run, proc)
    target = proc.pid if to == "supervisor" else trainer(proc).pid
    for _ in range(times):
        os.kill(target, sig)
        time.sleep(0.2)
    code, out, err = end(proc)
    name = signal.Signals(sig).name
    lines = [line for line in out.splitlines() if line.startswith("stopped")]
    if code != 0 or "Traceback" in err or len(lines) != 1:
        return f"exit {code}, stopped lines {lines}: {err[-400:]!r}"
    if phase == "starting":
        want = f"stopped while loading ({name}), before anything was written: {run}"
        return None if lines == [want] and not run.exists() else f"{lines}, run directory left: {run.exists()}"
    want = f"stopped while loading ({name}): {run}" if phase == "loading" else None
    if want is not None and lines != [want]:
        return f"{lines}, expected [{want!r}]"
    state = last_state(run)
    if state.get("event") != "stopped" or (run / PIDFILE).exists():
        return f"last state event {state}, lock left: {(run / PIDFILE).exists()}"
    if phase == "checkpoint" and not checkpoint_folders(run):
        return "no checkpoint after a stop during a checkpoint write"
    return None


def detaches(tmp: Path, phase: str, to: str) -> str | None:
    """SIGHUP: the run goes on to its end (exit 0, `finished`), what it printed after it is in stdout.log."""
    run = tmp / "run"
    proc = _start(run, SHORT)
    at(phase, run, proc)
    if to == "group":  # a terminal's hangup reaches its whole foreground process group
        os.killpg(proc.pid, signal.SIGHUP)
    else:
        os.kill(proc.pid if to == "supervisor" else trainer(proc).pid, signal.SIGHUP)
    code, out, err = end(proc)
    log = (run / STDOUT).read_text() if (run / STDOUT).exists() else ""
    if code != 0 or last_state(run).get("event") != "finished" or f"finished at step 3: {run}" not in log:
        return f"exit {code}, last state {last_state(run)}, stdout.log {log[-300:]!r}: {err[-300:]!r}"
    return None


def hangup_then_stop(tmp: Path) -> str | None:
    """SIGHUP, then SIGTERM: detached, then stopped gracefully, the stop's line in stdout.log."""
    run = tmp / "run"
    proc = _start(run, LONG)
    at("step", run, proc)
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    code, _, err = end(proc)
    log = (run / STDOUT).read_text() if (run / STDOUT).exists() else ""
    ok = code == 0 and last_state(run).get("event") == "stopped" and "stopped at step" in log
    return None if ok else f"exit {code}, last state {last_state(run)}, stdout.log {log[-300:]!r}: {err[-300:]!r}"


def ignores(pid: int, sig: int) -> bool:
    """Whether process `pid` ignores `sig` (inherited: a shell's background job ignores SIGINT and SIGQUIT)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return bool(mask >> (sig - 1) & 1)


def ignored(proc: subprocess.Popen, run: Path, sig: int, pid: int) -> str | None:
    """`sig` sent to `pid`, which ignores it: the run goes on (a step more), and a SIGTERM then stops it."""
    os.kill(pid, sig)
    rows = len(rundir.read_rows(run / rundir.METRICS))
    wait_for("a step after the ignored signal", lambda: len(rundir.read_rows(run / rundir.METRICS)) > rows, proc)
    proc.send_signal(signal.SIGTERM)
    code, _, err = end(proc)
    ok = code == 0 and last_state(run).get("event") == "stopped"
    return None if ok else f"exit {code}, last state {last_state(run)}: {err[-300:]!r}"


def supervisor_dies(tmp: Path, phase: str, sig: int) -> str | None:
    """The supervisor ended by `sig` (SIGKILL, or a signal it leaves at its default): its trainer stops gracefully
    and writes its own `stopped`, and lets its lock go. A supervisor that inherited `sig` ignored lives on."""
    run = tmp / "run"
    proc = _start(run, LONG)
    at(phase, run, proc)
    child = trainer(proc)
    if ignores(proc.pid, sig):
        return ignored(proc, run, sig, proc.pid)
    proc.send_signal(sig)
    end(proc)
    try:
        child.wait(WAIT_S)
    except psutil.TimeoutExpired:
        child.kill()
        return f"the trainer outlived its supervisor by {WAIT_S:g} s"
    state = last_state(run)
    if state.get("event") != "stopped" or (run / PIDFILE).exists():
        return f"last state event {state}, lock left: {(run / PIDFILE).exists()}"
    return None


def trainer_killed(tmp: Path, sig: int) -> str | None:
    """The trainer ended by `sig` mid-run: the supervisor writes `crashed` naming it and exits 128 + N, one line
    (a trainer that inherited `sig` ignored trains on)."""
    run = tmp / "run"
    proc = _start(run, LONG)
    at("step", run, proc)
    child = trainer(proc)
    if ignores(child.pid, sig):
        return ignored(proc, run, sig, child.pid)
    child.send_signal(sig)
    code, _, err = end(proc)
    name = signal.Signals(sig).name
    state = last_state(run)
    lines = err.strip().splitlines()
    ok = code == 128 + sig and state.get("event") == "crashed" and state.get("signal") == name and len(lines) == 1
    return None if ok and not (run / PIDFILE).exists() else f"exit {code}, last state {state}, stderr {err[-400:]!r}"


def early_kill(tmp: Path) -> str | None:
    """SIGTERM while the supervisor's python starts (before it has a handler): it dies, nothing is started or
    written."""
    run = tmp / "run"
    proc = _start(run, LONG)
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    code, _, _ = end(proc)
    if code != -signal.SIGTERM and code != 0:
        return f"exit {code}"
    return "a run directory was left" if run.exists() and any(run.iterdir()) else None


def detach_output_redirects(tmp: Path) -> str | None:
    """rundir.detach_output: a pipe's output goes on into stdout.log; output already going to a file stays."""
    script = (
        "import sys; from grpo_studio.contract import rundir; print('before', flush=True); "
        f"rundir.detach_output({str(tmp)!r}); print('after', flush=True); print('err', file=sys.stderr, flush=True)"
    )
    with open(tmp / "own.log", "w") as own:
        done = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=own, text=True, timeout=60)
    log = (tmp / STDOUT).read_text() if (tmp / STDOUT).exists() else ""
    own_log = (tmp / "own.log").read_text()
    if (done.returncode, done.stdout, log, own_log) != (0, "before\n", "after\n", "err\n"):
        return f"exit {done.returncode}, pipe {done.stdout!r}, stdout.log {log!r}, stderr file {own_log!r}"
    return None


def _start(run: Path, sets: list[str], env: dict | None = None) -> subprocess.Popen:
    """fault_trials.start of tiny-arith into `run`, with `env` added to this process's environment meanwhile."""
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        return start("tiny-arith", "--run-dir", str(run), sets=sets)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value


def cases() -> list:
    slow = partial(Probe, CATEGORY, timeout_s=300, slow=True)
    term, intr = signal.SIGTERM, signal.SIGINT
    return [
        Probe(CATEGORY, "detach_output: pipe to stdout.log, a file stays", detach_output_redirects),
        slow("SIGTERM while the supervisor starts", early_kill),
        slow("SIGTERM before the lock", partial(stops, phase="starting", sig=term)),
        slow("SIGINT before the lock", partial(stops, phase="starting", sig=intr)),
        slow("SIGTERM to the supervisor while loading", partial(stops, phase="loading", sig=term)),
        slow("SIGINT to the supervisor while loading", partial(stops, phase="loading", sig=intr)),
        slow("SIGTERM to the trainer while loading", partial(stops, phase="loading", sig=term, to="trainer")),
        slow("SIGTERM twice while loading", partial(stops, phase="loading", sig=term, times=2)),
        slow("SIGTERM mid-step", partial(stops, phase="step", sig=term)),
        slow("SIGINT mid-step", partial(stops, phase="step", sig=intr)),
        slow("SIGINT twice mid-step", partial(stops, phase="step", sig=intr, times=2)),
        slow("SIGTERM to the trainer mid-step", partial(stops, phase="step", sig=term, to="trainer")),
        slow("SIGTERM during a checkpoint write", partial(stops, phase="checkpoint", sig=term, to="trainer")),
        slow("SIGTERM during eval", partial(stops, phase="eval", sig=term)),
        slow("SIGHUP to the supervisor", partial(detaches, phase="step", to="supervisor")),
        slow("SIGHUP to the trainer", partial(detaches, phase="step", to="trainer")),
        slow("SIGHUP to the process group", partial(detaches, phase="step", to="group")),
        slow("SIGHUP while loading", partial(detaches, phase="loading", to="group")),
        slow("SIGHUP then SIGTERM", hangup_then_stop),
        slow("SIGKILL of the supervisor mid-run", partial(supervisor_dies, phase="step", sig=signal.SIGKILL)),
        slow("SIGKILL of the supervisor while loading", partial(supervisor_dies, phase="loading", sig=signal.SIGKILL)),
        slow("SIGQUIT to the supervisor", partial(supervisor_dies, phase="step", sig=signal.SIGQUIT)),
        slow("SIGUSR1 to the supervisor", partial(supervisor_dies, phase="step", sig=signal.SIGUSR1)),
        slow("SIGQUIT to the trainer", partial(trainer_killed, sig=signal.SIGQUIT)),
        slow("SIGUSR1 to the trainer", partial(trainer_killed, sig=signal.SIGUSR1)),
        slow("SIGKILL of the trainer", partial(trainer_killed, sig=signal.SIGKILL)),
        slow("SIGHUP to the trainer while loading", partial(detaches, phase="loading", to="trainer")),
    ]
