"""QLoRA (model.load_in_4bit): the bundled model's base in bitsandbytes NF4 under LoRA adapters.

The base's linears are Linear4bit with the configured quantisation, a step trains only the adapters,
the hf sampler samples exactly the trainer's function (same NF4 base, adapters synced unmerged), the
planner's weight rows are the bytes bitsandbytes allocates, the combinations that cannot run are one
line before anything loads, and a 4-bit run learns, checkpoints a PEFT adapter for the full-precision
base and resumes into the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bitsandbytes as bnb
import pytest
import torch

from grpo_studio.benchmarks.tensor_bytes import with_quant_states
from grpo_studio.contract import backend, config, model_card, precision_plan
from grpo_studio.contract.planner import vram
from grpo_studio.engine.model import policy_loader
from grpo_studio.engine.model.weights import export_weights
from grpo_studio.engine.precision.numerics import torch_dtype
from grpo_studio.engine.prompts import data, prompt_render
from grpo_studio.engine.rollout.batching import join_prompt_completion
from grpo_studio.engine.run.trainer import Trainer
from grpo_studio.engine.sampler import Sampling
from grpo_studio.engine.sampler.hf import HFBackend
from grpo_studio.engine.train.logprobs import token_logprobs

PATH = policy_loader.resolve_model_path("tiny-arith")
LINEARS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
SMALL = ["rollout.num_generations=4", "train.eval_every=0"]


def qlora(*sets: str) -> config.Config:
    return config.load("tiny-arith", ["model.load_in_4bit=true", *sets])


def load(cfg: config.Config):
    return policy_loader.load_policy(cfg, PATH, precision_plan.resolve(cfg))


def adapters(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}


def storage_bytes(tensors) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


# ---- the model ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, double_quant", [("fp32", True), ("bf16", False), ("fp16", True)])
def test_the_base_linears_are_nf4_with_the_configured_compute_dtype_and_double_quant(dtype, double_quant):
    cfg = qlora(f"model.dtype={dtype}", f"model.double_quant={str(double_quant).lower()}")
    policy = load(cfg)
    base = policy.get_base_model()
    four_bit = {n.removesuffix(".base_layer"): m for n, m in base.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert sorted(four_bit) == sorted(
        f"model.layers.{i}.{part}.{name}"
        for i in range(2)
        for name in LINEARS
        for part in (["self_attn"] if name[0] in "qkvo" else ["mlp"])
    )
    for m in four_bit.values():
        assert m.weight.dtype == torch.uint8
        assert m.weight.quant_state.quant_type == "nf4"
        assert m.weight.quant_state.blocksize == 64
        assert m.weight.quant_state.nested is double_quant
        assert m.compute_dtype == torch_dtype(dtype)
    # the tied embedding / lm_head and the norms stay in model.dtype; the adapters are fp32
    assert type(base.lm_head) is torch.nn.Linear and base.lm_head.weight.dtype == torch_dtype(dtype)
    assert base.model.norm.weight.dtype == torch_dtype(dtype)
    lora = [p for n, p in policy.named_parameters() if p.requires_grad]
    assert len(lora) == 2 * 14 and all(p.dtype == torch.float32 for p in lora)


def test_a_qlora_step_changes_only_the_adapters():
    policy = load(qlora("model.lora_rank=4"))
    policy.train()
    base = policy.get_base_model()
    frozen = [t.detach().clone() for t in with_quant_states(p for p in base.parameters() if not p.requires_grad)]
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    ids = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(0))
    (policy(input_ids=ids).logits ** 2).mean().backward()

    with_grad = {n for n, p in policy.named_parameters() if p.grad is not None}
    assert with_grad == {n for n, _ in policy.named_parameters() if ".lora_A." in n or ".lora_B." in n}
    assert len(with_grad) == 28
    optimizer.step()
    after = [t.detach() for t in with_quant_states(p for p in base.parameters() if not p.requires_grad)]
    assert len(after) == len(frozen) and all(torch.equal(a, b) for a, b in zip(after, frozen))
    assert all(p.abs().sum() > 0 for n, p in policy.named_parameters() if ".lora_B." in n)  # zero-initialised


def test_the_hf_sampler_samples_the_trainers_function():
    """fp32: μ from the sampler's 4-bit copy and π from the trainer's forward agree to float rounding once
    non-zero adapters are synced; the base alone (adapters disabled) gives a clearly different π, so the
    sampler really runs the live adapters, unmerged."""
    cfg = qlora()
    plan = precision_plan.resolve(cfg)
    policy = load(cfg)
    policy.train()
    tok = policy_loader.load_tokenizer(PATH)
    sampler = HFBackend(PATH, tok, plan, cfg.model)
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if ".lora_B." in n:
                p.normal_(0.0, 0.05)
    sampler.load_weights(export_weights(policy))
    synced = adapters(sampler.model)
    assert synced.keys() == adapters(policy).keys()
    assert all(torch.equal(synced[n], t) for n, t in adapters(policy).items())

    rows = data.load_rows(cfg.data, "train")[:4]
    prompt_ids = prompt_render.encode_prompts(tok, [prompt_render.prompt_text(r, cfg.data, tok) for r in rows], 16)
    out = sampler.generate(prompt_ids, Sampling(n=4, max_tokens=8, temperature=1.0, top_p=1.0, top_k=0, seed=0))
    ids, attention = join_prompt_completion(prompt_ids, out.completion_ids, 4, tok.pad_token_id, torch.device("cpu"))
    T = out.mask.shape[1]
    pi = token_logprobs(policy, ids, attention, T, 1.0)[0].detach()
    with torch.no_grad(), policy.disable_adapter():
        base_pi = token_logprobs(policy, ids, attention, T, 1.0)[0]
    live = out.mask.bool()
    assert (out.logprobs - pi)[live].abs().max() < 1e-5
    assert (out.logprobs - base_pi)[live].abs().max() > 1e-2


# ---- the planner's rows against the bytes allocated ------------------------------------------

# By hand, tiny-arith: 2 layers of q,o (256×256), k,v (256→128), gate,up (256→512), down (512→256); the tied
# 64×256 embedding and 2·(256+256+64+64) + 256 norm weights = 17,920 other params. Per linear of n weights
# bitsandbytes keeps n/2 B of codes, a 16-entry fp32 NF4 table (64 B) and per 64-weight block an absmax:
#   double quant: 1 B each, plus per 256 blocks one fp32 (4 B), a 4 B offset and a 256-entry fp32 table (1024 B)
#     q,o  65,536: 32,768 + 1,024 + 16 + 4 + 1,024 + 64 = 34,900
#     k,v  32,768: 16,384 +   512 +  8 + 4 + 1,024 + 64 = 17,996
#     gate,up,down 131,072: 65,536 + 2,048 + 32 + 4 + 1,024 + 64 = 68,708
#     2 layers · (2·34,900 + 2·17,996 + 3·68,708) = 623,832
#   no double quant: 4 B each
#     q,o 32,768 + 4,096 + 64 = 36,928;  k,v 16,384 + 2,048 + 64 = 18,496;  gate,up,down 65,536 + 8,192 + 64 = 73,792
#     2 layers · (2·36,928 + 2·18,496 + 3·73,792) = 664,448
# The recipe's adapters (rank 16, all seven linears): 2 layers · 16 · (512 + 384 + 384 + 512 + 768 + 768 + 768)
# = 131,072 fp32 params.
HAND = {("fp32", True): 623_832 + 17_920 * 4, ("bf16", False): 664_448 + 17_920 * 2}
ROTARY_BUFFERS = 2 * 32 * 4  # inv_freq and original_inv_freq: head_dim/2 fp32 each
LORA_FP32 = 131_072 * 4


@pytest.mark.parametrize("dtype, double_quant", list(HAND))
def test_the_planners_4bit_weight_rows_are_the_bytes_bitsandbytes_allocates(dtype, double_quant):
    cfg = qlora(f"model.dtype={dtype}", f"model.double_quant={str(double_quant).lower()}")
    hand = HAND[(dtype, double_quant)]
    card = model_card.load(PATH)
    assert vram.weight_bytes(card, cfg)[0] == hand

    base = load(cfg).get_base_model()
    assert storage_bytes(with_quant_states(p for p in base.parameters() if not p.requires_grad)) == hand
    assert storage_bytes(base.buffers()) == ROTARY_BUFFERS

    # the hf sampler's own copy: the same 4-bit base in rollout.dtype + fp32 adapters, still after sampling
    # (bitsandbytes' CPU inference re-packing, which would change it, stays off: engine/sampler/hf.py)
    sampler = HFBackend(PATH, policy_loader.load_tokenizer(PATH), precision_plan.resolve(cfg), cfg.model)
    sampler.generate([[5, 6, 7]], Sampling(n=2, max_tokens=3, temperature=1.0, top_p=1.0, top_k=0, seed=0))
    row = vram.estimate(card, cfg, "accurate", device="cpu").row("sampler weights copy (hf)")
    assert row.gib * vram.GIB == hand + LORA_FP32
    assert storage_bytes(with_quant_states(sampler.model.parameters())) == hand + LORA_FP32


def test_auto_samples_a_4bit_base_with_hf_even_where_vllm_runs():
    assert backend.resolve("auto", lambda: None, load_in_4bit=True) == ("hf", None)
    assert backend.resolve("vllm", lambda: None, load_in_4bit=True) == ("vllm", None)  # the adapter-only sync
    assert backend.resolve("auto", lambda: None) == ("vllm", None)


# ---- one line before anything loads --------------------------------------------------------

REFUSED = "config error: model.load_in_4bit = true: "


@pytest.mark.parametrize(
    "sets, why",
    [
        (
            ["model.lora_rank=0"],
            "a 4-bit base cannot be fine-tuned in full (model.lora_rank = 0); set a LoRA rank > 0 (QLoRA)",
        ),
        (
            ["model.dtype=fp8"],
            "model.dtype = 'fp8': bitsandbytes 4-bit layers compute in fp32, bf16 or fp16; use one of those",
        ),
        (
            ["model.dtype=bf16", "rollout.dtype=fp8"],
            "rollout.dtype = 'fp8': bitsandbytes 4-bit layers compute in fp32, bf16 or fp16; use one of those",
        ),
        (
            ["rollout.backend=vllm", "rollout.vllm_sync=merged"],
            "rollout.backend = 'vllm' syncs merged weights here (rollout.vllm_sync = 'merged'), which a 4-bit "
            "base cannot give; use rollout.vllm_sync = 'auto' (vLLM serves the 16-bit base under the adapter, "
            "docs/mismatch.md) or rollout.backend = 'hf'",
        ),
    ],
)
def test_combinations_that_cannot_run_are_one_line_with_exit_2(tmp_path, sets, why):
    args = [a for s in ["model.load_in_4bit=true", *sets] for a in ("--set", s)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_studio.cli.main",
            "train",
            "tiny-arith",
            *args,
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", REFUSED + why + "\n")
    assert not (tmp_path / "run").exists()


def test_without_bitsandbytes_load_in_4bit_names_the_extra(tmp_path):
    """bitsandbytes hidden from the supervisor and the trainer it starts (a sitecustomize on PYTHONPATH)."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['bitsandbytes'] = None\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_studio.cli.main",
            "train",
            "tiny-arith",
            "--set",
            "model.load_in_4bit=true",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == REFUSED + "bitsandbytes is not installed: pip install 'grpo-studio[qlora]'"
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---- training --------------------------------------------------------------------------------


def rewards(run: Path) -> list[float]:
    return [json.loads(line)["reward/mean"] for line in (run / "metrics.jsonl").read_text().splitlines()]


# Mean reward of steps 16-20 minus steps 1-5, 20 steps of 8 prompts x 4, measured on CPU for train.seed 0-3
# (the hf sampler drawing by inverse CDF, zero-advantage micro-batches not run): +0.013, +0.362 (seed 1, the
# one used here), +0.238, +0.144. The margin holds for three of the four; a 20-step run of 32 samples is noisy.
MARGIN, SEED = 0.1, 1


@pytest.mark.slow
def test_a_4bit_run_learns_and_checkpoints_an_adapter_for_the_full_precision_base(tmp_path):
    run = tmp_path / "run"
    trainer = Trainer(
        qlora(*SMALL, "train.prompts_per_step=8", "train.steps=20", "train.save_every=0", f"train.seed={SEED}"), run
    )
    assert trainer.run() == "finished"
    trained = adapters(trainer.policy)
    trainer.close()
    reward = rewards(run)
    first, last = sum(reward[:5]) / 5, sum(reward[-5:]) / 5
    print(f"\nmean reward, steps 1-5: {first:.3f}; steps 16-20: {last:.3f}")
    assert last >= first + MARGIN

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    full = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(PATH, dtype=torch.float32), run / "checkpoints/step-20"
    )
    assert full.get_base_model().lm_head.weight.dtype == torch.float32
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in full.modules())
    loaded = adapters(full)
    assert loaded.keys() == trained.keys() and all(torch.equal(loaded[n], t) for n, t in trained.items())


@pytest.mark.slow
def test_a_resumed_4bit_run_is_the_uninterrupted_run(tmp_path):
    """CPU fp32: stop after step 2's checkpoint, resume to step 4: the same metrics and adapters as one run."""
    sets = [*SMALL, "train.prompts_per_step=4", "train.save_every=2"]
    whole = Trainer(qlora(*sets, "train.steps=4"), tmp_path / "whole")
    whole.run()
    Trainer(qlora(*sets, "train.steps=2"), tmp_path / "cut").run()
    resumed = Trainer(qlora(*sets, "train.steps=4"), tmp_path / "cut", resume=True)
    assert resumed.run() == "finished"
    keys = ("reward/mean", "loss", "grad_norm", "mismatch/k3")
    rows = {
        name: [
            {k: json.loads(line)[k] for k in keys}
            for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]
        for name in ("whole", "cut")
    }
    assert len(rows["whole"]) == 4 and rows["cut"] == rows["whole"]
    a, b = adapters(whole.policy), adapters(resumed.policy)
    assert all(torch.equal(a[n], b[n]) for n in a)
