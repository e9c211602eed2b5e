"""Setup screen, driven by the keyboard only: fields, CLI-worded validation, the VRAM panel, TOML presets."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpo_studio.contract import config as cfgmod
from grpo_studio.studio import hardware
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.screens.setup_screen import SetupScreen
from grpo_studio.studio.widgets.vram_panel import VramPanel
from tests.studio_helpers import anyio_backend, focus_field, type_into, visible_text  # noqa: F401

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(hardware, "gpus", lambda: [])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))


def make_app(tmp_path, *overrides):
    cfg = cfgmod.load("tiny-arith", ["model.name=Qwen/Qwen3-0.6B", "model.dtype=bf16", *overrides])
    return StudioApp(cfg, "tiny-arith", tmp_path / "runs", live_hardware=False)


def panel_text(app) -> str:
    return " ".join(visible_text(app.screen.query_one(VramPanel)).split())  # wrapped lines joined


async def test_vram_panel_follows_lora_rank_and_lengths(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SetupScreen)
        await pilot.press("ctrl+t")  # accurate mode: LoRA rank changes the trainable state
        assert screen.plan.mode == "accurate"
        base = screen.plan.total
        assert f"{base:,.2f}" in panel_text(app)
        # the total is the phase peak, not the rows' sum: the panel says which rows it adds
        assert "total = weights + sampler copy + train state + max(rollout KV, train activations + logits)" in (
            panel_text(app)
        )

        await type_into(pilot, "f-model-lora-rank", "128")
        assert screen.cfg.model.lora_rank == 128
        bigger_rank = screen.plan.total
        assert bigger_rank > base
        assert f"{bigger_rank:,.2f}" in panel_text(app)

        await type_into(pilot, "f-rollout-max-completion-len", "4096")
        assert screen.cfg.rollout.max_completion_len == 4096
        assert screen.plan.total > bigger_rank
        assert screen.plan.fits is False  # against the 24 GiB default when no GPU is detected
        assert "does not fit in 24 GiB" in panel_text(app)
        assert "max completion length that fits" in screen.plan.suggestion
        assert screen.plan.suggestion in panel_text(app)


async def test_field_error_uses_the_cli_words(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await type_into(pilot, "f-model-lora-rank", "abc")
        shown = visible_text(app.screen.query_one("#f-model-lora-rank-error")).replace("\n", " ").strip()
        cli = subprocess.run(
            [sys.executable, "-m", "grpo_studio.cli.main", "train", "tiny-arith", "--set", "model.lora_rank=abc"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 2
        assert shown == cli.stderr.strip() == "config error: model.lora_rank = 'abc': expected an integer"
        assert app.screen.query_one("#f-model-lora-rank-error").display
        # launching with an error refuses and keeps the user on the form
        await pilot.press("ctrl+r")
        assert isinstance(app.screen, SetupScreen)
        assert app.focused.id == "f-model-lora-rank"
        await type_into(pilot, "f-model-lora-rank", "8")
        assert not app.screen.query_one("#f-model-lora-rank-error").display


async def test_dtype_select_by_keyboard_updates_hint_and_config(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await focus_field(pilot, "f-model-dtype")
        await pilot.press("enter", "down", "enter")  # bf16 -> fp16
        await pilot.pause()
        assert app.screen.cfg.model.dtype == "fp16"
        assert "10-bit mantissa" in visible_text(app.screen.query_one("#dtype-hint"))


async def test_save_and_load_setup_toml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await type_into(pilot, "f-train-steps", "77")
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press(*["backspace"] * 20, *"mine.toml", "enter")
        await pilot.pause()
        saved = cfgmod.load(str(tmp_path / "mine.toml"))
        assert saved.train.steps == 77 and saved.model.dtype == "bf16"

        await type_into(pilot, "f-train-steps", "5")
        assert app.screen.cfg.train.steps == 5
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press(*["backspace"] * 20, *"mine.toml", "enter")
        await pilot.pause()
        await pilot.pause()
        assert app.screen.cfg.train.steps == 77
        assert app.screen.query_one("#f-train-steps").value == "77"


async def test_reward_boxes_read_without_colour_and_fields_carry_the_config_help(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        rewards = app.screen.query_one("#f-rewards-funcs")
        # column 0 is the focus edge (blank, or ┃ when focused), then the box
        assert [line[:7] for line in visible_text(rewards).splitlines()[:2]] == [" ▐☑▌ co", " ▐☐▌ in"]
        await focus_field(pilot, "f-rewards-funcs")
        await pilot.press("down", "space")  # select int
        await pilot.pause()
        assert visible_text(rewards).splitlines()[1].startswith("┃▐☑▌ int:")
        assert "int" in app.screen.cfg.rewards.funcs
        assert (
            app.screen.query_one("#f-algo-beta").tooltip == "algo.beta\nKL-to-reference coefficient (k3)\ndefault: 0.0"
        )


def test_documented_mode_names_the_rollout_engine_the_run_uses():
    from grpo_studio.studio import vram_adapter

    for engine, says in (("hf", "this run samples with hf"), ("vllm", "0: weights shared with vLLM (Unsloth)")):
        plan = vram_adapter.plan(cfgmod.load("chat-arith", [f"rollout.backend={engine}"]), "documented", 24.0)
        (row,) = [r for r in plan.rows if r.name == "inference weights copy"]
        assert says in row.formula and row.gib == 0.0
