"""Resume refuses what a checkpoint cannot carry (contract/resume_rules.py, issue 40 item 5): the exact line, exit 2,
nothing written, for a changed LoRA rank, dtype, model, targets, alpha and 4-bit base, by --set and by an edited
config.toml; what it can carry goes on with its `config_changed`, edits of config.toml included; a checkpoint
without a remembered config keeps resuming. The refusals read only config files, so the run directories here are
built as a trainer leaves them (benchmarks/hostile_resume.py run_dir); one real run checks what a trainer writes."""

from __future__ import annotations

import json

import pytest

from grpo_studio.benchmarks.hostile_resume import (
    edit,
    real_edit_recorded,
    real_no_usable_checkpoint,
    real_old_checkpoint,
    real_older_checkpoint_used,
    resume,
    run_dir,
)
from grpo_studio.contract import config, resume_rules
from grpo_studio.contract.run_files import CHECKPOINTS, CONFIG, EVENTS, PIDFILE

RANK = (
    "resume error: checkpoint step-2 cannot carry model.lora_rank 16 -> 4 ({via}): it decides its weights' shape "
    "(0: a full fine-tune, else a LoRA adapter of that rank); resume with model.lora_rank = 16, or start a new run\n"
)


@pytest.mark.parametrize("by_set", [True, False], ids=["--set", "config.toml"])
def test_a_changed_lora_rank_is_one_line_naming_both_values_and_where_it_came_from(tmp_path, by_set):
    run = run_dir(tmp_path)
    if not by_set:
        edit(run, ["model.lora_rank=4"])
    before = (run / CONFIG).read_bytes()
    code, err = resume(run, ["model.lora_rank=4"] if by_set else [])
    assert (code, err) == (2, RANK.format(via="--set" if by_set else "edited in config.toml"))
    assert (run / CONFIG).read_bytes() == before  # nothing written: config.toml, events, the lock
    assert not (run / EVENTS).exists() and not (run / PIDFILE).exists()


def test_each_carried_key_is_refused_and_its_neighbours_are_not(tmp_path):
    """model.dtype, name, 4-bit base, targets, alpha: refused; gradient checkpointing, lora_dropout, train.lr,
    rollout.dtype: carried (the keys whose change keeps the weights and what they compute)."""
    run = run_dir(tmp_path, ["model.dtype=bf16"])
    cfg = config.load(str(run / CONFIG))
    for key, value in [
        ("model.dtype", "fp16"),
        ("model.name", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        ("model.load_in_4bit", "true"),
        ("model.lora_target_modules", "['q_proj']"),
        ("model.lora_alpha", "64.0"),
    ]:
        with pytest.raises(config.UserError) as refused:
            resume_rules.check(run, config.load(str(run / CONFIG), [f"{key}={value}"]), {key})
        assert str(refused.value).startswith(f"resume error: checkpoint step-2 cannot carry {key} "), key
    carried = ["model.gradient_checkpointing=true", "model.lora_dropout=0.1", "train.lr=0.01", "rollout.dtype=fp32"]
    new = config.load(str(run / CONFIG), carried)
    resume_rules.check(run, new, {s.partition("=")[0] for s in carried})
    assert config.changes(resume_rules.reference(run)[1], new) == {
        "model.lora_dropout": (cfg.model.lora_dropout, 0.1),
        "model.gradient_checkpointing": (False, True),
        "rollout.dtype": ("", "fp32"),
        "train.lr": (cfg.train.lr, 0.01),
    }


def test_full_fine_tune_and_lora_do_not_swap_and_a_full_fine_tune_ignores_lora_keys(tmp_path):
    run = run_dir(tmp_path, ["model.lora_rank=0"])
    code, err = resume(run, ["model.lora_rank=8"])
    assert (code, err) == (
        2,
        "resume error: checkpoint step-2 cannot carry model.lora_rank 0 -> 8 (--set): it decides its weights' shape "
        "(0: a full fine-tune, else a LoRA adapter of that rank); resume with model.lora_rank = 0, or start a new run\n",
    )
    resume_rules.check(run, config.load(str(run / CONFIG), ["model.lora_alpha=2.0"]), {"model.lora_alpha"})


def test_the_newest_checkpoint_that_remembers_is_the_reference_and_none_means_config_toml(tmp_path):
    run = run_dir(tmp_path, steps=(1, 2))
    (run / CHECKPOINTS / "step-2" / CONFIG).write_text("[model\n")  # damaged: step-1's is the reference
    assert resume_rules.reference(run)[0] == "step-1"
    (run / CHECKPOINTS / "step-1" / CONFIG).unlink()
    (run / CHECKPOINTS / "step-2" / CONFIG).unlink()  # written before checkpoints remembered their config
    assert resume_rules.reference(run)[0] is None
    code, err = resume(run, ["model.lora_rank=4"])  # --set still checked, against config.toml
    assert (code, err) == (2, RANK.format(via="--set"))


@pytest.mark.slow
def test_a_real_checkpoint_remembers_its_config_and_an_edited_lr_is_recorded(tmp_path):
    """A trained run's checkpoints hold config.toml (in the manifest); train.lr and train.steps edited in
    config.toml resume with one config_changed naming both (hostile_resume.real_edit_recorded)."""
    assert real_edit_recorded(tmp_path) is None
    run = tmp_path / "run"
    for step in (1, 2, 3):
        folder = run / CHECKPOINTS / f"step-{step}"
        assert CONFIG in json.loads((folder / "manifest.json").read_text())["files"]
    remembered = config.load(str(run / CHECKPOINTS / "step-3" / CONFIG))
    assert (remembered.train.lr, remembered.train.steps) == (0.005, 3)


@pytest.mark.slow
def test_an_old_checkpoint_with_an_edited_rank_is_one_line_as_it_loads(tmp_path):
    assert real_old_checkpoint(tmp_path) is None


@pytest.mark.slow
@pytest.mark.parametrize("edits", [("model.lora_alpha=64.0",), ("model.lora_rank=4",)], ids=["alpha", "rank"])
def test_a_resume_with_no_usable_checkpoint_is_refused_not_restarted_from_the_base_weights(tmp_path, edits):
    assert real_no_usable_checkpoint(tmp_path, edits) is None


@pytest.mark.slow
def test_an_unusable_newest_checkpoint_falls_back_to_the_older_one_with_a_warning_line(tmp_path):
    assert real_older_checkpoint_used(tmp_path) is None
