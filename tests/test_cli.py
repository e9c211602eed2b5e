"""The front door (cli/main.py): one argument tree, one usage-error line per command, one UserError
boundary, `config --keys`, and --json output that is only JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest
from cli_helpers import run_cli

from grpo_studio.cli import main as front
from grpo_studio.cli.output import stdout_to_stderr
from grpo_studio.contract import config
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.rundir import RunLock
from grpo_studio.engine import __version__


def err_of(capsys, *argv: str) -> tuple[int, str]:
    rc = front.main(list(argv))
    return rc, capsys.readouterr().err


# ---- the tree ----------------------------------------------------------------------------


def test_help_lists_every_command_and_version_prints(capsys):
    assert front.main(["--help"]) == 0
    text = capsys.readouterr().out
    for name, about in front.COMMANDS.items():
        assert f"{name} {about}" in " ".join(text.split()), name  # a long name (rollout-serve) wraps its line
    assert front.main(["-V"]) == 0
    assert capsys.readouterr().out == f"grpo-studio {__version__}\n"


@pytest.mark.parametrize(
    "argv, prog",
    [
        (["train", "--nope"], "grpo-studio train"),
        (["vram", "--nope"], "grpo-studio vram"),
        (["runs", "--nope"], "grpo-studio runs"),
        (["attach", "somerun", "--nope"], "grpo-studio attach"),
        (["bench", "mismatch", "--nope"], "grpo-studio bench mismatch"),
        (["bench", "vram-accuracy", "--nope"], "grpo-studio bench vram-accuracy"),
        (["rewards", "--nope"], "grpo-studio rewards"),
        (["report", "somerun", "--nope"], "grpo-studio report"),
        (["config", "--keys", "--nope"], "grpo-studio config"),
        (["--nope"], "grpo-studio"),  # the bare form that opens the studio
    ],
)
def test_a_usage_mistake_is_the_commands_own_line(argv, prog, capsys):
    assert err_of(capsys, *argv) == (2, f"{prog}: error: unrecognized arguments: --nope (see --help)\n")


def test_a_missing_argument_is_a_usage_line(capsys):
    assert err_of(capsys, "bench") == (
        2,
        "grpo-studio bench: error: the following arguments are required: NAME (see --help)\n",
    )


def test_unknown_benchmark_lists_them_with_did_you_mean(capsys):
    assert err_of(capsys, "bench", "mismatchh") == (
        2,
        "bench error: NAME = 'mismatchh': allowed: faults, logprobs, mismatch, rollout, scaling, step, ui, vram-accuracy "
        "(did you mean 'mismatch'?)\n",
    )


def test_a_flag_outside_its_choices_is_a_user_error(capsys):
    assert err_of(capsys, "bench", "mismatch", "--backend", "vlm") == (
        2,
        "bench error: --backend = 'vlm': allowed: hf, vllm (did you mean 'vllm'?)\n",
    )


def test_bare_form_is_the_studio_on_a_recipe(capsys):
    """No command word: `grpo-studio RECIPE --set ...`; the recipe is loaded before any terminal check."""
    assert err_of(capsys, "no-such-recipe") == (
        2,
        "config error: recipe 'no-such-recipe' not found: not a .toml file or a preset (presets: chat-arith, "
        "guess-number, tiny-arith, tool-calc, tool-lookup, word-problems)\n",
    )
    assert err_of(capsys, "--set", "train.stepz=3") == (
        2,
        "config error: unknown key 'train.stepz' (did you mean 'train.steps'?)\n",
    )


# ---- the one error boundary --------------------------------------------------------------


def test_boundary_prints_a_run_lock_as_one_line(capsys, monkeypatch, tmp_path):
    def locked(args):
        raise RunLock(f"run error: {args.dir} is in use by trainer pid 7; stop it or pick another --run-dir")

    monkeypatch.setattr("grpo_studio.cli.runs_cmd.run", locked)
    assert err_of(capsys, "runs", str(tmp_path)) == (
        2,
        f"run error: {tmp_path} is in use by trainer pid 7; stop it or pick another --run-dir\n",
    )


@pytest.mark.parametrize(
    "argv, line",
    [
        (["runs", "/nonexistent"], "runs error: '/nonexistent' is not a folder"),
        (
            ["report", "/nonexistent"],
            "report error: '/nonexistent' has no metrics.jsonl (not a run directory, or no step yet)",
        ),
        (["bench", "mismatch", "--prompts", "0"], "bench error: --prompts = 0: must be >= 1"),
        (
            ["bench", "mismatch", "--dtypes", " , "],
            "bench error: --dtypes = ' , ': empty; allowed: fp32, bf16, fp16, fp8-unified, fp8-rollout",
        ),
    ],
)
def test_user_errors_of_each_kind(argv, line, capsys):
    assert err_of(capsys, *argv) == (2, line + "\n")


def test_user_error_line_from_its_parts():
    assert str(UserError("must be >= 1", key="train.steps", value=-1)) == "config error: train.steps = -1: must be >= 1"
    err = UserError(kind="vram", key="--mode", value="acurate", allowed=("documented", "accurate"))
    assert str(err) == "vram error: --mode = 'acurate': allowed: documented, accurate (did you mean 'accurate'?)"
    assert (err.kind, err.key, err.value, err.allowed) == ("vram", "--mode", "acurate", ("documented", "accurate"))
    assert str(UserError(key="rollout.dtype", value="fp9", allowed=("", "fp32"))) == (
        "config error: rollout.dtype = 'fp9': allowed: \"\", fp32"
    )
    assert (
        str(UserError(key="model.load_in_4bit", value=True, why="no")) == "config error: model.load_in_4bit = true: no"
    )
    relabelled = UserError("must be >= 1", key="rollout.max_prompt_len", value=-4)
    assert relabelled.line("vram") == "vram error: rollout.max_prompt_len = -4: must be >= 1"


# ---- config --keys -----------------------------------------------------------------------


def test_config_keys_lists_every_key_with_type_default_allowed_and_help(capsys):
    assert front.main(["config", "--keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["KEY", "TYPE", "DEFAULT", "HELP"]
    rows = {line.split()[0]: " ".join(line.split()) for line in lines[1:]}
    assert list(rows) == config.all_keys()
    assert rows["model.dtype"] == "model.dtype str 'fp32' trainer precision; allowed: fp32, bf16, fp16, fp8"
    assert rows["rollout.top_p"] == "rollout.top_p float 1.0 nucleus sampling; 1 = off; allowed: > 0, <= 1"
    assert all(len(row.split(" ", 3)) == 4 for row in rows.values())  # every key says what it does


def test_config_keys_json(capsys):
    assert front.main(["config", "--keys", "--json"]) == 0
    keys = json.loads(capsys.readouterr().out)
    assert [k["key"] for k in keys] == config.all_keys()
    assert keys[[k["key"] for k in keys].index("train.lr")] == {
        "key": "train.lr",
        "type": "float",
        "default": 0.001,
        "choices": None,
        "lo": 0,
        "hi": 10000.0,
        "lo_open": True,
        "help": "AdamW learning rate",
        "auto": False,
        "item": None,
    }
    weights = keys[[k["key"] for k in keys].index("rewards.weights")]
    assert (weights["type"], weights["item"]) == ("list", "float")
    share = keys[[k["key"] for k in keys].index("rollout.gpu_memory_utilization")]
    assert (share["type"], share["default"], share["auto"]) == ("float", "auto", True)


def test_config_needs_keys(capsys):
    assert err_of(capsys, "config") == (
        2,
        "grpo-studio config: error: the following arguments are required: --keys (see --help)\n",
    )


# ---- --json is only JSON -----------------------------------------------------------------


def test_noise_inside_goes_to_stderr(capfd):
    """Python prints, raw writes to fd 1 and child processes (as vLLM's engine core) all land on stderr."""
    with stdout_to_stderr():
        print("python noise")
        os.write(1, b"fd noise\n")
        subprocess.run(["echo", "child noise"], check=True)
    print('{"ok": true}')
    out, err = capfd.readouterr()
    assert out == '{"ok": true}\n'
    assert err.splitlines() == ["python noise", "fd noise", "child noise"]


def test_vram_json_is_only_json(tmp_path):
    proc = run_cli("vram", "tiny-arith", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == "tiny-arith"


@pytest.mark.slow
def test_bench_json_is_only_json(tmp_path):
    proc = run_cli(
        "bench",
        "mismatch",
        "--json",
        "--backend",
        "hf",
        "--dtypes",
        "fp32",
        "--prompts",
        "2",
        "--generations",
        "2",
        "--max-tokens",
        "2",
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["benchmark"] == "mismatch" and list(report["results"]) == ["fp32"]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_bench_rollout_json_is_only_json_though_vllm_talks(tmp_path):
    """vLLM logs from this process and from its engine-core child; all of it must stay off stdout."""
    proc = run_cli(
        "bench",
        "rollout",
        "--json",
        "--model",
        "tiny-arith",
        "--prompts",
        "4",
        "--n",
        "2",
        "--max-tokens",
        "8",
        "--eager",
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["workload"]["model"] == "tiny-arith"
    assert "vLLM" in proc.stderr or "vllm" in proc.stderr  # it did talk, on stderr


def test_top_level_help_lists_every_benchmark():
    import argparse

    from grpo_studio.cli.bench_cmd import BENCHMARKS
    from grpo_studio.cli.main import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    assert helps["bench"] == f"run a benchmark ({', '.join(BENCHMARKS)})"
    assert list(BENCHMARKS) == ["faults", "logprobs", "mismatch", "rollout", "scaling", "step", "ui", "vram-accuracy"]
