"""Sandboxed execution of model-written Python against test cases (the code_exec reward).

Each execution is a separate process (rewards/_sandbox_child.py) with:

  * wall-clock limit (parent kills the whole process group) and RLIMIT_CPU;
  * RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_NOFILE, no core dumps;
  * a fresh, empty, private working directory (a size-capped tmpfs on /tmp when mount
    namespaces are available, else a new 0700 temporary directory);
  * an environment of PATH/HOME/LANG only, stdin = /dev/null, inherited descriptors closed;
  * network, PID, IPC and UTS namespaces and a read-only view of every mount (as root, or via
    an unprivileged user namespace where the kernel allows it);
  * an unprivileged uid/gid of its own (when started as root), with PR_SET_NO_NEW_PRIVS;
  * output read up to `max_output` bytes, then the process is killed.

How the namespaces and mounts are made is the `mode` (rewards.sandbox): `bwrap` runs the
launcher under bubblewrap (https://github.com/containers/bubblewrap, the sandbox of Flatpak) with
the same namespaces, read-only root, private /tmp, /proc and /dev; `namespaces` has the launcher
unshare and remount itself; `none` keeps only the rlimits, wall clock and output cap. `auto` is
bwrap when it is on PATH and works here, else namespaces.

`Result.protections` lists what was in force; docs/rewards.md says what remains without each.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

CHILD = Path(__file__).with_name("_sandbox_child.py")
UID_BASE = 1_500_000  # sandbox uids: UID_BASE + (pid mod 100000) * 64 + slot, never a real account
STARTUP_S = 60.0  # interpreter start + namespace setup, before the wall clock starts
MODES = ("auto", "bwrap", "namespaces", "none")
# What the bwrap command line below puts in force (the launcher adds rlimits, no_new_privs, uid).
BWRAP_PROTECTIONS = ["network", "pid", "ipc", "readonly_fs", "private_tmp", "private_proc"]


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_output: int = 65536
    nproc: int = 16
    fsize_mb: int = 16
    nofile: int = 64
    tmpfs_mb: int = 64


@dataclass
class Result:
    status: str  # ok | error (solution raised) | timeout | output_limit | crashed | sandbox_error
    passed: int = 0
    total: int = 0
    output: str = ""
    error: str | None = None
    returncode: int | None = None
    protections: list = field(default_factory=list)

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
    """The last fenced code block (```python … ```), else the whole completion."""
    blocks = _FENCE.findall(text or "")
    return blocks[-1] if blocks else (text or "")


def normalize_tests(tests) -> list[str]:
    """A column value -> a list of test snippets: a list of asserts, a JSON list, or one code string."""
    if tests is None:
        return []
    if isinstance(tests, str):
        text = tests.strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
                if isinstance(parsed, list):
                    return [str(t) for t in parsed if str(t).strip()]
            except json.JSONDecodeError:
                pass
        return [text] if text else []
    return [str(t) for t in tests if str(t).strip()]


# ---- uid slots: one unprivileged uid per concurrent execution ---------------------------------------

_slots_lock = threading.Lock()
_free_slots = list(range(64))


def _take_slot() -> int:
    with _slots_lock:
        return _free_slots.pop(0) if _free_slots else 63


def _give_slot(slot: int) -> None:
    with _slots_lock:
        if slot not in _free_slots:
            _free_slots.append(slot)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def uid_processes(uid: int) -> list[int]:
    """Live processes whose real uid is `uid` (a sandbox uid is never shared with anything else)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def _reap_uid(uid: int, patience_s: float = 10.0) -> None:
    """SIGKILL whatever still runs as `uid` (the PID namespace normally took it down already)."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        pids = uid_processes(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _bwrap_argv(limits: Limits) -> list[str]:
    """bubblewrap's own flags: new net/pid/ipc/uts namespaces, / read-only, a fresh /dev, /proc and a
    size-capped 0700 tmpfs on /tmp as the working directory; killed with its parent."""
    return [
        shutil.which("bwrap") or "bwrap",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--remount-ro",
        "/dev",
        "--proc",
        "/proc",
        "--size",
        str(limits.tmpfs_mb * 2**20),
        "--perms",
        "0700",
        "--tmpfs",
        "/tmp",
        *_rebind_under_tmp(),
        "--chdir",
        "/tmp",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--",
    ]


def _rebind_under_tmp() -> list[str]:
    """The interpreter's environment and the launcher, bound back read-only when they live under /tmp (a
    venv or a checkout there), which the sandbox's private tmpfs would otherwise hide."""
    out = []
    for path in sorted({Path(sys.prefix), CHILD.parent}):
        if path.is_relative_to("/tmp"):
            out += ["--ro-bind", str(path), str(path)]
    return out


@lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bwrap cannot be used here (not on PATH, or it fails to set up its namespaces); None = usable."""
    if shutil.which("bwrap") is None:
        return "bwrap is not on PATH (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        done = subprocess.run(
            [*_bwrap_argv(Limits()), "/bin/true"], capture_output=True, timeout=STARTUP_S, env={"PATH": "/usr/bin:/bin"}
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap could not start ({err})"
    if done.returncode:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap fails here: {why[-1] if why else f'exit code {done.returncode}'}"
    return None


def resolve(mode: str) -> str:
    """The mode that runs: auto -> bwrap when usable, else namespaces."""
    if mode not in MODES:
        raise ValueError(f"sandbox mode {mode!r}: allowed: {', '.join(MODES)}")
    if mode == "auto":
        return "namespaces" if bwrap_problem() else "bwrap"
    return mode


def run(code: str, tests: list[str], limits: Limits = Limits(), mode: str = "auto") -> Result:
    """Run `code`, then each test snippet in the same namespace; count the tests that pass."""
    mode = resolve(mode)
    slot = _take_slot()
    uid = UID_BASE + (os.getpid() % 100_000) * 64 + slot
    workdir = tempfile.mkdtemp(prefix="grpo-sandbox-")
    read_fd, write_fd = os.pipe()
    proc = None
    try:
        if os.geteuid() == 0:
            os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
        job = {
            "code": code,
            "tests": tests,
            "uid": uid,
            "workdir": workdir,
            "result_fd": write_fd,
            "cpu_s": limits.cpu_s,
            "memory_mb": limits.memory_mb,
            "fsize_mb": limits.fsize_mb,
            "nofile": limits.nofile,
            "nproc": limits.nproc,
            "tmpfs_mb": limits.tmpfs_mb,
            "mode": mode,
            "bwrap_protections": BWRAP_PROTECTIONS,
        }
        wrapper = _bwrap_argv(limits) if mode == "bwrap" else []
        proc = subprocess.Popen(
            [*wrapper, sys.executable, "-I", str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
            start_new_session=True,
            cwd=workdir,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
        os.close(write_fd)
        write_fd = -1
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        return _collect(proc, read_fd, limits, len(tests))
    finally:
        if proc is not None:
            _kill_group(proc)
            proc.wait()
            proc.stdout.close()
        if os.geteuid() == 0:
            _reap_uid(uid)
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
        _give_slot(slot)


def _collect(proc: subprocess.Popen, result_fd: int, limits: Limits, total: int) -> Result:
    """Read output (capped) and the result channel until both close or a limit is hit."""
    sel = selectors.DefaultSelector()
    out_fd = proc.stdout.fileno()
    sel.register(out_fd, selectors.EVENT_READ, "out")
    sel.register(result_fd, selectors.EVENT_READ, "result")
    output, report = bytearray(), bytearray()
    deadline = time.monotonic() + STARTUP_S
    started = False
    status = None
    open_fds = 2
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timeout"
            break
        for key, _ in sel.select(timeout=min(left, 1.0)):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fd)
                open_fds -= 1
                continue
            if key.data == "out":
                output += chunk
                if len(output) > limits.max_output:
                    status = "output_limit"
            elif len(report) < 1 << 20:
                report += chunk
                if not started and report.startswith(b"R"):
                    started = True
                    deadline = time.monotonic() + limits.wall_s
        if status:
            break
    sel.close()
    if status:
        _kill_group(proc)
    proc.wait()
    text = output[: limits.max_output].decode("utf-8", "replace")
    parsed = None
    for line in reversed(bytes(report).splitlines()):
        try:
            parsed = json.loads(line)
            break
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
    protections = (parsed or {}).get("protections", []) if isinstance(parsed, dict) else []
    if status:
        return Result(status, 0, total, text, f"{status}: killed", proc.returncode, protections)
    if not isinstance(parsed, dict):
        why = "sandbox_error" if not started else "crashed"
        return Result(why, 0, total, text, f"no result (exit code {proc.returncode})", proc.returncode, protections)
    error = parsed.get("error")
    if error and error.startswith("sandbox setup failed"):
        return Result("sandbox_error", 0, total, text, error, proc.returncode, protections)
    passed = int(parsed.get("passed", 0)) if not error else 0
    return Result("error" if error else "ok", min(passed, total), total, text, error, proc.returncode, protections)


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def run_many(
    jobs: list[tuple[str, list[str]]], limits: Limits = Limits(), workers: int = 0, mode: str = "auto"
) -> list[Result]:
    """Run (code, tests) jobs in parallel, at most `workers` at a time (0 = one per CPU core)."""
    mode = resolve(mode)
    todo = [(i, code, tests) for i, (code, tests) in enumerate(jobs) if tests]
    results = [Result("ok", 0, 0) for _ in jobs]
    if not todo:
        return results
    with ThreadPoolExecutor(max_workers=min(len(todo), workers or default_workers())) as pool:
        for i, res in zip([t[0] for t in todo], pool.map(lambda t: run(t[1], t[2], limits, mode), todo)):
            results[i] = res
    return results
