"""train.micro_batch_size = auto (contract/planner/micro_batch.py): the rows it chooses, by hand, for the CPU knee
and for the memory; and, trained, the whole batch's loss and gradient for every loss type."""

from __future__ import annotations

import pytest
import torch

from grpo_studio.contract import config, loss_types, model_card
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.planner import micro_batch, preflight, vram
from grpo_studio.contract.rundir import read_events
from grpo_studio.engine.run.trainer import Trainer

LONG = ["rollout.max_prompt_len=256", "rollout.max_completion_len=64", "train.prompts_per_step=8"]


def host(free: float) -> list[preflight.Device]:
    return [preflight.Device("cpu", "host RAM", 128.0, free)]


def gpu(free: float) -> list[preflight.Device]:
    return [preflight.Device("cuda", "GPU", 80.0, free)]


def test_auto_is_the_default_and_reads_like_the_other_auto_key():
    assert config.load("tiny-arith").train.micro_batch_size == "auto"
    assert config.load("tiny-arith", ["train.micro_batch_size=Auto"]).train.micro_batch_size == "auto"
    assert config.load("tiny-arith", ["train.micro_batch_size=16"]).train.micro_batch_size == 16
    with pytest.raises(UserError, match=r"train.micro_batch_size = '1.5': expected auto or an integer"):
        config.load("tiny-arith", ["train.micro_batch_size=1.5"])


def test_the_cpu_knee_by_hand():
    # tiny-arith: 16 prompts · 8, prompt 16 + 8 completion tokens; the shared-prefix pass computes each prompt once
    # per group: 16 + 8·8 = 80 tokens a group, 2048 // 80 = 25 groups > 16: the whole step
    cfg = config.load("tiny-arith")
    assert micro_batch.knee_rows(cfg) == 128
    # the shared-instruction shape: 256 + 8·64 = 768 tokens a group: 2 groups, 16 rows
    assert micro_batch.knee_rows(config.load("tiny-arith", LONG)) == 16
    # shared prefix off: every row its prompt, 8·256 + 8·64 = 2560 > 2048: still one whole group
    assert micro_batch.knee_rows(config.load("tiny-arith", [*LONG, "train.shared_prefix=off"])) == 8
    # 12 groups of 128 rows would leave 32 in a second micro-batch: two even ones of 64
    assert micro_batch.even(96, 128, 8) == 64 and micro_batch.even(120, 128, 8) == 64 and micro_batch.even(4, 8, 8) == 4


def planned(card, cfg, rows: int, devs) -> float:
    plan_cfg = micro_batch.with_rows(cfg, rows)
    return preflight.places(plan_cfg, preflight.estimate(plan_cfg, card, devs[0]), devs)[0].need_gib


def test_memory_picks_the_most_whole_groups_that_fit_and_halves_below_one_group():
    cfg, card = config.load("tiny-arith", LONG), model_card.load("qwen3-0.6b")
    sizes = gpu(80.0)
    need = {rows: planned(card, cfg, rows, sizes) for rows in (1, 4, 8, 16, 24, 64)}
    assert need[1] < need[4] < need[8] < need[16] < need[24] < need[64]  # (1 and 2 rows: the rollout's KV cache)
    free = (need[16] + need[24]) / 2  # 16 rows fit, 24 do not: the step's 64 rows in 4 micro-batches of 16
    choice = micro_batch.choose(card, cfg, gpu(free))
    assert (choice.rows, choice.why) == (16, "the most that fits")
    assert choice.budget == f"{need[16]:.2f} GiB planned of {free:.2f} free on GPU"
    assert micro_batch.choose(card, cfg, gpu((need[4] + need[8]) / 2)).rows == 4  # one group does not fit
    least = micro_batch.choose(card, cfg, gpu(need[1] / 2))
    assert (least.rows, least.why) == (1, "not even 1 fits")
    whole = micro_batch.choose(card, cfg, gpu(need[64] + 0.01))
    assert (whole.rows, whole.why) == (64, "the whole step")
    # on a CPU the knee caps what the memory would allow
    assert micro_batch.choose(card, cfg, host(100.0)).line() == "micro-batch auto = 16 rows (CPU knee 2048 tokens)"


def test_the_pre_flight_plans_the_rows_it_chose_and_says_so():
    cfg, card = config.load("tiny-arith", LONG), model_card.load("qwen3-0.6b")
    need8, need16 = planned(card, cfg, 8, gpu(80)), planned(card, cfg, 16, gpu(80))
    verdict = preflight.check(cfg, gpu((need8 + need16) / 2), card)
    assert verdict.fits and verdict.need_gib == pytest.approx(need8)
    assert verdict.message.endswith("; micro-batch auto = 8 rows (the most that fits)")
    whole = preflight.check(config.load("tiny-arith", [*LONG, "train.micro_batch_size=0"]), gpu(need16), card)
    assert not whole.fits  # the same device refuses the whole batch


def test_micro_batch_tokens_with_auto_cuts_by_tokens_and_with_a_number_is_refused():
    cfg = config.load("tiny-arith", ["train.micro_batch_tokens=48"])
    assert not micro_batch.is_auto(cfg) and vram.train_rows(micro_batch.fixed(cfg)) == 2  # 48 // (16 + 8)
    with pytest.raises(UserError, match="micro-batches are cut by one of them; set the other to 0"):
        config.load("tiny-arith", ["train.micro_batch_tokens=48", "train.micro_batch_size=4"])


SMALL = ["train.prompts_per_step=4", "rollout.num_generations=4", "train.steps=1"]


def one_step(cfg, run_dir):
    """The step's loss and the gradient read just before AdamW."""
    trainer = Trainer(cfg, run_dir)
    optimize, grads = trainer.grpo._optimize, {}

    def snapshot_then_optimize(loss):
        grads.update({n: p.grad.clone() for n, p in trainer.policy.named_parameters() if p.grad is not None})
        return optimize(loss)

    trainer.grpo._optimize = snapshot_then_optimize
    trainer.rundir.acquire()
    row = trainer.step()
    trainer.rundir.release()
    rows = trainer.grpo.cfg.train.micro_batch_size
    trainer.close()
    return row["loss"], grads, rows


@pytest.mark.parametrize("loss_type", sorted(loss_types.BY_NAME))
def test_auto_micro_batches_give_the_whole_batch_loss_and_gradient(tmp_path, monkeypatch, loss_type):
    """Oracle: the whole batch in one forward. Auto cut to one group per micro-batch (the knee lowered to 50
    tokens: a group is 16 + 4·8 = 48) must give the same loss and gradient for every loss type; bnpo included,
    which under an explicit micro_batch_size is TRL's per-micro-batch token mean instead."""
    sets = [*SMALL, f"algo.loss_type={loss_type}"]
    loss0, g0, rows0 = one_step(config.load("tiny-arith", [*sets, "train.micro_batch_size=0"]), tmp_path / "whole")
    monkeypatch.setattr(micro_batch, "CPU_KNEE_TOKENS", 50)
    loss4, g4, rows4 = one_step(config.load("tiny-arith", sets), tmp_path / "auto")
    assert (rows0, rows4) == (0, 4)
    chosen = [e for e in read_events(tmp_path / "auto") if e.get("micro_batch_rows")]
    assert [e["message"] for e in chosen] == ["micro-batch auto = 4 rows (CPU knee 50 tokens)"]
    assert config.load(str(tmp_path / "auto" / "config.toml")).train.micro_batch_size == "auto"
    assert loss4 == pytest.approx(loss0, abs=1e-7)
    assert g0 and g0.keys() == g4.keys()
    assert max(g.abs().max().item() for g in g0.values()) > 1e-4  # a real gradient, not zeros
    for name in g0:
        torch.testing.assert_close(g4[name], g0[name], rtol=1e-4, atol=1e-7)
