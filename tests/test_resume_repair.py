"""A resume never leaves a hole or a duplicate in the run's rows, and never continues from weights the run called
bad: it goes back to the newest checkpoint that metrics.jsonl covers whole (steps 1..k each once), and to the last
good checkpoint of a run that diverged or collapsed, moving later checkpoints aside. Real runs of the bundled model
through the real command line; the oracles are the files."""

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import run_cli

SMALL = ["train.prompts_per_step=4", "rollout.num_generations=4", "rollout.backend=hf", "train.save_every=2"]


def sets(*extra: str) -> list[str]:
    return [a for s in (*SMALL, *extra) for a in ("--set", s)]


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def steps(run: Path) -> list[int]:
    return [row["step"] for row in jsonl(run / "metrics.jsonl")]


def events(run: Path, *kinds: str) -> list[dict]:
    return [e for e in jsonl(run / "events.jsonl") if e["event"] in kinds]


def resume(run: Path, *extra: str):
    done = run_cli("train", "--resume", str(run), *sets("train.steps=8", *extra), cwd=run.parent, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 6-step run with checkpoints at steps 2, 4 and 6."""
    run = tmp_path_factory.mktemp("finished") / "run"
    done = run_cli("train", "tiny-arith", *sets("train.steps=6"), "--run-dir", str(run), cwd=run.parent, timeout=300)
    assert done.returncode == 0, done.stderr
    return run


def copy_of(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.slow
def test_a_hole_in_metrics_sends_the_resume_back_to_the_checkpoint_before_it(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    rows = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(rows[:3] + rows[4:]) + "\n")  # step 4 lost
    resume(run)
    assert steps(run) == list(range(1, 9))
    (moved,) = events(run, "checkpoints_superseded")
    assert moved["message"] == "resuming at step 2 (metrics.jsonl has no row for step 4): moved aside step-4, step-6"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-2",
        "step-4",
        "step-4.superseded",
        "step-6",
        "step-6.superseded",
        "step-8",
    ]


@pytest.mark.slow
def test_emptied_metrics_restart_from_the_base_weights(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    (run / "metrics.jsonl").write_text("")
    resume(run)
    assert steps(run) == list(range(1, 9))
    (restart,) = events(run, "no_checkpoint")
    assert restart["message"] == (
        "no complete checkpoint to resume from at or before step 0 (metrics.jsonl has no "
        "row for step 1): restarting at step 0 from the base weights"
    )


@pytest.mark.slow
def test_a_repeated_row_is_dropped_once(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    rows = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(rows[:3] + [rows[2]] + rows[3:]) + "\n")  # step 3 twice
    resume(run)
    assert steps(run) == list(range(1, 9))
    (dropped,) = events(run, "rows_dropped")
    assert dropped["files"]["metrics.jsonl"] == {"past": 0, "malformed": 0, "repeated": 1}


@pytest.mark.slow
def test_a_collapsed_run_says_so_and_resumes_from_its_last_good_weights(tmp_path):
    """train.lr = 50 in fp32: after step 1 every reward and gradient is exactly 0, all finite."""
    run = tmp_path / "run"
    done = run_cli(
        "train",
        "tiny-arith",
        *sets("train.steps=8", "train.lr=50", "train.save_every=1"),
        "--run-dir",
        str(run),
        cwd=tmp_path,
        timeout=300,
    )
    message = (
        "collapsed: steps 2-6 reward and gradient exactly 0 after earlier steps had a signal "
        "(train.max_bad_steps = 5); last good checkpoint: none; try a lower train.lr (now 50); --resume "
        "starts from the last good checkpoint"
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"run error: {message}"]
    assert steps(run) == [1, 2, 3, 4, 5, 6]  # the step that ended the run has its row
    rows = jsonl(run / "metrics.jsonl")
    assert rows[0]["grad_norm"] > 0 and all(r["reward/mean"] == r["grad_norm"] == 0.0 for r in rows[1:])
    (collapsed,) = events(run, "collapsed")
    assert (collapsed["step"], collapsed["bad_steps"], collapsed["last_good_step"]) == (6, 5, 0)
    assert not (run / "checkpoints" / "step-6").exists()  # its weights are never saved
    resume(run, "train.lr=1e-3")
    assert steps(run) == list(range(1, 9))
    assert [e["message"] for e in events(run, "started")] == ["starting step 0", "resumed at step 0"]
    (moved,) = events(run, "checkpoints_superseded")
    assert moved["steps"] == [1, 2, 3, 4, 5]
    assert events(run, "finished")


@pytest.mark.slow
def test_a_trainer_that_dies_while_loading_is_one_line_and_its_run_resumes(tmp_path):
    """os._exit in a reward module at import: no error line of its own; the supervisor says it, and the run
    directory (config.toml written as the lock was taken) resumes from step 0 once the module is fixed."""
    module = tmp_path / "my_rewards.py"
    module.write_text("import os\nos._exit(7)\n")
    run = tmp_path / "run"
    done = run_cli(
        "train",
        "tiny-arith",
        *sets("train.steps=2", f"rewards.funcs=['{module}:score']"),
        "--run-dir",
        str(run),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 7
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("run error: trainer pid ") and line.endswith(
        f" exited with status 7 while it loaded, before its first step, without saying goodbye; the run is marked "
        f"crashed: {run}"
    )
    module.write_text("def score(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    resume(run, "train.steps=2")
    assert steps(run) == [1, 2]


def test_the_cut_keeps_a_repeated_steps_last_row_as_the_readers_show_it(tmp_path):
    """A step written twice (a crash between the row and its fsync, then a retry) keeps its last row on resume:
    the row `runs`, `report` and the studio show (contract/run_reader.py in_step_order)."""
    from grpo_studio.contract import rundir

    lines = ['{"step": 1, "time": 1.0, "loss": 0.5}', '{"step": 2, "time": 2.0, "loss": 0.25}']
    lines += ['{"step": 2, "time": 3.0, "loss": 0.125}', '{"step": 3, "time": 4.0, "loss": 0.0625}']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert [r["loss"] for r in rundir.read_rows(tmp_path / "metrics.jsonl")] == [0.5, 0.125, 0.0625]
    dropped = rundir.RunWriter(tmp_path).cut_streams(2)
    assert dropped == {"metrics.jsonl": {"past": 1, "malformed": 0, "repeated": 1}}
    assert (tmp_path / "metrics.jsonl").read_text() == lines[0] + "\n" + lines[2] + "\n"


def test_the_cut_refuses_a_stream_that_is_a_fifo_in_one_line(tmp_path):
    import os

    from grpo_studio.contract import rundir
    from grpo_studio.contract.errors import UserError

    os.mkfifo(tmp_path / "events.jsonl")
    with pytest.raises(UserError) as refused:
        rundir.RunWriter(tmp_path).cut_streams(2)  # returns at once: a FIFO is never opened
    assert (
        str(refused.value) == f"run error: {tmp_path}/events.jsonl: not a regular file (a FIFO); a resume rewrites it"
    )
