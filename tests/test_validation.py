"""Total validation: every user mistake the hardening issue's fuzzing found is one exact line.

NaN/inf and overflowing numbers, list items, sizes past their bounds, TOML that is not UTF-8 or not a
table, names too long; the files a user names (recipe, data file, reward file, model folder, run
directory) read inside one boundary. Most cases run `config.load`, the data loader, the reward loader
or the model loader in this process; the CLI cases check exit code 2 and the one stderr line.
"""

from __future__ import annotations

import pytest
from cli_helpers import run_cli

from grpo_studio.contract import config
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.model import policy_loader
from grpo_studio.engine.prompts import data, prompt_render
from grpo_studio.rewards import build

LONG = "a" * 300  # one path component longer than NAME_MAX (255)

SET_CASES = [
    (["train.lr=nan"], "config error: train.lr = nan: must be a finite number"),
    (["train.lr=inf"], "config error: train.lr = inf: must be a finite number"),
    (["algo.beta=-inf"], "config error: algo.beta = -inf: must be a finite number"),
    (["algo.epsilon=1e999"], "config error: algo.epsilon = inf: must be a finite number"),
    (["rollout.num_generations=1000000000"], "config error: rollout.num_generations = 1000000000: must be <= 1024"),
    (["train.prompts_per_step=1000000000"], "config error: train.prompts_per_step = 1000000000: must be <= 65536"),
    (
        ["train.prompts_per_step=2048", "rollout.num_generations=1024"],
        "config error: train.prompts_per_step = 2048: 2097152 sequences per step with rollout.num_generations = 1024; "
        "must be <= 1048576",
    ),
    (["train.seed=4294967296"], "config error: train.seed = 4294967296: must be <= 4294967295"),
    (["train.steps=1e300"], "config error: train.steps = '1e300': expected an integer"),
    (["rewards.timeout_s=1e9"], "config error: rewards.timeout_s = 1000000000.0: must be <= 86400"),
    (["train.max_bad_steps=-1"], "config error: train.max_bad_steps = -1: must be >= 0"),
    (["rewards.weights=[1, nan]"], "config error: rewards.weights[1] = nan: must be a finite number"),
    (["rewards.weights=1, x"], "config error: rewards.weights[1] = 'x': expected a number"),
    (["rewards.weights=[true, 1]"], "config error: rewards.weights[0] = true: expected a number"),
    (["rewards.funcs=[1]"], "config error: rewards.funcs[0] = 1: expected a string"),
    (["rewards.keywords=[[1]]"], "config error: rewards.keywords[0] = [1]: expected a string"),
    (["rewards.funcs=[1"], 'config error: rewards.funcs = \'[1\': expected a list like ["a", "b"]'),
    (
        ["model.lora_target_modules=[]"],
        "config error: model.lora_target_modules = []: give at least one module name, or 'all-linear'",
    ),
    (["data.source=\udcff"], "config error: data.source = '\\udcff': not valid UTF-8 text"),
    (["train.st\neps=3"], "config error: unknown key 'train.st\\neps' (did you mean 'train.steps'?)"),
]


@pytest.mark.parametrize("sets, message", SET_CASES, ids=[" ".join(s) for s, _ in SET_CASES])
def test_set_mistakes_are_one_exact_line(sets, message):
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", sets)
    assert str(err.value) == message


TOML_CASES = [
    (b"algo = 3\n", "config error: algo = 3: must be a [algo] table of keys in {path}"),
    (b"[train]\nlr = nan\n", "config error: train.lr = nan: must be a finite number"),
    (b"[train]\nlr = 1" + b"0" * 400 + b"\n", "config error: train.lr = 1" + "0" * 400 + ": must be a finite number"),
    (
        b"[rollout]\nnum_generations = 99999999999999999999999\n",
        "config error: rollout.num_generations = 99999999999999999999999: must be <= 1024",
    ),
    (
        b"[rewards]\nweights = [1.0, inf]\nfuncs = ['correctness', 'format']\n",
        "config error: rewards.weights[1] = inf: must be a finite number",
    ),
    (
        b"[train]\nsteps = 3 # caf\xe9\n",
        "config error: recipe = '{path}': cannot read it: not UTF-8 text (byte 0xe9 at offset 23)",
    ),
    (
        b"[train]\nsteps = 1" + b"0" * 5000 + b"\n",
        "config error: {path}: invalid TOML: Exceeds the limit (4300 digits) for integer string conversion: value "
        "has 5001 digits; use sys.set_int_max_str_digits() to increase the limit",
    ),
    (b'["tra\\nin"]\nsteps = 3\n', "config error: unknown section 'tra\\nin' (did you mean 'train'?) in {path}"),
]


@pytest.mark.parametrize("text, message", TOML_CASES, ids=range(len(TOML_CASES)))
def test_toml_mistakes_are_one_exact_line(tmp_path, text, message):
    path = tmp_path / "r.toml"
    path.write_bytes(text)
    with pytest.raises(UserError) as err:
        config.load(str(path))
    assert str(err.value) == message.format(path=path)


def test_a_recipe_name_too_long_is_one_line():
    with pytest.raises(UserError) as err:
        config.load(LONG)
    assert str(err.value) == f"config error: recipe = '{LONG}': cannot read it: file name too long"


# ---- the files a user names: data, rewards, model ---------------------------------------------------


def data_cfg(source, *sets):
    return config.load("tiny-arith", [f"data.source={source}", *sets]).data


def test_data_file_mistakes_are_one_exact_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "caf\xe9"}\n')
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("question,answer\n1+1=,2,extra\n")
    conv = tmp_path / "conv.jsonl"
    conv.write_text('{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"}\n' * 3)
    cases = [
        (
            data_cfg(bad),
            f"config error: data.source = '{bad}': cannot read the file (not UTF-8 text (byte 0xe9 at offset 15))",
        ),
        (
            data_cfg(ragged, "data.prompt_column=text"),
            f"config error: data.source = '{ragged}': row 1 has more fields than the header's 2",
        ),
        (
            data_cfg(f"{tmp_path}/{LONG}.jsonl"),
            f"config error: data.source = '{tmp_path}/{LONG}.jsonl': cannot read it: file name too long",
        ),
        (
            data_cfg("~nosuchuser_x/d.jsonl"),
            "config error: data.source = '~nosuchuser_x/d.jsonl': cannot read it: "
            "RuntimeError: Could not determine home directory.",
        ),
        (
            data_cfg("builtin:arith", "data.eval_size=2500"),
            "config error: data.eval_size = 2500: builtin:arith has 2500 rows; allowed: 0 to 2499 (rows held out for "
            "evaluation)",
        ),
        (
            data_cfg("builtin:arith", "data.eval_split=test"),
            "config error: data.eval_split = 'test': picks a part of a Hugging Face dataset and data.source = "
            "'builtin:arith' is a built-in task; allowed: '' (hold rows out with data.eval_size)",
        ),
    ]
    for cfg, message in cases:
        with pytest.raises(UserError) as err:
            data.load_rows(cfg, "train")
        assert str(err.value) == message
    cfg = data_cfg(conv, "data.eval_size=1", "data.chat_template={% if %}")
    with pytest.raises(UserError) as err:
        prompt_render.prompt_text(
            data.load_rows(cfg, "train")[0],
            cfg,
            policy_loader.load_tokenizer(policy_loader.resolve_model_path("tiny-arith")),
        )
    assert str(err.value) == (
        "config error: data.chat_template = '{% if %}': rendering a prompt failed "
        "(TemplateSyntaxError: Expected an expression, got 'end of statement block')"
    )


def test_reward_file_that_exits_or_raises_at_import_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(7)\n")
    (tmp_path / "exits_mod.py").write_text("raise SystemExit('bye')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = [
        ("exits.py:f", "config error: rewards.funcs = 'exits.py:f': loading exits.py raised SystemExit: 7"),
        ("exits_mod:f", "config error: rewards.funcs = 'exits_mod:f': importing 'exits_mod' raised SystemExit: bye"),
        (f"{LONG}.py:f", f"config error: rewards.funcs = '{LONG}.py:f': cannot read it: file name too long"),
    ]
    for entry, message in cases:
        with pytest.raises(UserError) as err:
            build([entry])
        assert str(err.value) == message


def test_model_folder_mistakes_are_one_line(tmp_path):
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "config.json").write_text("{not json")
    (tmp_path / "notok").mkdir()
    (tmp_path / "notok" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(UserError) as err:
        policy_loader.resolve_model_path(f"{tmp_path}/{LONG}")
    assert str(err.value) == f"config error: model.name = '{tmp_path}/{LONG}': cannot read it: file name too long"
    for name in ("badjson", "notok"):  # the reason is transformers' own first line
        path = str(tmp_path / name)
        with pytest.raises(UserError) as err:
            policy_loader.load_tokenizer(policy_loader.resolve_model_path(path))
        assert str(err.value).startswith(f"config error: model.name = '{path}': could not load (")
        assert len(str(err.value).splitlines()) == 1


def test_lora_target_modules_the_model_lacks_are_one_line():
    from grpo_studio.contract import precision_plan

    cfg = config.load("tiny-arith", ['model.lora_target_modules=["nonexistent"]'])
    path = policy_loader.resolve_model_path(cfg.model.name)
    with pytest.raises(UserError) as err:
        policy_loader.load_policy(cfg, path, precision_plan.resolve(cfg))
    assert str(err.value) == (
        "config error: model.lora_target_modules = ['nonexistent']: matches no module of the "
        "model; allowed: all-linear, or its linear layers down_proj, gate_proj, k_proj, "
        "lm_head, o_proj, q_proj, up_proj, v_proj"
    )


# ---- through the CLI: exit 2, one line, before torch wherever it can be ------------------------------


def test_cli_run_dir_and_reward_mistakes_exit_2_with_one_line(tmp_path):
    (tmp_path / "afile").write_text("")
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(7)\n")
    (tmp_path / "algo.toml").write_text("algo = 3\n")
    cases = [
        (
            ["--run-dir", str(tmp_path / "afile")],
            f"config error: --run-dir = '{tmp_path}/afile': cannot use it as the run directory: it is a file",
        ),
        (
            ["--run-dir", str(tmp_path / "afile" / "run")],
            f"config error: --run-dir = '{tmp_path}/afile/run': cannot use it as the run directory: not a directory",
        ),
        (
            ["--run-dir", str(tmp_path / LONG)],
            f"config error: --run-dir = '{tmp_path}/{LONG}': cannot use it as the run directory: file name too long",
        ),
        (
            ["--resume", str(tmp_path / LONG)],
            f"config error: --resume = '{tmp_path}/{LONG}': cannot read it: file name too long",
        ),
        (
            [str(tmp_path / "algo.toml"), "--run-dir", str(tmp_path / "run")],
            f"config error: algo = 3: must be a [algo] table of keys in {tmp_path}/algo.toml",
        ),
        (
            ["--set", 'rewards.funcs=["exits.py:f"]', "--run-dir", str(tmp_path / "run")],
            "config error: rewards.funcs = 'exits.py:f': loading exits.py raised SystemExit: 7",
        ),
    ]
    for args, message in cases:
        proc = run_cli("train", *args, cwd=tmp_path)
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [message]), proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
