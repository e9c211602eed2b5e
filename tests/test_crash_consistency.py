"""Crash consistency of the run directory (docs/design.md, "The run directory" and "Process model").

The real trainer (`python -m grpo_studio.cli.main train tiny-arith`) SIGKILLed at seeded-random moments
and resumed gives every step once in metrics, samples and histograms, and on CPU fp32 the very run an
uninterrupted one gives (metrics but time/perf/mem, samples, histograms, the final adapter). A lock whose
pid now names another process is not `running`, is never signalled, and is taken over; damaged checkpoints
are skipped for the previous good one; malformed lines of every kind crash no reader and are dropped on
resume; a reward that ends the process gets its `crashed` event from `grpo-studio train`."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from grpo_studio.cli.main import main
from grpo_studio.contract import rundir
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.rundir import EVENTS, HISTOGRAMS, METRICS, PIDFILE, SAMPLES, STREAMS
from grpo_studio.studio import launcher
from grpo_studio.studio.rundata import RunData

PAUSE_ENV = "GRPO_STUDIO_TEST_CHECKPOINT_PAUSE_S"  # engine/out/checkpoint.py's test hook
STEPS = 12
PACE = Path(__file__).with_name("pace_reward.py")  # 50 ms a step: kills land between the chosen steps
SETTINGS = [
    "train.prompts_per_step=4",
    "rollout.num_generations=4",
    f"train.steps={STEPS}",
    "train.save_every=3",
    "train.eval_every=5",
    "train.samples_every=2",
    "data.eval_size=16",
    f"rewards.funcs=correctness,format,{PACE}:pace",
]
SAMPLE_ROWS = 16  # prompts_per_step × num_generations
SAMPLE_STEPS = [s for s in range(2, STEPS + 1, 2) for _ in range(SAMPLE_ROWS)]


# ---- helpers ------------------------------------------------------------------------------------


def train(*args: str, env: dict | None = None) -> subprocess.Popen:
    """`grpo-studio train ...` in a session of its own (so a kill of its group spares pytest)."""
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_studio.cli.main", "train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def sets(*extra: str) -> list[str]:
    return [a for s in (*SETTINGS, *extra) for a in ("--set", s)]


def new_run(run: Path, env: dict | None = None) -> subprocess.Popen:
    return train("tiny-arith", *sets(), "--run-dir", str(run), env=env)


def resume(run: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return train("--resume", str(run), *sets(*extra), env=env)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    return proc.communicate(timeout=timeout)[0]


def wait_for(cond, proc: subprocess.Popen | None, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc is None or proc.poll() is None, (
            f"the trainer exited ({proc.returncode}) before {what}: {proc.stdout.read()}"
        )
        assert time.monotonic() < deadline, f"no {what} in {timeout}s"
        time.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def rows(run: Path, name: str) -> list[dict]:
    """Every line of a finished file, parsed strictly: the files must stay whole."""
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def steps(run: Path, name: str) -> list[int]:
    return [r["step"] for r in rows(run, name)]


def events(run: Path) -> list[dict]:
    """The run's events less `info` lines (the data summary each start writes): these tests are about
    state and recovery events."""
    return [e for e in rundir.read_events(run) if e["event"] != "info"]


def started(run: Path) -> int:
    return sum(e["event"] == "started" for e in events(run))


def stable(metric_rows: list[dict]) -> list[dict]:
    """Metrics without the wall-clock columns (time, perf/*, mem/*)."""
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith(("perf/", "mem/"))} for r in metric_rows]


def assert_same_run(run: Path, reference: Path) -> None:
    """Exact resume: the same metrics (but wall-clock columns), samples, histograms and final adapter."""
    import torch
    from safetensors.torch import load_file

    assert steps(run, METRICS) == steps(run, HISTOGRAMS) == list(range(1, STEPS + 1))
    assert steps(run, SAMPLES) == SAMPLE_STEPS
    assert stable(rows(run, METRICS)) == stable(rows(reference, METRICS))
    assert rows(run, SAMPLES) == rows(reference, SAMPLES)
    assert rows(run, HISTOGRAMS) == rows(reference, HISTOGRAMS)
    final = f"checkpoints/step-{STEPS}/adapter_model.safetensors"
    ours, theirs = load_file(run / final), load_file(reference / final)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def stand_in(run: Path) -> tuple[subprocess.Popen, list[str]]:
    """A live process whose command line is a `grpo-studio train` of `run` (but no trainer)."""
    argv = [
        sys.executable,
        "-c",
        "import time; time.sleep(300)",
        "grpo_studio.cli.main",
        "train",
        "--run-dir",
        str(run),
    ]
    proc = subprocess.Popen(argv, start_new_session=True)
    deadline = time.monotonic() + 30
    while psutil.Process(proc.pid).cmdline() != argv:  # until the fork has exec'ed
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc, argv


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One uninterrupted run: the oracle of every resumed one."""
    run = tmp_path_factory.mktemp("reference") / "run"
    proc = new_run(run)
    out = finish(proc)
    assert proc.returncode == 0, out
    return run


def copy_of(reference: Path, tmp_path: Path) -> Path:
    shutil.copytree(reference, tmp_path / "run")
    return tmp_path / "run"


# ---- SIGKILL at random moments ------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_gives_each_step_once_and_the_uninterrupted_run(reference, tmp_path):
    """Six kills, seeded: right after `started` (before the first checkpoint), after row 1 or 2, in the
    middle of writing checkpoint 6 (the test hook holds it open), after row 7 or 8, the whole process group
    after row 9 or 10 (no supervisor left: a stale lock stays behind), after row 11. After each, --resume
    must say what it did (stale_lock, no_checkpoint, rows_dropped with the exact counts past the last
    complete checkpoint) and continue from that checkpoint."""
    rng = random.Random(20240611)
    run = tmp_path / "run"
    plan = [
        ("trainer", "started", 0),
        ("trainer", "row", rng.choice([1, 2])),
        ("trainer", "checkpoint", 6),
        ("trainer", "row", rng.choice([7, 8])),
        ("group", "row", rng.choice([9, 10])),
        ("trainer", "row", 11),
    ]
    expect = None  # what the next --resume must report, from the state each kill left
    for n, (victim, moment, step) in enumerate([*plan, (None, "end", STEPS)]):
        env = {PAUSE_ENV: "1"} if moment == "checkpoint" else None
        mark = len(events(run)) if n else 0
        proc = new_run(run, env) if n == 0 else resume(run, env=env)
        wait_for(lambda: started(run) == n + 1, proc, "started")
        if expect is not None:
            new = events(run)[mark:]
            new = new[: [e["event"] for e in new].index("started") + 1]
            assert [e["event"] for e in new] == expect["kinds"], (n, new)
            by_kind = {e["event"]: e for e in new}
            assert by_kind["started"]["message"] == f"resumed at step {expect['from']}"
            if "stale_lock" in by_kind:
                assert by_kind["stale_lock"]["pid"] == expect["dead_pid"]
                assert by_kind["stale_lock"]["message"] == (
                    f"took over the stale lock of trainer pid {expect['dead_pid']}: the process is gone"
                )
            if "rows_dropped" in by_kind:
                assert by_kind["rows_dropped"]["files"] == expect["dropped"]
                assert by_kind["rows_dropped"]["step"] == expect["from"]
            if "no_checkpoint" in by_kind:
                assert by_kind["no_checkpoint"]["message"] == (
                    "no complete checkpoint to resume from: restarting at step 0 from the base weights"
                )
        if moment == "end":
            out = finish(proc)
            assert proc.returncode == 0, out
            break

        if moment == "row":
            wait_for(lambda: (rundir.last_metrics_row(run) or {}).get("step", 0) >= step, proc, f"row {step}")
        elif moment == "checkpoint":
            wait_for((run / "checkpoints" / f".step-{step}.tmp").exists, proc, f"checkpoint {step} being written")
        if moment != "checkpoint":
            time.sleep(rng.uniform(0.0, 0.04))  # within the paced step (tests/pace_reward.py: 50 ms)
        lock = rundir.read_lock(run)
        if victim == "trainer":
            os.kill(lock.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        out = finish(proc)

        done = sorted(int(p.name[5:]) for p in (run / "checkpoints").glob("step-*"))
        last = max(done, default=0)
        metric_steps = (
            [json.loads(line)["step"] for line in (run / METRICS).read_text().splitlines()]
            if (run / METRICS).exists()
            else []
        )
        if moment == "started":
            assert last == 0, "this kill must land before the first checkpoint"
        if moment == "checkpoint":
            assert last == step - 3 and (run / "checkpoints" / f".step-{step}.tmp").is_dir()
        if victim == "trainer":  # the supervisor saw it die: `crashed`, no lock, exit code 128 + 9
            assert proc.returncode == 128 + signal.SIGKILL, out
            message = (
                f"trainer pid {lock.pid} was killed by SIGKILL after step {max(metric_steps, default=0)}, "
                f"without saying goodbye"
            )
            assert events(run)[-1] == {**events(run)[-1], "event": "crashed", "message": message, "signal": "SIGKILL"}
            assert out.splitlines()[-1] == f"run error: {message}; the run is marked crashed: {run}"
            assert not (run / PIDFILE).exists()
        else:  # nobody left to say goodbye: the lock stays, but it is stale
            assert proc.returncode == -signal.SIGKILL
            wait_for(lambda: gone(lock.pid), None, "the trainer's end")  # the group dies one process at a time
            assert rundir.read_lock(run) == lock and rundir.run_state(run).state == "crashed"
        dropped = {}
        for name in STREAMS:
            past = (
                sum(1 for line in (run / name).read_text().splitlines() if json.loads(line)["step"] > last)
                if (run / name).exists()
                else 0
            )
            if past:
                dropped[name] = {"past": past, "malformed": 0, "repeated": 0}
        kinds = (
            (["stale_lock"] if victim == "group" else [])
            + (["no_checkpoint"] if not last else [])
            + (["rows_dropped"] if dropped else [])
            + ["started"]
        )
        expect = {"kinds": kinds, "from": last, "dropped": dropped, "dead_pid": lock.pid}

    assert_same_run(run, reference)
    assert events(run)[-1]["event"] == "finished" and not (run / PIDFILE).exists()
    assert not list((run / "checkpoints").glob(".step-*.tmp"))


# ---- the lock -----------------------------------------------------------------------------------


def test_a_live_lock_is_refused_with_its_line_and_a_dead_one_is_taken_over(tmp_path):
    holder, _ = stand_in(tmp_path)
    try:
        rundir.write_lock(tmp_path, rundir.Lock.of(holder.pid))
        assert rundir.run_state(tmp_path).state == "running"
        with pytest.raises(rundir.RunLock) as refused:
            rundir.RunWriter(tmp_path).acquire()
        assert str(refused.value) == (
            f"run error: {tmp_path} is in use by trainer pid {holder.pid}; stop it or pick another --run-dir"
        )
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert rundir.run_state(tmp_path).state == "created"  # the lock's process is gone
    writer = rundir.RunWriter(tmp_path)
    writer.acquire()
    writer.release()
    assert [(e["event"], e["message"], e["pid"]) for e in events(tmp_path)] == [
        ("stale_lock", f"took over the stale lock of trainer pid {holder.pid}: the process is gone", holder.pid)
    ]
    assert not (tmp_path / PIDFILE).exists()


@pytest.mark.slow
def test_a_lock_whose_pid_now_names_another_process_is_stale_never_signalled_and_taken_over(reference, tmp_path):
    """The decoy even looks like a trainer of this run (its command line); only its start time differs."""
    run = copy_of(reference, tmp_path)
    decoy, _ = stand_in(run)
    try:
        rundir.write_lock(
            run, rundir.Lock(decoy.pid, psutil.Process(decoy.pid).create_time() - 3600, socket.gethostname())
        )
        assert rundir.run_state(run).state == "finished"
        data = RunData(run)
        data.drain()
        assert data.state() == "finished"
        for act in (launcher.stop, launcher.kill):
            with pytest.raises(UserError) as refused:
                act(run)
            assert str(refused.value).startswith(
                f"run error: {run}: refusing to signal trainer pid {decoy.pid}: "
                f"pid {decoy.pid} now belongs to another process (started "
            )
        assert decoy.poll() is None

        mark = len(events(run))
        proc = resume(run, f"train.steps={STEPS + 1}")
        out = finish(proc)
        assert proc.returncode == 0, out
        new = events(run)[mark:]
        assert [e["event"] for e in new] == ["stale_lock", "config_changed", "started", "checkpoint", "finished"]
        assert new[1]["message"] == f"resumed with train.steps {STEPS} -> {STEPS + 1}"  # the --set, on record
        assert new[0]["pid"] == decoy.pid
        assert new[0]["message"].startswith(
            f"took over the stale lock of trainer pid {decoy.pid}: pid {decoy.pid} "
            f"now belongs to another process (started "
        )
        assert new[2]["message"] == f"resumed at step {STEPS}"
        assert steps(run, METRICS) == list(range(1, STEPS + 2))
        assert decoy.poll() is None and not (run / PIDFILE).exists()
    finally:
        decoy.kill()
        decoy.wait(timeout=30)


# ---- damaged checkpoints ------------------------------------------------------------------------


@pytest.mark.slow
def test_damaged_checkpoints_are_skipped_for_the_previous_good_one(reference, tmp_path):
    """step-12: a file cut short; step-9: a torn manifest; step-6: a trainer state that matches its
    manifest but does not load. Resume takes step-3, names each skipped one and why, and trains 4..12
    into the same run as the reference."""
    run = copy_of(reference, tmp_path)
    ckpt = run / "checkpoints"
    adapter = ckpt / "step-12" / "adapter_model.safetensors"
    size = adapter.stat().st_size
    os.truncate(adapter, size // 2)
    manifest = (ckpt / "step-9" / "manifest.json").read_text()
    (ckpt / "step-9" / "manifest.json").write_text(manifest[: len(manifest) // 2])
    state = ckpt / "step-6" / "trainer_state.pt"
    state.write_bytes(b"not a torch file" * 64)
    listed = json.loads((ckpt / "step-6" / "manifest.json").read_text())
    listed["files"]["trainer_state.pt"] = {
        "size": state.stat().st_size,
        "sha256": hashlib.sha256(state.read_bytes()).hexdigest(),
    }
    (ckpt / "step-6" / "manifest.json").write_text(json.dumps(listed))

    mark = len(events(run))
    proc = resume(run)
    out = finish(proc)
    assert proc.returncode == 0, out
    new = events(run)[mark:]
    assert [e["event"] for e in new] == ["checkpoint_skipped"] * 3 + ["rows_dropped", "started"] + [
        "checkpoint"
    ] * 3 + ["finished"]
    skipped = new[:3]
    assert [(e["step"], e["path"]) for e in skipped] == [(s, str(ckpt / f"step-{s}")) for s in (12, 9, 6)]
    assert skipped[0]["message"] == (
        f"skipped checkpoint step-12: adapter_model.safetensors is {size // 2} bytes, "
        f"the manifest says {size} (moved to step-12.skipped)"
    )
    assert skipped[1]["message"] == "skipped checkpoint step-9: manifest.json is unreadable (moved to step-9.skipped)"
    assert skipped[2]["message"].startswith("skipped checkpoint step-6: cannot be loaded (")
    assert skipped[2]["message"].endswith(") (moved to step-6.skipped)")
    assert new[3]["files"] == {
        METRICS: {"past": 9, "malformed": 0, "repeated": 0},
        SAMPLES: {"past": 5 * SAMPLE_ROWS, "malformed": 0, "repeated": 0},
        HISTOGRAMS: {"past": 9, "malformed": 0, "repeated": 0},
    }
    assert new[4]["message"] == "resumed at step 3"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "step-12",
        "step-12.skipped",
        "step-3",
        "step-6",
        "step-6.skipped",
        "step-9",
        "step-9.skipped",
    ]
    assert_same_run(run, reference)


# ---- malformed lines ----------------------------------------------------------------------------

COMMON_BAD = ["this is not JSON", "[1, 2]", "3", '"a string"', "null"]
BAD = {name: COMMON_BAD + ['{"loss": 1.0}', '{"step": null}'] for name in STREAMS}  # no step; a null step
BAD[EVENTS] = COMMON_BAD + ['{"message": "no kind"}', '{"event": null}']
TORN = '{"step": 1'  # a last line cut short


@pytest.mark.slow
def test_malformed_lines_crash_no_reader_and_resume_drops_them(reference, tmp_path, capsys):
    run = copy_of(reference, tmp_path)
    for name, bad in BAD.items():
        lines = (run / name).read_text().splitlines(keepends=True)
        half = len(lines) // 2
        (run / name).write_text("".join(lines[:half]) + "".join(b + "\n" for b in bad) + "".join(lines[half:]) + TORN)
    n = len(COMMON_BAD) + 2

    assert main(["runs", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[:3] == ["run", "finished", f"{STEPS}/{STEPS}"]
    # runs reads events.jsonl back to `started` and metrics.jsonl's whole tail (its highest step, not its last
    # line): both pass their n malformed lines, each file said as the full readers say it
    assert err == "".join(
        f"warning: run/{name}: skipped {n} malformed lines (not a JSON object with the fields the file needs)\n"
        for name in (EVENTS, METRICS)
    )
    state = rundir.run_state(run)
    assert (state.state, state.step) == ("finished", STEPS)

    data = RunData(run)
    data.drain()
    assert data.steps == list(range(1, STEPS + 1)) and data.skipped_rows == 4 * n
    assert list(data.samples) == rows(reference, SAMPLES) and data.histogram == rows(reference, HISTOGRAMS)[-1]
    warning = (
        f"skipped malformed lines ({n} in {METRICS}, {n} in {EVENTS}, {n} in {SAMPLES}, {n} in {HISTOGRAMS}): "
        f"not a JSON object with the fields the file needs"
    )
    assert [e["message"] for e in data.events if e["event"] == "warning"] == [warning]

    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert warning in (tmp_path / "report" / "index.html").read_text()

    reference_events = (reference / EVENTS).read_text()
    proc = resume(run)
    out = finish(proc)
    assert proc.returncode == 0, out
    for name in STREAMS:  # the malformed lines are gone, every good row is kept byte for byte
        assert (run / name).read_text() == (reference / name).read_text()
    text = (run / EVENTS).read_text()
    assert text.startswith(reference_events)
    new = [e for e in map(json.loads, text[len(reference_events) :].splitlines()) if e["event"] != "info"]
    assert [e["event"] for e in new] == ["rows_dropped", "started", "finished"]
    assert new[0]["files"] == {name: {"past": 0, "malformed": n + 1, "repeated": 0} for name in (*STREAMS, EVENTS)}


def test_a_writer_ends_a_torn_last_line_before_appending(tmp_path):
    """A writer killed mid-line left half a row: the next writer (the supervisor's `crashed`) starts on a
    line of its own, so its row stays whole and readers skip only the torn one."""
    (tmp_path / EVENTS).write_text('{"time": 1.0, "event": "started"}\n{"time": 2.0, "ev')
    writer = rundir.RunWriter(tmp_path)
    writer.event("crashed", "gone")
    writer.close()
    lines = (tmp_path / EVENTS).read_text().splitlines()
    assert lines[:2] == ['{"time": 1.0, "event": "started"}', '{"time": 2.0, "ev']
    tail = rundir.JsonlTail(tmp_path / EVENTS)
    assert [(e["event"], e.get("message")) for e in tail.read_new()] == [("started", None), ("crashed", "gone")]
    assert tail.skipped == 1


def test_an_attached_reader_starts_over_when_a_resume_rewrites_the_files(tmp_path):
    """RunData tails the files while --resume cuts them (a new file in place): it re-reads, without
    keeping the dropped rows or counting a sample twice."""
    for name, rows_ in (
        (METRICS, [{"step": s, "loss": float(s)} for s in (1, 2, 3)]),
        (SAMPLES, [{"step": s, "completion": str(s), "rewards": {}} for s in (1, 2, 3)]),
        (EVENTS, [{"time": 1.0, "event": "started", "message": ""}]),
    ):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows_))
    data = RunData(tmp_path)
    data.drain()
    assert data.steps == [1, 2, 3]
    writer = rundir.RunWriter(tmp_path)
    assert writer.cut_streams(1) == {
        METRICS: {"past": 2, "malformed": 0, "repeated": 0},
        SAMPLES: {"past": 2, "malformed": 0, "repeated": 0},
    }
    writer.metrics({"step": 2, "loss": 20.0})
    writer.close()
    data.drain()
    assert data.series("loss") == ([1, 2], [1.0, 20.0])
    assert [r["step"] for r in data.samples] == [1] and len(data.events) == 1


# ---- a trainer that dies in a reward ------------------------------------------------------------


@pytest.mark.slow
def test_a_reward_that_exits_the_process_ends_the_run_crashed_with_its_exit_status(tmp_path):
    (tmp_path / "die.py").write_text(
        "import os\n\ncalls = 0\n\n\ndef die(prompts, completions, **kwargs):\n"
        "    global calls\n    calls += 1\n    if calls == 2:\n        os._exit(3)\n"
        "    return [0.0] * len(completions)\n"
    )
    run = tmp_path / "run"
    funcs = json.dumps(["correctness", f"{tmp_path / 'die.py'}:die"])
    proc = train("tiny-arith", *sets("train.eval_every=0", f"rewards.funcs={funcs}"), "--run-dir", str(run))
    out = finish(proc)
    assert proc.returncode == 3, out
    evs = events(run)
    pid = evs[0]["pid"]
    message = f"trainer pid {pid} exited with status 3 after step 1, without saying goodbye"
    assert [(e["event"], e["message"]) for e in evs] == [("started", "starting step 0"), ("crashed", message)]
    assert (evs[-1]["exit_status"], evs[-1]["step"], evs[-1]["pid"]) == (3, 1, pid)
    assert out.splitlines()[-1] == f"run error: {message}; the run is marked crashed: {run}"
    assert not (run / PIDFILE).exists() and rundir.run_state(run).state == "crashed"
