"""Tracker fan-out (docs/trackers.md): one real run with report.to = tensorboard, trackio and wandb, all
offline (W&B mode=offline, trackio local, TensorBoard event files), and each tracker's own files read back:
every step's every metric equals the row in metrics.jsonl, the samples arrive as a table where the tracker
has tables, and the run is named after its run directory with the resolved config. A missing package is
one line naming the extra, exit code 2."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import time
import uuid

import pytest
from cli_helpers import ENV

from grpo_studio.contract import config, rundir
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.out import trackers

STEPS = 3
PROJECT = "grpo-studio-test"


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    from grpo_studio.engine.run.trainer import Trainer

    root = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_DIR", str(root / "wandb-dir"))
        env.setenv("WANDB_SILENT", "true")
        env.setenv("TRACKIO_DIR", str(root / "trackio-dir"))
        (root / "wandb-dir").mkdir()
        cfg = config.load(
            "tiny-arith",
            [
                f"train.steps={STEPS}",
                "train.prompts_per_step=2",
                "rollout.num_generations=2",
                "train.save_every=0",
                "rollout.backend=hf",
                "report.to=tensorboard,trackio,wandb",
                f"report.project={PROJECT}",
            ],
        )
        trainer = Trainer(cfg, root / "tracked")
        try:
            assert trainer.run() == "finished"
        finally:
            trainer.close()
        yield root, root / "tracked"


def expected_rows(run_dir) -> list[dict]:
    """metrics.jsonl as the trackers should have it: step → every metric but step and time."""
    rows = rundir.read_rows(run_dir / rundir.METRICS)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return rows


def same(expected, got, rel: float = 0.0) -> bool:
    """A metrics.jsonl value (null = not finite) against a tracker's."""
    if expected is None:
        return got is None or not math.isfinite(got)
    return math.isclose(expected, got, rel_tol=rel, abs_tol=0.0) or expected == got


def metric_keys(row: dict) -> list[str]:
    return [k for k in row if k not in ("step", "time")]


def test_tensorboard_event_files_hold_every_step(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run_dir = tracked_run
    acc = EventAccumulator(str(run_dir / trackers.TB_DIR), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    rows = expected_rows(run_dir)
    assert sorted(acc.Tags()["scalars"]) == sorted(metric_keys(rows[0]))
    for key in metric_keys(rows[0]):
        events = acc.Scalars(key)
        assert [e.step for e in events] == [r["step"] for r in rows], key
        for e, row in zip(events, rows):
            assert same(row[key], e.value, rel=1e-6), (key, row["step"], row[key], e.value)  # float32 on disk
    assert "config/text_summary" in acc.Tags()["tensors"]  # the resolved config, as text (add_text)


def test_trackio_local_database_holds_every_step_and_the_samples(tracked_run):
    root, run_dir = tracked_run
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRACKIO_DIR", str(root / "trackio-dir"))
        from trackio.sqlite_storage import SQLiteStorage

        logs = SQLiteStorage.get_logs(PROJECT, run_dir.name)
        run_config = SQLiteStorage.get_run_config(PROJECT, run_dir.name)
    rows = expected_rows(run_dir)
    metric_logs = [log for log in logs if "samples" not in log]
    assert [log["step"] for log in metric_logs] == [r["step"] for r in rows]
    for log, row in zip(metric_logs, rows):
        for key in metric_keys(row):
            assert same(row[key], log[key]), (key, row["step"], row[key], log[key])
    samples = rundir.read_rows(run_dir / rundir.SAMPLES)
    tables = [log for log in logs if "samples" in log]
    assert [t["step"] for t in tables] == sorted({s["step"] for s in samples})
    table_rows = [r for t in tables for r in t["samples"]["_value"]]
    assert [(r["step"], r["completion"], r["correctness"]) for r in table_rows] == [
        (s["step"], s["completion"], s["rewards"]["correctness"]) for s in samples
    ]
    assert run_config["train"]["steps"] == STEPS and run_config["report"]["to"] == ["tensorboard", "trackio", "wandb"]


def wandb_records(path) -> list:
    """The records of a W&B transaction log (.wandb): LevelDB's log format (32 KiB blocks, each record a
    7-byte header: crc32c, length, type FULL/FIRST/MIDDLE/LAST) after a 7-byte ':W&B' file header, each
    record a wandb_internal_pb2.Record. wandb 0.31 has no Python reader; this follows its former
    wandb/sdk/internal/datastore.py."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunks, part = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's last bytes, too few for a header, are padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            chunks.append(chunk)
        elif kind in (2, 3):
            part = (b"" if kind == 2 else part) + chunk
        elif kind == 4:
            chunks.append(part + chunk)
        else:
            break
    records = []
    for chunk in chunks:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        records.append(record)
    return records


def test_wandb_offline_run_holds_every_step_and_the_samples(tracked_run):
    root, run_dir = tracked_run
    (log_file,) = (root / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb")
    records = finished_records(log_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.project) == (run_dir.name, PROJECT)
    run_config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert run_config["train"]["steps"] == STEPS and run_config["report"]["project"] == PROJECT
    history = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    rows = expected_rows(run_dir)
    assert [h.step.num for h in history] == [r["step"] for r in rows]
    samples_steps = sorted({s["step"] for s in rundir.read_rows(run_dir / rundir.SAMPLES)})
    for h, row in zip(history, rows):
        got = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in h.item}
        for key in metric_keys(row):
            assert same(row[key], got[key]), (key, row["step"], row[key], got[key])
        assert (got.get("samples/_type") == "table-file") == (row["step"] in samples_steps)


@pytest.mark.parametrize("name", ["tensorboard", "trackio", "wandb"])
def test_a_missing_tracker_package_names_its_extra(name, monkeypatch):
    monkeypatch.setitem(sys.modules, trackers.KINDS[name].module, None)  # Python's own "not installed"
    with pytest.raises(UserError) as err:
        trackers.check_installed(["tensorboard", name] if name != "tensorboard" else [name])
    i = 0 if name == "tensorboard" else 1
    assert str(err.value) == (
        f"config error: report.to[{i}] = '{name}': the {name} package is not installed; "
        f"pip install 'grpo-studio[{name}]'"
    )


def test_a_missing_tracker_package_stops_train_in_one_line_with_exit_2(tmp_path):
    """A wandb that fails to import (a module on PYTHONPATH raising ModuleNotFoundError, as Python does for
    a package that is not there): `grpo-studio train` prints one line and exits 2, before any step."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "wandb.py").write_text("raise ModuleNotFoundError(\"No module named 'wandb'\", name='wandb')\n")
    env = {**ENV, "PYTHONPATH": f"{shadow}:{ENV.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_studio.cli.main",
            "train",
            "tiny-arith",
            "--set",
            "report.to=wandb",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1:] == [
        "config error: report.to[0] = 'wandb': the wandb package is not installed; pip install 'grpo-studio[wandb]'"
    ]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / rundir.METRICS).exists()


def test_a_resumed_run_continues_the_same_wandb_and_trackio_runs(tmp_path, monkeypatch):
    """Two steps, a stop, a resume to three: W&B's second offline run carries the first one's id (resume by id)
    and trackio's one run holds steps 1-3 (resume by name); trackers.json names the W&B id."""
    from trackio.sqlite_storage import SQLiteStorage

    from grpo_studio.engine.run.trainer import Trainer

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio-dir"))
    project, run_dir = (
        f"grpo-studio-resume-{uuid.uuid4().hex[:8]}",
        tmp_path / "resumed",
    )  # trackio's store may be shared
    for steps, resume in ((2, False), (3, True)):
        cfg = config.load(
            "tiny-arith",
            [
                f"train.steps={steps}",
                "train.prompts_per_step=2",
                "rollout.num_generations=2",
                "train.save_every=0",
                "rollout.backend=hf",
                "report.to=trackio,wandb",
                f"report.project={project}",
            ],
        )
        trainer = Trainer(cfg, run_dir, resume=resume)
        try:
            assert trainer.run() == "finished"
        finally:
            trainer.close()
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))  # by start time (a clash in one second adds -1)
    assert len(runs) == 2
    records = [finished_records(next(p.glob("run-*.wandb"))) for p in runs]
    run_id = json.loads((run_dir / trackers.IDS).read_text())["wandb"]["id"]
    assert [r.run.run_id for rs in records for r in rs if r.WhichOneof("record_type") == "run"] == [run_id, run_id]
    assert [r.history.step.num for rs in records for r in rs if r.WhichOneof("record_type") == "history"] == [1, 2, 3]
    logs = SQLiteStorage.get_logs(project, run_dir.name)
    assert [log["step"] for log in logs if "samples" not in log] == [1, 2, 3]
    assert set(SQLiteStorage.get_runs(project)) == {run_dir.name}


def finished_records(path, wait_s: float = 60.0) -> list:
    """The records of a W&B log once its exit record is on disk (wandb's service process may still be
    writing the file's tail when run.finish() returns)."""
    deadline = time.monotonic() + wait_s
    while True:
        records = wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)
