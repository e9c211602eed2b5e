"""Every config mistake is one line naming key, value and what is allowed, with exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_helpers import ENV, ROOT, run_cli

import grpo_studio.cli.main
from grpo_studio.contract import backend, config
from grpo_studio.contract.errors import UserError, show

CASES = [
    (["--set", "train.stepz=3"], "config error: unknown key 'train.stepz' (did you mean 'train.steps'?)"),
    (["--set", "modle.dtype=bf16"], "config error: unknown key 'modle.dtype' (did you mean 'model.dtype'?)"),
    (
        ["--set", "model.dtype=bf17"],
        "config error: model.dtype = 'bf17': allowed: fp32, bf16, fp16, fp8 (did you mean 'bf16'?)",
    ),
    (["--set", "train.steps=abc"], "config error: train.steps = 'abc': expected an integer"),
    (["--set", "train.steps=-1"], "config error: train.steps = -1: must be >= 1"),
    (["--set", "model.lora_rank=1.5"], "config error: model.lora_rank = '1.5': expected an integer"),
    (["--set", "rollout.temperature=0"], "config error: rollout.temperature = 0.0: must be > 0"),
    (["--set", "rollout.top_p=1.5"], "config error: rollout.top_p = 1.5: must be <= 1"),
    (["--set", "train.lr=fast"], "config error: train.lr = 'fast': expected a number"),
    (
        ["--set", "model.gradient_checkpointing=maybe"],
        "config error: model.gradient_checkpointing = 'maybe': expected true or false",
    ),
    (
        ["--set", "algo.scale_rewards=grp"],
        "config error: algo.scale_rewards = 'grp': allowed: group, batch, none (did you mean 'group'?)",
    ),
    (
        ["--set", "rollout.backend=vlm"],
        "config error: rollout.backend = 'vlm': allowed: auto, hf, vllm (did you mean 'vllm'?)",
    ),
    (
        ["--set", "rewards.weights=[1.0]"],
        "config error: rewards.weights = [1.0]: needs 2 values, one per rewards.funcs entry",
    ),
    (
        ["--set", "rewards.funcs=[]"],
        "config error: rewards.funcs = []: give at least one reward function (or an env.environment that scores "
        "its episodes)",
    ),
    (["--set", "x"], "config error: --set 'x': expected section.key=value"),
    (
        ["nosuch-recipe"],
        "config error: recipe 'nosuch-recipe' not found: not a .toml file or a preset (presets: "
        "chat-arith, guess-number, tiny-arith, tool-calc, tool-lookup, word-problems)",
    ),
    (["missing.toml"], "config error: recipe file 'missing.toml' does not exist"),
    (
        ["--set", "model.name=/nonexistent/model"],
        "config error: model.name = '/nonexistent/model': not a bundled or packaged model (tiny-arith, smollm2-135m-instruct), a local folder with config.json, a .gguf file, or a hub id like 'Qwen/Qwen3-0.6B'",
    ),
    (
        ["--set", "model.name=someorg/not-cached-model"],
        "config error: model.name = 'someorg/not-cached-model': not in the local Hugging Face cache and this machine is offline; download it first or give a local folder",
    ),
    (
        ["--set", "rollout.dtype=fp8", "--set", "model.dtype=fp32"],
        "config error: rollout.dtype = 'fp8' with model.dtype = 'fp32': fp8 rollout pairs with model.dtype 'bf16' (rollout_only) or 'fp8' (unified)",
    ),
    (
        ["--resume", "/nonexistent/run"],
        "config error: --resume '/nonexistent/run': no config.toml there (not a run directory)",
    ),
]


def test_children_run_the_tree_under_test(tmp_path):
    """The error-path children import this checkout's front door, not some other installed tree."""
    probe = subprocess.run(
        [sys.executable, "-c", "import grpo_studio.cli.main as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=ENV,
        check=True,
    )
    assert probe.stdout.strip() == grpo_studio.cli.main.__file__ == str(ROOT / "cli" / "main.py")


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_config_is_one_line_with_exit_2(args, message, tmp_path):
    proc = run_cli("train", *args, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [message]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_invalid_toml_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nsteps = 3\n")
    with pytest.raises(UserError, match=r"^config error: .*bad.toml: invalid TOML: "):
        config.load(str(bad))


def test_toml_section_typo_gets_did_you_mean(tmp_path):
    bad = tmp_path / "typo.toml"
    bad.write_text("[trian]\nsteps = 3\n")
    with pytest.raises(UserError) as err:
        config.load(str(bad))
    assert str(err.value) == f"config error: unknown section 'trian' (did you mean 'train'?) in {bad}"


def test_set_overrides_recipe_and_algo_defaults():
    cfg = config.load("tiny-arith", ["algo.name=dapo", "algo.epsilon_high=0.3", "train.steps=7"])
    assert (cfg.algo.loss_type, cfg.algo.epsilon_high, cfg.train.steps) == ("dapo", 0.3, 7)


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = config.load("tiny-arith", ["algo.name=ppo_seq_mis"])
    path = tmp_path / "config.toml"
    config.save(cfg, path)
    assert config.load(str(path)) == cfg


VLLM_ONLY_VALUES = {  # key: (given, as the message shows it, its default as shown)
    "gpu_memory_utilization": ("0.5", "0.5", "'auto'"),
    "sleep": ("true", "true", "false"),
    "vllm_enforce_eager": ("on", "'on'", "'auto'"),
    "vllm_sync": ("merged", "'merged'", "'auto'"),
}


@pytest.mark.parametrize("key", backend.VLLM_ONLY)
def test_a_vllm_only_key_is_refused_with_the_hf_sampler_and_kept_otherwise(key):
    given, shown, default = VLLM_ONLY_VALUES[key]
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", ["rollout.backend=hf", f"rollout.{key}={given}"])
    assert err.value.line() == (
        f"config error: rollout.{key} = {shown}: only the vLLM rollout reads it, and rollout.backend = 'hf'; "
        f"leave it at {default} or set rollout.backend = 'vllm' or 'auto'"
    )
    for requested in ("vllm", "auto"):  # auto: vLLM where it can run, so the same config keeps its meaning there
        loaded = config.load("tiny-arith", [f"rollout.backend={requested}", f"rollout.{key}={given}"])
        assert show(getattr(loaded.rollout, key)) == shown
