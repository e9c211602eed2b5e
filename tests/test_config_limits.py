"""Validation that knows its limits (issue 30, item 4): values at the edges of what a config can say are each
refused in one line naming key, value and what is allowed, with exit code 2; never a traceback, never silent.

Every float key is bounded on both sides by config_bounds.py (one home), so 1e308 is refused before it reaches
an optimizer; names and paths are checked before use; nesting is bounded before the parser recurses.
"""

from __future__ import annotations

import json
import math

import pytest
from cli_helpers import run_cli

from grpo_studio.contract import config

LONG_NAME = "m" * 300


def test_every_float_key_is_bounded_on_both_sides():
    """Floats (and the items of float lists) have a finite lower and upper bound, declared in the schema."""
    floats = [k for k in config.key_info() if k.type == "float" or k.item == "float"]
    assert len(floats) >= 20
    unbounded = [
        k.key
        for k in floats
        if k.lo is None or k.hi is None or not math.isfinite(k.lo) or not math.isfinite(k.hi) or k.hi > 2**32
    ]
    assert unbounded == []


def test_every_int_key_is_bounded_on_both_sides():
    ints = [k.key for k in config.key_info() if k.type == "int" and (k.lo is None or k.hi is None)]
    assert ints == []


def test_the_defaults_and_presets_sit_inside_the_bounds():
    for name in ("tiny-arith", "chat-arith", "word-problems"):
        for algo in config.ALGOS:
            config.load(name, [f"algo.name={algo}"])


CASES = [
    (["--set", "algo.epsilon=1e308"], "config error: algo.epsilon = 1e+308: must be <= 1000"),
    (["--set", "algo.beta=inf"], "config error: algo.beta = inf: must be a finite number"),
    (["--set", "algo.delta=-inf"], "config error: algo.delta = -inf: must be a finite number"),
    (["--set", "train.lr=nan"], "config error: train.lr = nan: must be a finite number"),
    (["--set", "train.lr=-0.001"], "config error: train.lr = -0.001: must be > 0"),
    (["--set", "train.lr=1e5"], "config error: train.lr = 100000.0: must be <= 10000"),
    (["--set", "rollout.temperature=1e9"], "config error: rollout.temperature = 1000000000.0: must be <= 100"),
    (["--set", "train.grad_clip=1e300"], "config error: train.grad_clip = 1e+300: must be <= 1000000"),
    (["--set", "model.lora_alpha=1e20"], "config error: model.lora_alpha = 1e+20: must be <= 1000000"),
    (
        ["--set", "precision.loss_scale_growth=1e10"],
        "config error: precision.loss_scale_growth = 10000000000.0: must be <= 1000",
    ),
    (["--set", "rewards.weights=[1e308, 1e308]"], "config error: rewards.weights[0] = 1e+308: must be <= 1000000"),
    (["--set", "rewards.weights=[1.0, -2e6]"], "config error: rewards.weights[1] = -2000000.0: must be >= -1000000"),
    (["--set", "rewards.weights=[1.0, nan]"], "config error: rewards.weights[1] = nan: must be a finite number"),
    (
        ["--set", f"model.name={LONG_NAME}"],
        f"config error: model.name = '{LONG_NAME}': a preset id, hub id or local folder: at most 255 bytes between "
        f"slashes and 4096 in all, no control characters",
    ),
    (
        ["--set", "alerts.webhook=http://[::1"],
        "config error: alerts.webhook = 'http://[::1': an http:// or https:// URL with a host, e.g. "
        "https://hooks.example.com/alerts, or empty for none",
    ),
    (
        ["--set", "alerts.webhook=https://"],
        "config error: alerts.webhook = 'https://': an http:// or https:// URL with a host, e.g. "
        "https://hooks.example.com/alerts, or empty for none",
    ),
    (
        ["--set", "alerts.webhook=http://example.com:99999/x"],
        "config error: alerts.webhook = 'http://example.com:99999/x': an http:// or https:// URL with a host, e.g. "
        "https://hooks.example.com/alerts, or empty for none",
    ),
    (
        ["--set", "rewards.funcs=" + "[" * 3000 + "]" * 3000],
        "config error: rewards.funcs = '" + "[" * 3000 + "]" * 3000 + '\': expected a list like ["a", "b"]',
    ),
]


def one_line(proc, message):
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [message])


@pytest.mark.parametrize(("args", "message"), CASES, ids=[a[-1][:40] for a, _ in CASES])
def test_out_of_range_is_one_line_with_exit_2(args, message, tmp_path):
    proc = run_cli("train", "tiny-arith", *args, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    one_line(proc, message)
    assert not (tmp_path / "run").exists()  # refused before anything starts


@pytest.mark.parametrize("body", ["[" * 3000 + "]" * 3000, "{a = " * 3000 + "1" + "}" * 3000, "[" * 9 + "]" * 9])
def test_deeply_nested_toml_is_one_line(body, tmp_path):
    recipe = tmp_path / "deep.toml"
    recipe.write_text(f"[model]\nname = {body}\n")
    proc = run_cli("train", str(recipe), "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    one_line(proc, f"config error: {recipe}: invalid TOML: tables and arrays nested more than 8 levels deep")


def test_a_model_folder_whose_config_json_is_not_json(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    proc = run_cli("vram", "--set", f"model.name={folder}", cwd=tmp_path)
    one_line(
        proc,
        f"vram error: model.name = '{folder}': cannot read {folder}/config.json: JSONDecodeError: "
        f"Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    )
    (folder / "config.json").write_text(json.dumps([1, 2]))
    proc = run_cli("vram", "--set", f"model.name={folder}", cwd=tmp_path)
    one_line(proc, f"vram error: model.name = '{folder}': {folder}/config.json is not a JSON object of model settings")
    proc = run_cli(
        "train",
        "tiny-arith",
        "--set",
        f"model.name={folder}",
        "--run-dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith(f"config error: model.name = '{folder}': ")


def test_a_reward_file_that_is_not_python(tmp_path):
    (tmp_path / "score.txt").write_text("def f(completions, **kw):\n    return [0.0] * len(completions)\n")
    proc = run_cli(
        "train",
        "tiny-arith",
        "--set",
        'rewards.funcs=["./score.txt:f"]',
        "--set",
        "train.steps=1",
        "--run-dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
        timeout=300,
    )
    one_line(
        proc,
        "config error: rewards.funcs = './score.txt:f': './score.txt' is not a .py file; give "
        "'file.py:function' or 'module:function'",
    )


def test_an_empty_prompt_names_its_row(tmp_path):
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "  ", "answer": "3"}, {"prompt": "2+2=", "answer": "4"}]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_cli(
        "train",
        "tiny-arith",
        "--set",
        f"data.source={data}",
        "--set",
        "data.eval_size=0",
        "--set",
        "train.steps=1",
        "--set",
        "train.prompts_per_step=2",
        "--run-dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
        timeout=300,
    )
    one_line(proc, f"config error: data.source = '{data}': row 2 has an empty prompt (column 'prompt')")
