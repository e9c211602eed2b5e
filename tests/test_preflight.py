"""The pre-flight check (contract/planner/preflight.py): the planner's total against the free memory of the
device, before anything loads; `rollout.gpu_memory_utilization = auto` sized by the planner."""

from __future__ import annotations

import math
import re

import pytest

from grpo_studio.contract import config as cfgmod
from grpo_studio.contract import model_card
from grpo_studio.contract.planner import preflight, vram
from grpo_studio.studio import hardware
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.screens.modals import Confirm
from tests.cli_helpers import run_cli
from tests.studio_helpers import anyio_backend, visible_text  # noqa: F401

# a bundled card: 8B parameters, fp32 LoRA on the CPU needs ~100 GiB; with gradient checkpointing ~64
BIG = ["model.name=qwen3-8b", "train.micro_batch_size=0"]  # the whole batch: auto would shrink it to fit
SET_BIG = [arg for key in BIG for arg in ("--set", key)]


def small_host(free: float) -> preflight.Device:
    return preflight.Device("cpu", "host RAM", 128.0, free)


def test_a_run_that_fits_passes_and_says_what_it_checked():
    cfg = cfgmod.load("tiny-arith")
    need = vram.estimate(model_card.load(cfg.model.name), cfg, "accurate", None, device="cpu").total_gib
    verdict = preflight.check(cfg, small_host(need + 0.01))
    assert verdict.fits and verdict.need_gib == pytest.approx(need)
    assert verdict.message == (
        f"pre-flight: {need:.2f} GiB planned, {need + 0.01:.2f} GiB free on host RAM; "
        "micro-batch auto = 128 rows (the whole step)"  # 16 prompts · 8: 16·16 + 128·8 tokens, under the CPU knee
    )


def test_a_run_that_does_not_fit_names_the_largest_row_and_a_setting_that_fits():
    cfg = cfgmod.load("tiny-arith", [*BIG, "model.gradient_checkpointing=true"])
    card = model_card.load("qwen3-8b")
    est = vram.estimate(card, cfg, "accurate", None, device="cpu")
    largest = max(est.rows, key=lambda r: r.gib)
    free = 64.5  # less than the 65.8 GiB planned at 8 generations; more than at 2 (62.8)
    verdict = preflight.check(cfg, small_host(free), card)
    assert not verdict.fits
    assert verdict.message.startswith(
        f"the run needs {est.total_gib:.2f} GiB and host RAM has 64.50 GiB free "
        f"(of 128.00); largest row: {largest.name} {largest.gib:.2f} GiB; "
    )
    # the suggestion is the planner's: with it the run fits, one more does not
    g = int(re.search(r"--set rollout\.num_generations=(\d+)", verdict.message).group(1))
    total = lambda n: (
        vram.estimate(
            card,
            cfgmod.load(
                "tiny-arith",
                [
                    *BIG,
                    "model.gradient_checkpointing=true",  # noqa: E731
                    f"rollout.num_generations={n}",
                ],
            ),
            "accurate",
            None,
            device="cpu",
        ).total_gib
    )
    assert 2 <= g < cfg.rollout.num_generations and total(g) <= free < total(g + 1)


def test_activations_first_suggest_gradient_checkpointing():
    cfg = cfgmod.load("tiny-arith", BIG)
    card = model_card.load("qwen3-8b")
    with_gc = vram.estimate(
        card, cfgmod.load("tiny-arith", [*BIG, "model.gradient_checkpointing=true"]), "accurate", None, device="cpu"
    ).total_gib
    verdict = preflight.check(cfg, small_host(with_gc + 1), card)
    assert "largest row: activations " in verdict.message
    assert verdict.message.endswith(
        f"; the planner suggests --set model.gradient_checkpointing=true ({with_gc:.2f} GiB)"
    )


def test_nothing_fits_suggests_a_4bit_base():
    verdict = preflight.check(cfgmod.load("tiny-arith", BIG), small_host(1.0))
    assert verdict.message.endswith("; no generation setting fits: try model.load_in_4bit = true or a smaller model")


def test_a_model_the_planner_cannot_read_is_not_checked():
    cfg = cfgmod.load("tiny-arith", ["model.name=someone/not-downloaded"])
    verdict = preflight.check(cfg, small_host(0.001))
    assert verdict.fits and verdict.message.startswith(
        "pre-flight skipped: model.name = 'someone/not-downloaded': no model card, local folder or cached config.json"
    )


def test_device_without_a_gpu_is_host_ram():
    import psutil

    dev = preflight.device()
    assert (dev.kind, dev.name) == ("cpu", "host RAM")
    assert dev.total_gib == pytest.approx(psutil.virtual_memory().total / 2**30)
    assert 0 < dev.free_gib <= dev.total_gib


def test_headless_refusal_is_one_line_and_leaves_no_run_directory(tmp_path):
    run_dir = tmp_path / "big"
    result = run_cli("train", "tiny-arith", *SET_BIG, "--run-dir", str(run_dir), cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert re.fullmatch(
        r"pre-flight error: the run needs [\d.]+ GiB and host RAM has [\d.]+ GiB free \(of [\d.]+\); "
        r"largest row: .+ [\d.]+ GiB; .+; or launch anyway with --force",
        lines[0],
    )
    assert not run_dir.exists()


def test_force_launches_past_the_refusal(tmp_path):
    """--force goes on to the trainer, which then fails on its own terms (the 8B model is not downloaded)."""
    result = run_cli("train", "tiny-arith", *SET_BIG, "--run-dir", str(tmp_path / "big"), "--force", cwd=tmp_path)
    assert result.stdout.startswith("pre-flight (--force): the run needs ")
    assert "model.name = 'qwen3-8b'" in result.stderr and result.returncode == 2


# ---- every device: data-parallel ranks and the rollout servers ----------------------------------

DDP = [*BIG, "model.gradient_checkpointing=true", "train.parallel=ddp"]


def gpu(index: int, free: float) -> preflight.Device:
    return preflight.Device("cuda", "NVIDIA H100", 80.0, free, index=index)


def test_host_ram_holds_every_rank():
    """On a CPU both ranks of --nproc 2 live in host RAM: the need is the sum of the training devices' totals
    (free memory that holds one rank's total is refused)."""
    cfg, card = cfgmod.load("tiny-arith", DDP), model_card.load("qwen3-8b")
    plan = vram.estimate(card, cfg, "accurate", None, device="cpu", world_size=2)
    one, need = plan.devices[0].total_gib, sum(d.total_gib for d in plan.devices)
    assert [d.name for d in plan.devices] == ["train rank 0", "train rank 1"] and need == pytest.approx(2 * one)
    free = need - 0.3  # more than one rank needs
    verdict = preflight.check(cfg, [small_host(free)], card, world_size=2)
    largest = max(plan.devices[0].rows, key=lambda r: r.gib)
    assert not verdict.fits and verdict.need_gib == pytest.approx(need)
    assert verdict.message.startswith(
        f"the run needs {need:.2f} GiB on host RAM for train rank 0 + train rank 1 and "
        f"it has {free:.2f} GiB free (of 128.00); largest row (train rank 0): "
        f"{largest.name} {largest.gib:.2f} GiB; "
    )
    # the suggestion is solved on what host RAM holds: both ranks
    g = int(re.search(r"--set rollout\.num_generations=(\d+)", verdict.message).group(1))
    total = lambda n: sum(
        d.total_gib
        for d in vram.estimate(  # noqa: E731
            card,
            cfgmod.load("tiny-arith", [*DDP, f"rollout.num_generations={n}"]),
            "accurate",
            None,
            device="cpu",
            world_size=2,
        ).devices
    )
    assert one < free and total(g) <= free < total(g + 1)
    assert preflight.check(cfg, [small_host(need + 0.01)], card, world_size=2).fits


def test_every_gpu_is_checked_and_the_refusal_names_the_one_that_does_not_fit():
    """Rank i on visible GPU i; the rollout servers a run starts (one per rank) inherit CUDA_VISIBLE_DEVICES and
    land on the first GPU; a server named by rollout.server is already running and is not this run's to place."""
    sets = [
        *DDP,
        "rollout.backend=vllm",
        "rollout.colocate=false",
        "model.dtype=bf16",
        "train.prompts_per_step=2",
        "rollout.max_completion_len=16",
    ]
    cfg, card = cfgmod.load("tiny-arith", sets), model_card.load("qwen3-8b")
    plan = vram.estimate(card, cfg, "accurate", 80.0, device="cuda", world_size=2)
    rank, server = plan.device("train rank 1").total_gib, plan.device("rollout server 0").total_gib
    first = rank + 2 * server
    verdict = preflight.check(cfg, [gpu(0, first + 1), gpu(1, rank - 1)], card, world_size=2)
    assert not verdict.fits and verdict.message.startswith(
        f"the run needs {rank:.2f} GiB on GPU 1 (NVIDIA H100) for train rank 1 and it has {rank - 1:.2f} GiB free "
        f"(of 80.00); largest row (train rank 1): "
    )
    short = preflight.check(cfg, [gpu(0, first - 1), gpu(1, 80.0)], card, world_size=2)
    assert short.message.startswith(
        f"the run needs {first:.2f} GiB on GPU 0 (NVIDIA H100) for train rank 0 + "
        f"rollout server 0 + rollout server 1 and it has"
    )
    named = cfgmod.load("tiny-arith", [*sets, "rollout.server=127.0.0.1:8000"])
    ok = preflight.check(named, [gpu(0, rank + 0.01), gpu(1, rank + 0.01)], card, world_size=2)
    assert ok.fits and ok.message == (
        f"pre-flight: {rank:.2f} GiB planned, {rank + 0.01:.2f} GiB free on GPU 0 (NVIDIA H100), GPU 1 (NVIDIA H100)"
    )


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert preflight._visible_gpus(4) == [2, 0]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert preflight._visible_gpus(3) == [0, 1, 2]


# ---- rollout.gpu_memory_utilization = auto ------------------------------------------------------


def test_auto_share_is_the_rollouts_need_with_headroom():
    cfg = cfgmod.load(
        "tiny-arith",
        [
            *BIG,
            "rollout.backend=vllm",
            "model.dtype=bf16",
            "train.prompts_per_step=8",
            "rollout.num_generations=8",
            "rollout.max_prompt_len=64",
            "rollout.max_completion_len=16",
        ],
    )
    card = model_card.load("qwen3-8b")
    # by hand: bf16 weights + the KV cache of 8 prompts x 8 completions of 64 + 16 tokens
    weights = card.total_params() * 2
    kv = 2 * 2 * card.layers * (64 + 16) * card.kv_dim * 64
    need = (weights + kv) / 2**30
    assert cfg.rollout.gpu_memory_utilization == "auto"
    assert vram.vllm_share(card, cfg, 80.0) == math.ceil((need * 1.2 + 1.0) / 80.0 * 100) / 100
    assert vram.vllm_share(card, cfg, 16.0) == 0.95  # capped: vLLM needs some memory it does not plan
    row = vram.estimate(card, cfg, "accurate", 80.0).row("vLLM reservation")
    assert row.gib == pytest.approx(vram.vllm_share(card, cfg, 80.0) * 80.0)
    assert f"gpu_memory_utilization auto = {vram.vllm_share(card, cfg, 80.0):g} × 80 GiB" in row.formula


def test_a_number_is_used_as_given():
    cfg = cfgmod.load("tiny-arith", [*BIG, "rollout.backend=vllm", "rollout.gpu_memory_utilization=0.5"])
    assert vram.vllm_share(model_card.load("qwen3-8b"), cfg, 80.0) == 0.5


@pytest.mark.parametrize(
    "value, message",
    [
        ("most", "config error: rollout.gpu_memory_utilization = 'most': expected auto or a number"),
        ("1.5", "config error: rollout.gpu_memory_utilization = 1.5: must be <= 1 or auto"),
        ("0", "config error: rollout.gpu_memory_utilization = 0.0: must be > 0 or auto"),
        ("-3", "config error: train.micro_batch_size = -3: must be >= 0 or auto"),
    ],
)
def test_auto_key_errors_name_auto(tmp_path, value, message):
    key = message.split(" = ")[0].removeprefix("config error: ")
    result = run_cli("train", "tiny-arith", "--set", f"{key}={value}", cwd=tmp_path)
    assert (result.returncode, result.stderr.strip()) == (2, message)


# ---- the studio asks before launching a run that will not fit ----------------------------------


@pytest.mark.anyio
async def test_studio_asks_before_launching_a_refused_run(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "gpus", lambda: [])
    launched = []
    cfg = cfgmod.load("tiny-arith", BIG)
    app = StudioApp(cfg, "tiny-arith", tmp_path / "runs", live_hardware=False)
    monkeypatch.setattr(app, "launch_run", lambda c, label=None, force=False: launched.append(force))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert isinstance(app.screen, Confirm)
        text = " ".join(visible_text(app.screen.query("Label").first()).split())  # the question, wrapped
        assert text.startswith("Pre-flight: the run needs ") and "Launch anyway?" in text
        await pilot.press("n")
        await pilot.pause()
        assert launched == []
        await pilot.press("ctrl+r")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
    assert launched == [True]
