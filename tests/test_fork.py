"""Try a doctor's suggestion in one key: the fork's plan (diff, where it starts), its run directory beside the
parent (config.toml, fork.json with absolute paths, the parent's checkpoint), the real trainer resuming it with the
changed train.lr, `train --resume` of a relative path, and the studio's Doctor tab from the finding to the
confirmation that shows the diff."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from textual.widgets import Label

from grpo_studio.cli.main import main
from grpo_studio.contract import config as cfgmod
from grpo_studio.contract import run_files, run_state, rundir
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.launch import NO_SUPERVISOR
from grpo_studio.contract.run_reader import read_events
from grpo_studio.engine.run.trainer import Trainer
from grpo_studio.studio import fork
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.screens.compare_screen import CompareScreen
from grpo_studio.studio.screens.modals import Confirm
from grpo_studio.studio.widgets.doctor_panel import DoctorPanel
from tests.studio_helpers import anyio_backend, visible_text, wait_until  # noqa: F401

SETS = ["train.steps=4", "train.prompts_per_step=2", "rollout.num_generations=2", "train.save_every=2"]


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / rundir.METRICS).read_text().splitlines()]


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A real 4-step run of the bundled model whose only reward is constant (the doctor's first finding: no
    learning signal), with checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("fork")
    (root / "const.py").write_text("def const(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    run_dir = root / "parent"
    trainer = Trainer(cfgmod.load("tiny-arith", [*SETS, f'rewards.funcs=["{root / "const.py"}:const"]']), run_dir)
    try:
        assert trainer.run() == "finished"
    finally:
        trainer.close()
    return run_dir


def test_plan_shows_the_diff_and_continues_from_the_newest_checkpoint_before_the_last_step(parent):
    plan = fork.plan(parent, "train.lr", "5e-06")
    assert plan.step == 2  # step-4 is the parent's last step: nothing left to train from it
    assert plan.lines() == [
        "fork parent",
        f"  train.lr: {cfgmod.load('tiny-arith').train.lr} → 5e-06",
        "  from: parent's checkpoint step-2; steps 3..4 trained with the change",
    ]
    weights = fork.plan(parent, "model.lora_rank", "4")  # the model itself changes: the checkpoint cannot carry over
    assert (
        weights.step == 0
        and weights.why_start == "model.lora_rank changes the model, so the checkpoint's weights cannot carry over"
    )
    with pytest.raises(UserError, match="train.lr = 'fast': expected a number"):
        fork.plan(parent, "train.lr", "fast")


def test_the_trainer_resumes_a_fork_at_its_checkpoint_with_the_changed_lr(parent, tmp_path):
    plan = fork.plan(parent, "train.lr", "5e-06")
    path = fork.make(plan)
    assert path.parent == parent.resolve().parent  # beside its parent
    assert json.loads((path / run_files.FORK).read_text()) == {
        "parent": str(parent.resolve()),
        "path": str(path),
        "step": 2,
        "set": {"train.lr": "5e-06"},
    }
    assert fork.parent_of(path) == parent.resolve()
    assert cfgmod.load(str(path / rundir.CONFIG)).train.lr == 5e-06
    assert sorted(p.name for p in (path / rundir.CHECKPOINTS).iterdir()) == ["step-2"]
    trainer = Trainer(cfgmod.load(str(path / rundir.CONFIG)), path, resume=True)
    try:
        assert trainer.run() == "finished"
    finally:
        trainer.close()
    mine, theirs = rows(path), rows(parent)
    assert [r["step"] for r in mine] == [1, 2, 3, 4]
    assert mine[:2] == theirs[:2]  # the parent's steps, cut back to the checkpoint, kept as they were
    # the schedule is constant with no warm-up: the fork's lr is the new value, not the checkpoint's
    assert [r["lr"] for r in mine[2:]] == [5e-06, 5e-06] and theirs[2]["lr"] == cfgmod.load("tiny-arith").train.lr


def test_a_fork_with_nothing_to_continue_starts_at_step_0_with_only_fork_json(parent, tmp_path):
    plan = fork.plan(parent, "model.lora_rank", "4")
    path = fork.make(plan)
    assert sorted(p.name for p in path.iterdir()) == [run_files.FORK]  # launch() writes the rest; no run held yet
    assert run_state.held_run(path) is None


@pytest.mark.anyio
async def test_doctor_tab_lists_the_findings_and_f_shows_the_forks_diff_first(parent, tmp_path):
    app = StudioApp(runs_root=tmp_path / "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        app.open_run(parent)
        await pilot.pause()
        await pilot.press("0")  # the Doctor tab
        panel = app.screen.query_one(DoctorPanel)
        summary, detail = (app.screen.query_one(f"#doctor-{part}") for part in ("summary", "detail"))
        await wait_until(pilot, lambda: visible_text(summary).strip() != "", timeout=60)
        first = panel.found[0]
        assert first.title == "no learning signal: groups with one reward for all"
        assert (first.suggestion_key, first.suggestion_value) == ("rewards.funcs", "correctness,format")
        assert visible_text(summary).strip() == "2 findings, most important first"
        assert "evidence: reward/frac_zero_std averaged 1 over steps 2-4" in visible_text(detail)
        await pilot.press("f")
        await pilot.pause()
        assert isinstance(app.screen, Confirm)
        text = "\n".join(str(label.render()) for label in app.screen.query(Label))
        assert text.splitlines()[:3] == [
            "fork parent",
            f"  rewards.funcs: {parent.parent / 'const.py'}:const → correctness,format",
            "  from: parent's checkpoint step-2; steps 3..4 trained with the change",
        ]
        await pilot.press("n")
        await pilot.pause()
        before = set(parent.parent.iterdir())
        assert not (tmp_path / "runs").exists() and set(parent.parent.iterdir()) == before  # no: nothing written
        await pilot.press("f", "y")  # yes: the fork is written beside its parent, its trainer resumes it
        await pilot.pause()
        assert not (tmp_path / "runs").exists()  # not in the studio's runs folder: beside the parent
        (path,) = set(parent.parent.iterdir()) - before
        assert isinstance(app.screen, CompareScreen) and [r.dir for r in app.screen.runs] == [parent, path]
        await wait_until(pilot, lambda: run_state.run_state(path).state == "finished", timeout=300)
    got = rows(path)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert got[:2] == rows(parent)[:2]
    assert all("rewards/correctness/mean" in r and "rewards/const/mean" not in r for r in got[2:])


def test_resume_with_a_changed_lr_trains_with_it_and_config_toml_says_so(parent, tmp_path):
    """`train --resume RUN --set train.lr=X` (here: the Trainer as the CLI builds it): the steps after the
    checkpoint take X (the restored optimizer and schedule would keep the old lr), config.toml holds X, and a
    config_changed event names the key with its old and new values."""
    run_dir = tmp_path / "run"
    shutil.copytree(parent, run_dir)
    shutil.rmtree(run_dir / rundir.CHECKPOINTS / "step-4")  # resume from step 2
    old = cfgmod.load(str(run_dir / rundir.CONFIG))
    cfg = cfgmod.load(str(run_dir / rundir.CONFIG), ["train.lr=5e-06"])
    trainer = Trainer(cfg, run_dir, resume=True)
    try:
        assert trainer.run() == "finished"
    finally:
        trainer.close()
    assert [r["lr"] for r in rows(run_dir)] == [old.train.lr, old.train.lr, 5e-06, 5e-06]
    assert cfgmod.load(str(run_dir / rundir.CONFIG)).train.lr == 5e-06
    (event,) = [e for e in read_events(run_dir) if e["event"] == "config_changed"]
    assert event["message"] == f"resumed with train.lr {old.train.lr} -> 5e-06" and event["keys"] == ["train.lr"]


@pytest.fixture(scope="module")
def three_checkpoints(tmp_path_factory):
    """A real 4-step run of the bundled model with a checkpoint every step: step-1, 2 and 3 before its last."""
    run_dir = tmp_path_factory.mktemp("fork3") / "runs" / "parent"
    sets = [*SETS[:3], "train.save_every=1", "train.samples_every=1"]
    trainer = Trainer(cfgmod.load("tiny-arith", sets), run_dir)
    try:
        assert trainer.run() == "finished"
    finally:
        trainer.close()
    return run_dir


def test_a_fork_from_step_3_lands_beside_its_parent_and_train_resume_of_a_relative_path_continues_at_step_4(
    three_checkpoints, monkeypatch
):
    parent = three_checkpoints
    assert [step for step, _ in run_files.checkpoint_folders(parent)] == [1, 2, 3, 4]
    plan = fork.plan(parent, "train.lr", "5e-06")
    assert plan.step == 3  # the newest checkpoint before the parent's last step
    path = fork.make(plan)
    assert path.is_absolute() and path.parent == parent.parent
    record = json.loads((path / run_files.FORK).read_text())
    assert record == {"parent": str(parent), "path": str(path), "step": 3, "set": {"train.lr": "5e-06"}}
    # `grpo-studio runs` of the parent's folder lists both, the fork naming its parent
    names = {row["name"] for row in run_state.run_summaries(parent.parent)}
    assert names == {"parent", path.name}
    monkeypatch.chdir(parent.parent.parent)  # `train --resume runs/FORK`, as typed in the runs' folder's parent
    assert main(["train", NO_SUPERVISOR, "--resume", str(Path("runs") / path.name)]) == 0
    mine, theirs = rows(path), rows(parent)
    assert [r["step"] for r in mine] == [1, 2, 3, 4]
    assert mine[:3] == theirs[:3]  # the parent's rows up to the checkpoint; the fork's own training starts at 4
    assert mine[3]["lr"] == 5e-06 and theirs[3]["lr"] == cfgmod.load("tiny-arith").train.lr
    paths = [e["path"] for e in read_events(path) if "path" in e]
    assert paths and all(Path(p).is_absolute() and Path(p).exists() for p in paths[-1:])
    assert all(Path(p).is_absolute() for p in paths)
    assert paths[-1] == str(path / rundir.CHECKPOINTS / "step-4")  # the fork's own checkpoint, by its full path
