"""The code-execution sandbox against hostile completions. Every hostile program is bounded in
itself (a fork loop of 64, a 10 GiB request that fails at once, 1 GiB printed in 1 MiB chunks),
so even an uncontained run could not hurt the shared machine; the assertions check that the
sandbox contained it, and that nothing it started is left running. The table runs under both
sandboxes: bubblewrap (skipped only where bwrap is absent or cannot work) and the launcher's own
namespaces."""

from __future__ import annotations

import os
import sys

import pytest

from grpo_studio.rewards import builtin, sandbox
from grpo_studio.rewards.builtin import Options

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox uses Linux namespaces and rlimits")

LIMITS = sandbox.Limits(wall_s=3.0, cpu_s=2, memory_mb=512, max_output=65536, nproc=16)
ADD = "def add(a, b):\n    return a + b\n"


def leftover_processes() -> list[int]:
    """Processes of any sandbox uid still alive."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as fh:
                    uid = next(int(line.split()[1]) for line in fh if line.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if uid >= sandbox.UID_BASE:
                pids.append(int(entry))
    return pids


@pytest.fixture(autouse=True)
def machine_is_fine_afterwards():
    yield
    assert leftover_processes() == []


@pytest.fixture(params=["bwrap", "namespaces"])
def mode(request):
    if request.param == "bwrap" and sandbox.bwrap_problem():
        pytest.skip(sandbox.bwrap_problem())
    return request.param


def test_correct_solution_scores_and_wrong_one_does_not(mode):
    ok = sandbox.run(ADD, ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], LIMITS, mode)
    assert (ok.status, ok.passed, ok.total, ok.score) == ("ok", 2, 2, 1.0)
    half = sandbox.run(
        "def add(a, b):\n    return 3\n", ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], LIMITS, mode
    )
    assert (half.status, half.passed, half.score) == ("ok", 1, 0.5)
    broken = sandbox.run("def add(a, b) return", ["assert add(1, 2) == 3"], LIMITS, mode)
    assert broken.status == "error" and broken.error.startswith("SyntaxError") and broken.score == 0.0


def test_code_exec_reward_extracts_the_code_block_and_runs_in_parallel(mode):
    completions = [
        f"Here you go:\n```python\n{ADD}```\n",
        "```python\ndef add(a, b):\n    return a - b\n```",
        "no code at all",
        "```python\nwhile True: pass\n```",
    ]
    tests = [["assert add(1, 2) == 3", "assert add(2, 2) == 4"]] * 4
    opts = Options(code_timeout_s=2.0, code_workers=2, sandbox=mode)
    assert builtin.code_exec(["q"] * 5, completions + ["x"], opts, tests=tests + [[]]) == [1.0, 0.0, 0.0, 0.0, None]


def test_infinite_loop_is_killed(mode):
    r = sandbox.run("while True:\n    pass\n", ["assert True"], LIMITS, mode)
    assert r.status in ("timeout", "crashed") and r.score == 0.0  # wall clock or RLIMIT_CPU, whichever first


def test_fork_bomb_is_capped_by_the_process_limit(mode):
    code = (
        "import os, time\nok = failed = 0\nfor _ in range(64):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        failed += 1\n        continue\n    if pid == 0:\n        time.sleep(60)\n"
        "        os._exit(0)\n    ok += 1\nprint(ok, failed, flush=True)\n"
    )
    r = sandbox.run(code, ["assert True"], LIMITS, mode)
    ok, failed = map(int, r.output.split())
    assert ok + failed == 64
    assert ok <= LIMITS.nproc - 1 and failed >= 64 - (LIMITS.nproc - 1)
    # the sleeping children died with the sandbox (checked by the fixture)


def test_ten_gib_allocation_fails_inside(mode):
    r = sandbox.run("x = bytearray(10 * 2**30)\n", ["assert True"], LIMITS, mode)
    assert (r.status, r.error, r.score) == ("error", "MemoryError: ", 0.0)


def test_writes_outside_the_working_directory_fail(tmp_path, mode):
    target = tmp_path / "escaped.txt"
    code = (
        "import os\nresults = []\n"
        f"for path in [{str(target)!r}, '/var/tmp/escaped.txt', '/dev/shm/escaped.txt', "
        "os.path.expanduser('~root/escaped.txt'), 'inside.txt']:\n"
        "    try:\n        open(path, 'w').write('x')\n        results.append('wrote')\n"
        "    except OSError as e:\n        results.append(type(e).__name__)\n"
        "print(results, os.listdir('.'))\n"
    )
    r = sandbox.run(code, ["assert True"], LIMITS, mode)
    outside, inside = r.output.split("] [")[0], r.output.split("] [")[1]
    assert "wrote" not in outside.split(",")[:4] and outside.count("Error") == 4
    assert "'wrote']" in r.output and "inside.txt" in inside  # the fresh working directory is writable
    assert (
        not target.exists()
        and not os.path.exists("/var/tmp/escaped.txt")
        and not os.path.exists("/dev/shm/escaped.txt")
    )


def test_home_directory_and_secrets_are_out_of_reach(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("GRPO_TEST_SECRET", "s3cret-value")
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret-file")
    code = (
        "import os\nprint(sorted(os.environ))\nfor path in ["
        f"{str(secret)!r}, '/root', '/proc/1/environ', '/proc/%d/environ' % os.getppid()]:\n"
        "    try:\n        print(os.listdir(path) if os.path.isdir(path) else open(path).read())\n"
        "    except OSError as e:\n        print(type(e).__name__)\n"
    )
    r = sandbox.run(code, ["assert True"], LIMITS, mode)
    lines = r.output.splitlines()
    assert lines[0] == "['HOME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE']"
    assert "s3cret" not in r.output
    assert lines[1] in ("PermissionError", "FileNotFoundError") and lines[2] == "PermissionError"


def test_network_is_unreachable(mode):
    code = (
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n    print('connected')\n"
        "except OSError as e:\n    print(type(e).__name__, e.errno)\n"
    )
    r = sandbox.run(code, ["assert True"], LIMITS, mode)
    assert "network" in r.protections
    assert r.output.strip() == "OSError 101"  # ENETUNREACH: only a down loopback in the namespace


def test_printing_a_gigabyte_is_cut_at_the_cap(mode):
    code = "import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * 2**20)\n"
    r = sandbox.run(code, ["assert True"], LIMITS, mode)
    assert r.status == "output_limit" and r.score == 0.0
    assert r.output == "x" * LIMITS.max_output


def test_stdin_is_empty(mode):
    r = sandbox.run("import sys\nprint(repr(sys.stdin.read()))\n", ["assert True"], LIMITS, mode)
    assert r.output == "''\n" and r.score == 1.0


def test_every_protection_is_in_force(mode):
    r = sandbox.run(ADD, ["assert add(1, 2) == 3"], LIMITS, mode)
    full = ["network", "pid", "ipc", "readonly_fs", "private_tmp", "private_proc", "rlimits", "no_new_privs"]
    expected = full + ["unprivileged_uid"] if os.geteuid() == 0 else full
    assert sorted(r.protections) == sorted(expected)


def test_auto_is_bwrap_where_it_works_else_namespaces(tmp_path, monkeypatch):
    sandbox.bwrap_problem.cache_clear()
    assert sandbox.resolve("auto") == ("namespaces" if sandbox.bwrap_problem() else "bwrap")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    sandbox.bwrap_problem.cache_clear()
    try:
        assert sandbox.bwrap_problem() == "bwrap is not on PATH (Debian/Ubuntu: apt-get install bubblewrap)"
        assert sandbox.resolve("auto") == "namespaces"
        r = sandbox.run(ADD, ["assert add(1, 2) == 3"], LIMITS, "auto")
        assert r.score == 1.0 and "network" in r.protections
    finally:
        monkeypatch.undo()
        sandbox.bwrap_problem.cache_clear()


def test_none_keeps_only_the_limits(tmp_path):
    """rewards.sandbox = none (forced): the code runs as the caller, unconfined, but still bounded."""
    target = tmp_path / "reached.txt"
    r = sandbox.run(f"open({str(target)!r}, 'w').write('x')\n", ["assert True"], LIMITS, "none")
    assert (r.status, r.protections, target.read_text()) == ("ok", ["rlimits", "no_new_privs"], "x")
    loop = sandbox.run("while True:\n    pass\n", ["assert True"], LIMITS, "none")
    assert loop.status in ("timeout", "crashed") and loop.score == 0.0


REFUSED = [
    (
        ["rewards.sandbox=none"],
        "config error: rewards.sandbox = 'none': runs model-written code unconfined, as your "
        "user (rlimits and the wall clock only); use auto, bwrap or namespaces, or set rewards.sandbox_force_none = "
        "true to accept it",
    ),
    (["rewards.sandbox=jail"], "config error: rewards.sandbox = 'jail': allowed: auto, bwrap, namespaces, none"),
]


@pytest.mark.parametrize("sets, message", REFUSED, ids=[" ".join(s) for s, _ in REFUSED])
def test_sandbox_choices_are_refused_in_one_line(sets, message, tmp_path, capfd):
    from grpo_studio.cli.main import main

    args = [a for s in sets for a in ("--set", s)]
    assert main(["train", *args, "--run-dir", str(tmp_path / "run")]) == 2
    assert capfd.readouterr().err.strip().splitlines() == [message]


def test_bwrap_where_it_cannot_run_is_refused_in_one_line(tmp_path, monkeypatch):
    from grpo_studio.contract.config import load
    from grpo_studio.contract.errors import UserError
    from grpo_studio.rewards import build

    monkeypatch.setenv("PATH", str(tmp_path))  # this machine without bwrap
    sandbox.bwrap_problem.cache_clear()
    try:
        with pytest.raises(UserError) as err:
            build(load("tiny-arith", ['rewards.funcs=["code_exec"]', "rewards.sandbox=bwrap"]).rewards)
        assert str(err.value) == (
            "config error: rewards.sandbox = 'bwrap': bwrap is not on PATH (Debian/Ubuntu: "
            "apt-get install bubblewrap); use auto or namespaces"
        )
    finally:
        monkeypatch.undo()
        sandbox.bwrap_problem.cache_clear()


def test_forced_none_is_accepted():
    from grpo_studio.contract.config import load
    from grpo_studio.rewards import build

    cfg = load("tiny-arith", ['rewards.funcs=["code_exec"]', "rewards.sandbox=none", "rewards.sandbox_force_none=true"])
    ((name, fn),) = build(cfg.rewards)
    assert fn(["q"], ["```python\nx = 1\n```"], tests=[["assert x == 1"]]) == [1.0]
