"""`grpo-studio vram` through the front door (grpo_studio.cli.main.main): table, --json, --solve, one-line
errors."""

import json

import pytest

from grpo_studio.cli import vram_cmd as vram_cli
from grpo_studio.cli.main import main


def vram(*argv):
    return main(["vram", *argv])


DOC = [
    "--set",
    "model.name=llama-3.1-8b",
    "--set",
    "rollout.max_prompt_len=512",
    "--set",
    "rollout.max_completion_len=19968",
    "--mode",
    "documented",
]


def test_json_documented(capsys):
    assert vram(*DOC, "--variant", "standard", "--gpu-mem", "80GiB", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "documented" and out["fits"] is False
    assert out["total_gib"] == pytest.approx(510.8, abs=0.05)
    assert [r["name"] for r in out["rows"]] == ["training", "GRPO logits", "inference weights copy", "KV cache"]


def test_table_and_verdict(capsys):
    assert vram(*DOC, "--gpu-mem", "80GiB") == 0
    text = capsys.readouterr().out
    assert "54.29" in text and "fits" in text


def test_solve_prints_value_and_limit(capsys):
    assert vram("--set", "model.name=qwen3-0.6b", "--gpu-mem", "24", "--solve", "num_generations") == 0
    assert "limiting row" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--set", "model.name=qwen3-8b", "--gpu-mem", "abc"], "--gpu-mem = 'abc'"),
        (["--set", "model.name=qwen3-8b", "--set", "rollout.max_prompt_len=-4"], "rollout.max_prompt_len = -4"),
        (["--set", "model.name=qwen4-8b"], "closest cards: qwen3-8b"),
        (["--set", "model.name=qwen3-8b", "--mode", "fast"], "allowed: documented, accurate"),
        (["--set", "model.name=qwen3-8b", "--solve", "steps", "--gpu-mem", "8"], "--solve = 'steps'"),
    ],
)
def test_bad_inputs_one_line(argv, needle, capsys):
    assert vram(*argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vram error:") and needle in err and err.count("\n") == 1


def test_usage_mistake_is_the_commands_own_line(capsys):
    assert vram("--bogus") == 2
    assert capsys.readouterr().err == "grpo-studio vram: error: unrecognized arguments: --bogus (see --help)\n"


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["--gpu-mem", "1", "--solve", "num_generations"],  # the estimate at G = 2: 9.9 GiB, activations largest
            "vram error: --solve num_generations: does not fit 1 GiB even at num_generations = 2 (9.9 GiB; largest row: "
            "activations)",
        ),
        (
            ["--gpu-mem", "80", "--mode", "documented", "--solve", "lora_rank"],  # the doc's rows have no rank in them
            "vram error: --solve lora_rank: fits 80 GiB up to the cap lora_rank = 4096 (in documented mode lora_rank "
            "barely changes the total)",
        ),
    ],
)
def test_solve_without_an_answer_is_one_line(argv, line, capsys):
    """The planner answers never_fits / never_outgrows; the command line reports them as before."""
    assert vram("--set", "model.name=qwen3-0.6b", "--set", "rollout.backend=hf", *argv) == 2
    assert capsys.readouterr().err == line + "\n"


def test_parse_gpu_mem_units():
    assert vram_cli.parse_gpu_mem("24GiB") == 24
    assert vram_cli.parse_gpu_mem("16384MiB") == 16
    assert vram_cli.parse_gpu_mem("80GB") == pytest.approx(80e9 / 2**30)


def test_nproc_prints_every_device(capsys):
    """--nproc 2 with the rollout on its own device: one table per kind of device and one line per device,
    each with the totals of the planner's devices."""
    from grpo_studio.contract import config, model_card
    from grpo_studio.contract.planner import vram as planner

    sets = ["model.name=qwen3-1.7b", "rollout.backend=vllm", "rollout.colocate=false", "train.parallel=ddp"]
    argv = [x for s in sets for x in ("--set", s)]
    assert vram(*argv, "--nproc", "2", "--gpu-mem", "24") == 0
    text = capsys.readouterr().out
    est = planner.estimate(model_card.load("qwen3-1.7b"), config.load(None, sets), gpu_gib=24.0, world_size=2)
    for dev in est.devices:
        assert f"device {dev.name}: {dev.total_gib:.2f} GiB  {'fits' if dev.fits else 'does not fit'}" in text
    assert "train rank 0 … 1 (each)" in text and "rollout server 0 … 1 (each)" in text
    assert "ddp gradient all-reduce" in text
    assert vram(*argv, "--nproc", "2", "--gpu-mem", "24", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in out["devices"]] == [
        "train rank 0",
        "train rank 1",
        "rollout server 0",
        "rollout server 1",
    ]


def test_nproc_without_data_parallelism_is_one_line(capsys):
    assert vram("--set", "model.name=qwen3-0.6b", "--nproc", "2") == 2
    assert capsys.readouterr().err == (
        "vram error: train.parallel = 'none': 2 processes need train.parallel = 'ddp' "
        "or 'fsdp' (each trains on its share of the prompts); add --set "
        "train.parallel=ddp\n"
    )
