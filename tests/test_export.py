"""`grpo-studio export` against oracles: the trainer's own merged weights and greedy completions (transformers and
vLLM), the GGUF file read back with gguf's reader, and the exact one-line errors with exit code 2.

Two short real runs of the bundled model, trained once for the module: LoRA in fp32 (checkpoints at steps 1
and 2) and a full fine-tune in bf16.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

from tests.cli_helpers import ROOT, run_cli
from tests.studio_helpers import anyio_backend  # noqa: F401

PROMPTS = 20
NEW_TOKENS = 12


def _train(run_dir, *overrides):
    from grpo_studio.contract import config
    from grpo_studio.engine.run.trainer import Trainer

    cfg = config.load(
        "tiny-arith",
        ["rollout.backend=hf", "train.prompts_per_step=2", "rollout.num_generations=4", "data.eval_size=0", *overrides],
    )
    trainer = Trainer(cfg, run_dir)
    try:
        assert trainer.run() == "finished"
    finally:
        trainer.close()
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    return {
        "lora": _train(root / "lora", "model.dtype=fp32", "train.steps=2", "train.save_every=1"),
        "full": _train(root / "full", "model.dtype=bf16", "model.lora_rank=0", "train.steps=1"),
    }


@pytest.fixture(scope="module")
def tok():
    from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path("tiny-arith"))


@pytest.fixture(scope="module")
def texts(tok):
    from grpo_studio.contract import config
    from grpo_studio.engine.prompts import data, prompt_render

    cfg = config.load("tiny-arith")
    return [prompt_render.prompt_text(row, cfg.data, tok) for row in data.load_rows(cfg.data, "train")[:PROMPTS]]


@pytest.fixture(scope="module")
def prompts(tok, texts):
    return [tok.encode(text, add_special_tokens=False) for text in texts]


@pytest.fixture(scope="module")
def trainer_merged(runs):
    """The trainer's merged policy at the newest LoRA checkpoint: its adapters loaded into the trainer's model,
    and the weights its sampler receives (engine/model/weights.py) loaded into a copy of the base."""
    from peft import PeftModel

    from grpo_studio.engine.model.policy_loader import load_base, resolve_model_path
    from grpo_studio.engine.model.weights import export_weights

    base_path = resolve_model_path("tiny-arith")
    policy = PeftModel.from_pretrained(load_base(base_path, torch.float32), runs["lora"] / "checkpoints/step-2")
    merged = load_base(base_path, torch.float32)
    weights = dict(export_weights(policy))
    assert merged.load_state_dict(weights, strict=False).unexpected_keys == []
    return merged, weights


@pytest.fixture(scope="module")
def merged_dir(runs, tmp_path_factory):
    from grpo_studio.cli.main import main

    dest = tmp_path_factory.mktemp("out") / "merged"
    assert main(["export", str(runs["lora"]), "--merged", str(dest)]) == 0
    return dest


def _greedy(model, prompts) -> list[list[int]]:
    """NEW_TOKENS greedy tokens after each prompt (one left-padded batch; past <eos> too)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=0
        )
    return out[:, width:].tolist()


def test_merged_loads_and_matches_the_trainers_merged_policy(merged_dir, trainer_merged, prompts, tok, capsys):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_studio.engine.model.policy_loader import load_base, resolve_model_path

    assert sorted(p.name for p in merged_dir.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    stored = load_file(merged_dir / "model.safetensors")
    assert not [k for k in stored if "lora" in k] and {t.dtype for t in stored.values()} == {torch.float32}
    oracle, weights = trainer_merged
    assert weights and all(torch.equal(stored[name], w) for name, w in weights.items())  # peft's merge == the sampler's
    model = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    assert AutoTokenizer.from_pretrained(merged_dir).get_vocab() == tok.get_vocab()
    completions = _greedy(model, prompts)
    assert completions == _greedy(oracle.eval(), prompts)
    base = load_base(resolve_model_path("tiny-arith"), torch.float32).eval()
    assert completions != _greedy(base, prompts)  # the adapters changed what the model says: the check has teeth


def test_full_fine_tune_exports_in_the_runs_dtype(runs, tmp_path):
    from safetensors.torch import load_file

    from grpo_studio.engine.out import export

    line = export.export_merged(runs["full"], None, tmp_path / "m")
    assert line == f"exported full/step-1 merged (bfloat16) to {tmp_path / 'm'}"
    trained = load_file(runs["full"] / "checkpoints/step-1/model.safetensors")  # fp32 master weights
    stored = load_file(tmp_path / "m/model.safetensors")
    assert stored.keys() == trained.keys()
    assert all(torch.equal(stored[k], trained[k].to(torch.bfloat16)) for k in trained)


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_merged_serves_in_vllm_with_the_same_greedy_output(merged_dir, trainer_merged, prompts, tok):
    from grpo_studio.contract.config import Config
    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.sampler import Sampling
    from grpo_studio.engine.sampler.vllm_backend import VLLMBackend

    cfg = Config()
    cfg.model.name, cfg.model.dtype = str(merged_dir), "fp32"
    cfg.rollout.backend, cfg.rollout.vllm_enforce_eager = "vllm", "on"
    backend = VLLMBackend(cfg, str(merged_dir), tok, resolve(cfg), emit_event=lambda *a, **k: None)
    try:
        out = backend.generate(prompts, Sampling(n=1, max_tokens=NEW_TOKENS, top_k=1))
    finally:
        backend.close()
    served = [row[mask.bool()].tolist() for row, mask in zip(out.completion_ids, out.mask)]
    expected = [ids[: ids.index(1) + 1] if 1 in ids else ids for ids in _greedy(trainer_merged[0], prompts)]
    assert served == expected  # vLLM stops at <eos> (id 1)


@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_gguf_reads_back_with_the_expected_tensors_and_metadata(runs, trainer_merged, tmp_path, quant):
    import gguf
    import numpy as np

    from grpo_studio.engine.out import export

    path = tmp_path / "m.gguf"
    assert export.export_gguf(runs["lora"], None, path, quant) == f"exported lora/step-2 as GGUF {quant} to {path}"
    reader = gguf.GGUFReader(path)
    meta = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}
    config = json.loads((ROOT / "presets/models/tiny-arith/config.json").read_text())
    vocab = json.loads((ROOT / "presets/models/tiny-arith/tokenizer.json").read_text())["model"]["vocab"]
    assert {k: v for k, v in meta.items() if not k.startswith("tokenizer.ggml.") or k.endswith("_id")} == {
        "general.architecture": "qwen3",
        "general.type": "model",
        "general.name": "lora-step-2",
        "qwen3.block_count": 2,
        "qwen3.context_length": 128,
        "qwen3.embedding_length": 256,
        "qwen3.feed_forward_length": 512,
        "qwen3.attention.head_count": 4,
        "qwen3.attention.head_count_kv": 2,
        "qwen3.attention.key_length": 64,
        "qwen3.attention.value_length": 64,
        "qwen3.rope.freq_base": 10000.0,
        "qwen3.attention.layer_norm_rms_epsilon": pytest.approx(config["rms_norm_eps"]),
        "general.file_type": {"f32": 0, "q8_0": 7}[quant],
        "general.quantization_version": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 2,
        "tokenizer.ggml.padding_token_id": 0,
    }
    assert meta["tokenizer.ggml.model"] == "llama" and meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["tokenizer.ggml.tokens"] == [("\u2581" if t == " " else t) for t in sorted(vocab, key=vocab.get)]
    assert meta["tokenizer.ggml.token_type"][:6] == [3, 3, 3, 4, 4, 1]  # control, control, control, user, user, normal

    layer = [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "attn_q_norm",
        "attn_k_norm",
        "attn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
        "ffn_norm",
    ]
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{b}.{n}.weight" for b in range(2) for n in layer
    }  # tied: no output.weight
    _, weights = trainer_merged
    q = weights["model.layers.1.self_attn.q_proj.weight"].numpy()
    got = tensors["blk.1.attn_q.weight"]
    assert got.tensor_type.name == quant.upper() and tuple(got.shape) == q.shape[::-1]
    values = gguf.quants.dequantize(got.data, got.tensor_type).reshape(q.shape)
    tolerance = 0 if quant == "f32" else np.abs(q).max() / 127  # q8_0: one int8 step of a 32-wide block's scale
    assert np.abs(values - q).max() <= tolerance
    assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")
def test_gguf_tokenizes_and_generates_in_llama_cpp_like_transformers(
    runs, trainer_merged, texts, prompts, tok, tmp_path
):
    from llama_cpp import Llama

    from grpo_studio.engine.out import export

    path = tmp_path / "m.gguf"
    export.export_gguf(runs["lora"], None, path, "f32")
    llm = Llama(str(path), n_ctx=128, verbose=False, seed=0)
    expected = _greedy(trainer_merged[0], prompts)
    for text, ids, want in zip(texts, prompts, expected):
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids
        got = []
        for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            got.append(token)
            if len(got) == NEW_TOKENS:
                break
        assert got == want
        assert llm.detokenize(got).decode() == tok.decode(want, skip_special_tokens=False).replace("<eos>", "")


ERRORS = [  # (argv after the run, what the run is, the exact line); every one exits 2
    (["--merged", "{tmp}/m"], "missing", "export error: RUN = '{run}': no such folder"),
    (["--merged", "{tmp}/m"], "notrun", "export error: RUN = '{run}': not a run directory (no config.toml)"),
    (
        ["--merged", "{tmp}/m"],
        "empty",
        "export error: RUN = '{run}': no complete checkpoint under checkpoints/ "
        "(a run writes one at its end and every train.save_every steps)",
    ),
    (
        ["--step", "7", "--merged", "{tmp}/m"],
        "lora",
        "export error: --step = 7: no complete checkpoint at that step in {run}; allowed: 1, 2",
    ),
    (
        ["--merged", "{tmp}/full"],
        "lora",
        "export error: --merged = '{tmp}/full': exists and is not empty; choose a new path or empty it",
    ),
    (
        ["--gguf", "{tmp}/m.gguf", "--quant", "q4_k"],
        "lora",
        "export error: --quant = 'q4_k': not a GGUF type this converter writes; allowed: f32, f16, bf16, q8_0",
    ),
    (["--merged", "{tmp}/m", "--quant", "q8_0"], "lora", "export error: --quant = 'q8_0': applies to --gguf only"),
    (
        ["--push", "me/tiny"],
        "lora",
        "export error: --push = 'me/tiny': cannot push: the Hugging Face Hub is offline here (HF_HUB_OFFLINE=1)",
    ),
]


@pytest.mark.parametrize(
    "argv, which, line", ERRORS, ids=[e[2].split(":")[1].strip() + f"-{i}" for i, e in enumerate(ERRORS)]
)
def test_user_errors_are_one_line_with_exit_code_2(runs, tmp_path, capsys, argv, which, line):
    from grpo_studio.cli.main import main

    run = {"missing": tmp_path / "nope", "notrun": tmp_path, "empty": tmp_path / "empty"}.get(which, runs.get(which))
    if which == "empty":  # a config, and a checkpoint cut short: its files, no manifest
        (run / "checkpoints/step-1").mkdir(parents=True)
        (run / "config.toml").write_text((runs["lora"] / "config.toml").read_text())
        shutil.copy(runs["lora"] / "checkpoints/step-1/adapter_model.safetensors", run / "checkpoints/step-1")
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("")
    fill = {"tmp": tmp_path, "run": run}
    assert main(["export", str(run), *(a.format(**fill) for a in argv)]) == 2
    assert capsys.readouterr().err == line.format(**fill) + "\n"
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.gguf").exists()


def test_push_offline_from_the_command_line(runs):
    """The real process: HF_HUB_OFFLINE=1 (tests/cli_helpers.py's environment), one line, exit code 2."""
    done = run_cli("export", str(runs["lora"]), "--push", "me/tiny", cwd=ROOT)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "export error: --push = 'me/tiny': cannot push: the Hugging Face Hub is offline here (HF_HUB_OFFLINE=1)\n"
    )


def test_export_command_picks_the_kind_from_the_destination(tmp_path):
    from grpo_studio.studio.launcher import export_command

    assert export_command(tmp_path, "out/m.GGUF")[-5:] == [
        "grpo_studio.cli.main",
        "export",
        str(tmp_path),
        "--gguf",
        "out/m.GGUF",
    ]
    assert export_command(tmp_path, "out/merged")[-2:] == ["--merged", "out/merged"]


@pytest.mark.anyio
async def test_runs_list_exports_in_a_child_process_and_shows_its_line(runs, tmp_path):
    from textual.widgets import Input

    from grpo_studio.contract import config
    from grpo_studio.studio.app import StudioApp
    from grpo_studio.studio.screens.runs_list_screen import RunsScreen
    from tests.studio_helpers import wait_until

    app = StudioApp(config.load("tiny-arith"), "tiny-arith", runs["lora"].parent, live_hardware=False, poll_s=3600)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.rows)
        screen = app.screen
        screen.query_one("#runs-table").move_cursor(row=[r["name"] for r in screen.rows].index("lora"))
        await pilot.press("x")
        await wait_until(pilot, lambda: app.screen is not screen)
        prompt = app.screen.query_one(Input)
        assert prompt.value == str(runs["lora"] / "merged")
        prompt.value = str(tmp_path / "m")
        await pilot.press("enter")
        want = f"exported lora/step-2 merged (float32) to {tmp_path / 'm'}"
        await wait_until(pilot, lambda: any(n.message == want for n in app._notifications), timeout=300)
        assert (tmp_path / "m/model.safetensors").is_file()
        prompt_again = str(tmp_path / "m")  # now not empty: the child refuses, the studio shows its line
        await pilot.press("x")
        await wait_until(pilot, lambda: app.screen is not screen)
        app.screen.query_one(Input).value = prompt_again
        await pilot.press("enter")
        refused = f"export error: --merged = '{prompt_again}': exists and is not empty; choose a new path or empty it"
        await wait_until(
            pilot, lambda: any(n.message == refused and n.severity == "error" for n in app._notifications), timeout=300
        )


def test_push_with_the_hub_unreachable_is_one_line(runs, monkeypatch, capsys):
    """Online mode, but the Hub endpoint refuses connections (a port bound on 127.0.0.1 that does not listen): the
    merged folder is built, then the upload fails in one line naming the repo."""
    import socket

    from huggingface_hub import constants

    from grpo_studio.cli.main import main

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
        monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
        assert main(["export", str(runs["lora"]), "--push", "me/tiny"]) == 2
    assert capsys.readouterr().err == (
        "export error: --push = 'me/tiny': cannot push to the Hugging Face Hub "
        "(ConnectError: [Errno 111] Connection refused)\n"
    )


@pytest.mark.anyio
async def test_dashboard_x_exports_the_run_it_shows(runs, tmp_path):
    """The dashboard's x asks for a destination and exports the run on screen, as the runs list does."""
    from grpo_studio.contract import config as cfgmod
    from grpo_studio.studio.app import StudioApp
    from grpo_studio.studio.screens.modals import PathPrompt

    run, dest = runs["lora"], tmp_path / "from-dashboard"
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", run.parent, live_hardware=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_run(run)
        await pilot.pause()
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, PathPrompt)
        app.screen.query_one("Input").value = str(dest)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
    assert (dest / "config.json").is_file() and (dest / "model.safetensors").is_file()
