"""`grpo-studio vram` through grpo_studio.cli.vram.main: table, --json, --solve, one-line errors."""

import json

import pytest

from grpo_studio.cli import vram as vram_cli

DOC = ["--set", "model.name=llama-3.1-8b", "--set", "rollout.max_prompt_len=512",
       "--set", "rollout.max_completion_len=19968", "--mode", "documented"]


def test_json_documented(capsys):
    assert vram_cli.main([*DOC, "--variant", "standard", "--gpu-mem", "80GiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "documented" and out["fits"] is False
    assert out["total_gib"] == pytest.approx(510.8, abs=0.05)
    assert [r["name"] for r in out["rows"]] == ["training", "GRPO logits", "inference weights copy", "KV cache"]


def test_table_and_verdict(capsys):
    assert vram_cli.main([*DOC, "--gpu-mem", "80GiB"]) == 0
    text = capsys.readouterr().out
    assert "54.29" in text and "fits" in text


def test_solve_prints_value_and_limit(capsys):
    assert vram_cli.main(["--set", "model.name=qwen3-0.6b", "--gpu-mem", "24", "--solve", "num_generations"]) == 0
    assert "limiting row" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["--set", "model.name=qwen3-8b", "--gpu-mem", "abc"], "--gpu-mem = 'abc'"),
    (["--set", "model.name=qwen3-8b", "--set", "rollout.max_prompt_len=-4"], "rollout.max_prompt_len = -4"),
    (["--set", "model.name=qwen4-8b"], "closest cards: qwen3-8b"),
    (["--set", "model.name=qwen3-8b", "--mode", "fast"], "allowed: documented, accurate"),
    (["--set", "model.name=qwen3-8b", "--solve", "steps", "--gpu-mem", "8"], "--solve = 'steps'"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_inputs_one_line(argv, needle, capsys):
    assert vram_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vram error:") and needle in err and err.count("\n") == 1


def test_parse_gpu_mem_units():
    assert vram_cli.parse_gpu_mem("24GiB") == 24
    assert vram_cli.parse_gpu_mem("16384MiB") == 16
    assert vram_cli.parse_gpu_mem("80GB") == pytest.approx(80e9 / 2 ** 30)
