"""VRAM planner: documented mode against Unsloth's published numbers, accurate mode against hand
computation, LoRA counts against real peft models, inverse solving, bad inputs."""

import json
import math

import pytest

from grpo_studio.contract import config, model_card
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.planner import vram

GIB = 2**30


def cfg_of(*overrides):
    """A config on the hf rollout backend (the hand computations' setting) plus overrides."""
    return config.load(None, ["rollout.backend=hf", *overrides])


# ---- documented mode: unsloth.ai/blog/grpo, Llama 3.1 8B, 20K context, 8 generations ---------


@pytest.mark.parametrize(
    "variant, logits, infer, total", [("standard", 78.28, 16.0, 510.8), ("efficient", 9.79, 0.0, 54.3)]
)
def test_documented_reproduces_unsloth(variant, logits, infer, total):
    """Doc: GRPO memory 78.3 / 9.8 GB, KV 2.5 GB, inference 16 / 0 GB, totals 510.8 / 54.3 GB
    (training rows 414 / 42 are the doc's inputs). 2·2·8·20480·128256 B = 78.28 GiB."""
    cfg = cfg_of(
        "model.name=llama-3.1-8b",
        "rollout.max_prompt_len=512",
        "rollout.max_completion_len=19968",
        "rollout.num_generations=8",
    )
    est = vram.estimate(model_card.load("llama-3.1-8b"), cfg, "documented", variant=variant)
    assert est.row("GRPO logits").gib == pytest.approx(logits, abs=0.05)
    assert est.row("KV cache").gib == pytest.approx(2.50, abs=0.05)
    assert est.row("inference weights copy").gib == pytest.approx(infer, abs=0.05)
    assert est.total_gib == pytest.approx(total, abs=0.05)
    assert "no derivation" in est.row("training").formula


def test_documented_rule_of_thumb_off_the_doc_setup():
    """QLoRA: params in B ≈ GB; LoRA 16-bit ≈ 4× that (Qwen3-8B: 8 and 32)."""
    card = model_card.load("qwen3-8b")
    q = vram.estimate(card, cfg_of("model.load_in_4bit=true"), "documented")
    l16 = vram.estimate(card, cfg_of(), "documented")
    assert q.row("training").gib == 8 and l16.row("training").gib == 32


# ---- accurate mode: hand computations ------------------------------------------------------


def test_accurate_llama_3_2_1b_lora_bf16():
    """Llama-3.2-1B, LoRA r=16 all-linear, bf16 (h=2048, kv=512, I=8192, 16 layers):
    LoRA = 16 layers · 16 · [(2048+2048)·2 (q,o) + (2048+512)·2 (k,v) + (2048+8192)·3] = 11,272,192
    → ·16 B = 0.16797 GiB; weights 1,235,814,400 · 2 B = 2.30183 GiB.
    Logits (B=2·4=8, c=64, V=128256, a=2): 8·65·128256·(4+2) + 2·8·65·128256·4 + 8·64·8 B = 0.86893 GiB.
    HF KV cache: 2·2 B·16 layers·(64+64) tok·512·8 seqs = 0.03125 GiB."""
    cfg = cfg_of(
        "model.name=llama-3.2-1b",
        "model.dtype=bf16",
        "model.lora_rank=16",
        "rollout.num_generations=4",
        "train.prompts_per_step=2",
        "rollout.max_prompt_len=64",
        "rollout.max_completion_len=64",
    )
    card = model_card.load("llama-3.2-1b")
    assert card.lora_params(16, ["all-linear"]) == 11_272_192
    est = vram.estimate(card, cfg, "accurate", device="cpu")
    assert est.row("LoRA adapter + AdamW").gib == pytest.approx(11_272_192 * 16 / GIB)
    assert est.row("base weights").gib == pytest.approx(1_235_814_400 * 2 / GIB)
    logits = 8 * 65 * 128256 * 6 + 2 * 8 * 65 * 128256 * 4 + 8 * 64 * 8
    assert est.row("logits + log-softmax").gib == pytest.approx(logits / GIB)
    assert est.row("rollout KV cache (hf generate)").gib == pytest.approx(2 * 2 * 16 * 128 * 512 * 8 / GIB)


def test_accurate_qwen3_0_6b_full_ft_fp32_activations():
    """Qwen3-0.6B full FT fp32 (h=1024, q=2048, kv=1024, I=3072, 16 heads, 8 kv heads), no checkpointing,
    per token per layer (CPU: + 4·T mask): norms 2·(4h+4+4h)=16392; qk-norm 4·(q+kv)+4·24+4·(q+kv)=24672;
    attention 4·4·q+4·16=32832; mlp 3·4·I=36864; linear inputs 2·4·h+4·I=20480 → 131240 (+ 4·T).
    Weights 596,049,920 · 4 B; state 12 B/param."""
    T, B = 96, 4
    cfg = cfg_of(
        "model.name=qwen3-0.6b",
        "model.lora_rank=0",
        "rollout.num_generations=4",
        "train.prompts_per_step=1",
        "rollout.max_prompt_len=32",
        "rollout.max_completion_len=64",
    )
    card = model_card.load("qwen3-0.6b")
    per, _ = vram.per_layer_token_bytes(card, cfg, "cuda", T)
    assert per == 131240
    est = vram.estimate(card, cfg, "accurate", device="cuda")
    outside = (4 * 1024 + 4) + (4 * 1024 + 8) + 4 * 1024 * 65 / T
    assert est.row("activations").gib == pytest.approx(B * T * (28 * per + outside) / GIB)
    assert est.row("base weights").gib == pytest.approx(596_049_920 * 4 / GIB)
    assert est.row("full FT grads + AdamW").gib == pytest.approx(596_049_920 * 12 / GIB)


def test_phase_peak_sum_vs_max():
    """vLLM colocated: sum of vLLM and training transients unless it sleeps, then their max."""
    card = model_card.load("qwen3-1.7b")
    base = ["model.name=qwen3-1.7b", "rollout.backend=vllm", "rollout.gpu_memory_utilization=0.5"]
    awake = vram.estimate(card, cfg_of(*base), gpu_gib=80)
    asleep = vram.estimate(card, cfg_of(*base, "rollout.sleep=true"), gpu_gib=80)
    rows = {r.name: r.gib for r in awake.rows}
    fixed = rows["base weights"] + rows["LoRA adapter + AdamW"]
    transient = rows["activations"] + rows["logits + log-softmax"]
    tensors_awake = fixed + 40 + transient
    tensors_asleep = fixed + max(40, transient)
    assert awake.total_gib == pytest.approx(tensors_awake * 1.05 + 0.5)
    assert asleep.total_gib == pytest.approx(tensors_asleep * 1.05 + 0.5)


def test_rows_carry_their_phase_and_the_hf_peak_takes_the_larger_phase():
    """hf: the sampler frees its KV cache before training, so the peak is persistent + max(rollout, train)."""
    est = vram.estimate(model_card.load("qwen3-0.6b"), cfg_of("model.name=qwen3-0.6b"), device="cuda")
    assert {r.name: r.phase for r in est.rows} == {
        "base weights": "persistent",
        "LoRA adapter + AdamW": "persistent",
        "activations": "train",
        "logits + log-softmax": "train",
        "sampler weights copy (hf)": "persistent",
        "rollout KV cache (hf generate)": "rollout",
        "CUDA context": "overhead",
        "allocator margin": "overhead",
    }
    g = {r.name: r.gib for r in est.rows}
    tensors = (
        g["base weights"]
        + g["LoRA adapter + AdamW"]
        + g["sampler weights copy (hf)"]
        + max(g["rollout KV cache (hf generate)"], g["activations"] + g["logits + log-softmax"])
    )
    assert est.total_gib == pytest.approx(tensors * 1.05 + 0.5)


def test_cards_params_match_architecture():
    """Every card's published params equals the count computed from its architecture (±0.1%)."""
    for name in model_card.card_names():
        card = model_card.load(name)
        assert card.total_params() == pytest.approx(card.params, rel=1e-3), name
    oss = model_card.load("gpt-oss-20b")
    assert oss.active_params_per_token() == pytest.approx(oss.active_params, rel=1e-3)


# ---- LoRA counts against real peft models --------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_lora_params_equal_peft(family, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM),
    }[family]
    torch.manual_seed(0)
    model = cls[1](
        cls[0](
            hidden_size=96,
            intermediate_size=160,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=24,
            vocab_size=128,
        )
    )
    model.save_pretrained(tmp_path)
    card = model_card.load(str(tmp_path))
    assert card.family == family and card.total_params() == sum(p.numel() for p in model.parameters())
    for rank, targets in [(8, ["all-linear"]), (4, ["q_proj", "v_proj"])]:
        fresh = cls[1](model.config)
        peft_model = get_peft_model(
            fresh,
            LoraConfig(
                r=rank, target_modules=targets[0] if targets == ["all-linear"] else targets, task_type="CAUSAL_LM"
            ),
        )
        trainable, _ = peft_model.get_nb_trainable_parameters()  # what print_trainable_parameters prints
        assert card.lora_params(rank, targets) == trainable


# ---- inverse solving -----------------------------------------------------------------------


@pytest.mark.parametrize("key", vram.SOLVE_KEYS)
def test_solve_fits_and_next_does_not(key):
    card = model_card.load("qwen3-4b")
    cfg = cfg_of(
        "model.name=qwen3-4b",
        "model.dtype=bf16",
        "model.lora_rank=16",
        "train.prompts_per_step=1",
        "model.gradient_checkpointing=true",
        "rollout.max_completion_len=1024",
        "rollout.max_prompt_len=256",
    )
    sol = vram.solve(card, cfg, key, 40.0)
    at = vram.estimate(card, vram._with(cfg, key, sol.value), gpu_gib=40.0)
    nxt = vram.estimate(card, vram._with(cfg, key, sol.value + sol.step), gpu_gib=40.0)
    assert at.fits and not nxt.fits and sol.limiting_row
    values = [max(2, sol.value * k // 8) for k in range(1, 12)]
    totals = [vram.estimate(card, vram._with(cfg, key, v), gpu_gib=40.0).total_gib for v in values]
    assert totals == sorted(totals)  # monotone in the key


def test_solve_documented_context():
    cfg = cfg_of("model.name=llama-3.1-8b", "rollout.max_prompt_len=512", "rollout.max_completion_len=19968")
    card = model_card.load("llama-3.1-8b")
    sol = vram.solve(card, cfg, "context", 80.0, mode="documented")
    assert sol.total_gib <= 80.0 < sol.next_total_gib and sol.limiting_row == "GRPO logits"


def test_solve_says_why_there_is_no_answer():
    """No value fits (never_fits, with the largest row), or the key never outgrows the GPU (never_outgrows):
    results, not errors."""
    card, cfg = model_card.load("qwen3-0.6b"), cfg_of("model.name=qwen3-0.6b")
    low = vram.solve(card, cfg, "num_generations", 1.0)
    at_two = vram.estimate(card, vram._with(cfg, "num_generations", 2), gpu_gib=1.0)
    assert (low.status, low.value, low.total_gib) == ("never_fits", 2, at_two.total_gib)
    assert low.limiting_row == max(at_two.rows, key=lambda r: r.gib).name == "activations"
    top = vram.solve(card, cfg, "lora_rank", 80.0, mode="documented")  # the doc's rows have no rank in them
    assert (top.status, top.value, top.next_total_gib) == ("never_outgrows", 4096, None)
    assert vram.solve(card, cfg, "num_generations", 80.0).status == "fits"


# ---- bad inputs: one line ------------------------------------------------------------------


def test_unknown_model_lists_closest_cards():
    with pytest.raises(UserError) as err:
        model_card.load("qwen3-9b")
    assert "qwen3-8b" in str(err.value) and "\n" not in str(err.value)


def test_hub_ids_of_carded_models_resolve():
    assert model_card.load("meta-llama/Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    assert model_card.load("Qwen/Qwen3-8B").name == "qwen3-8b"


def test_vram_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, grpo_studio.contract.planner.vram, grpo_studio.contract.model_card, grpo_studio.cli.vram_cmd; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_json_shape():
    est = vram.estimate(model_card.load("gemma-3-1b"), cfg_of("model.name=gemma-3-1b"), gpu_gib=24.0)
    out = json.loads(json.dumps(est.to_json()))
    assert out["mode"] == "accurate" and out["gpu_gib"] == 24.0 and out["total_gib"] == round(est.total_gib, 4)
    assert all({"name", "gib", "formula"} <= set(r) for r in out["rows"])
    # fits <=> total <= GPU: the fp32 default needs ~32 GiB, so not on 24 GiB, and yes on 40 GiB
    assert 24.0 < out["total_gib"] < 40.0 and out["fits"] is False
    roomy = vram.estimate(model_card.load("gemma-3-1b"), cfg_of("model.name=gemma-3-1b"), gpu_gib=40.0).to_json()
    assert json.loads(json.dumps(roomy))["fits"] is True and roomy["total_gib"] == out["total_gib"]


def test_rollout_kv_cache_holds_the_whole_rollout_of_steps_per_generation():
    """One rollout samples prompts_per_step × steps_per_generation prompts × G completions, while
    each optimizer step trains one part: the KV row doubles with steps_per_generation = 2 and the
    activation row stays."""
    card = model_card.load("qwen3-1.7b")
    one, two = (
        vram.estimate(
            card, cfg_of("rollout.backend=hf", f"train.steps_per_generation={k}", "train.save_every=0"), "accurate"
        )
        for k in (1, 2)
    )
    kv = "rollout KV cache (hf generate)"
    assert two.row(kv).gib == pytest.approx(2 * one.row(kv).gib, rel=1e-6)
    assert two.row("activations").gib == one.row("activations").gib


# ---- devices: data-parallel ranks and the rollout's own device ----------------------------------

LLAMA_1B = [
    "model.name=llama-3.2-1b",
    "model.dtype=bf16",
    "model.lora_rank=16",
    "rollout.num_generations=4",
    "train.prompts_per_step=2",
    "rollout.max_prompt_len=64",
    "rollout.max_completion_len=64",
]
# Llama-3.2-1B decoder layer: q,o 2048·2048 each + k,v 2048·512 each + gate,up,down 2048·8192 each + 2 norms;
# the root: the tied embedding 128256·2048 + the final norm
LLAMA_1B_LAYER = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048
LLAMA_1B_ROOT = 128256 * 2048 + 2048


def parallel_cfg(parallel, *overrides):
    """train.parallel as the planner sees it (config.load refuses 'fsdp' until the trainer has it)."""
    cfg = cfg_of(*overrides, *([] if parallel == "none" else ["train.parallel=ddp"]))
    cfg.train.parallel = parallel
    return cfg


def test_fsdp_divides_weights_and_state_and_each_rank_trains_its_share():
    """N = 2, fsdp, against N = 1 (LoRA r=16, bf16, 2 prompts × 4 generations): base weights and the LoRA
    state halve; FSDP2 holds the root (262,670,336 params: not resharded after the forward) and one layer
    (60,821,504) whole, · 2 B (bf16, as stored); each rank trains 1 prompt × 4 rows,
    so activations and logits (all terms ∝ rows, chunk = min(rows, 8)) halve, as does the hf KV cache."""
    card = model_card.load("llama-3.2-1b")
    assert (LLAMA_1B_LAYER, LLAMA_1B_ROOT) == (60_821_504, 262_670_336)
    assert 16 * LLAMA_1B_LAYER + LLAMA_1B_ROOT == card.total_params()
    one = vram.estimate(card, parallel_cfg("none", *LLAMA_1B), device="cpu")
    two = vram.estimate(card, parallel_cfg("fsdp", *LLAMA_1B), device="cpu", world_size=2)
    assert [(d.name, d.kind) for d in two.devices] == [("train rank 0", "train"), ("train rank 1", "train")]
    assert two.row("base weights").gib == pytest.approx(one.row("base weights").gib / 2)
    assert two.row("LoRA adapter + AdamW").gib == pytest.approx(11_272_192 * 16 / 2 / GIB)
    assert two.row("FSDP gathered weights").gib == pytest.approx((LLAMA_1B_ROOT + LLAMA_1B_LAYER) * 2 / GIB)
    logits = 4 * 65 * 128256 * 6 + 2 * 4 * 65 * 128256 * 4 + 4 * 64 * 8  # B = 4 rows, chunk 4
    assert two.row("logits + log-softmax").gib == pytest.approx(logits / GIB)
    for name in ("activations", "rollout KV cache (hf generate)"):
        assert two.row(name).gib == pytest.approx(one.row(name).gib / 2)
    assert two.row("sampler weights copy (hf)").gib == one.row("sampler weights copy (hf)").gib  # each rank's own
    g = {r.name: r.gib for r in two.rows}
    peak = (
        g["base weights"]
        + g["LoRA adapter + AdamW"]
        + g["sampler weights copy (hf)"]
        + max(
            g["rollout KV cache (hf generate)"],
            g["FSDP gathered weights"] + g["activations"] + g["logits + log-softmax"],
        )
    )
    assert two.total_gib == pytest.approx(peak) and all(d.total_gib == two.total_gib for d in two.devices)


def test_fsdp_full_fine_tune_computes_in_its_dtype_without_autocast_copies():
    """Full FT bf16 under fsdp (engine/model/fsdp.py: fp32 master weights sharded, bf16 compute through the
    mixed-precision policy): 12 B/param state ÷ 2 with no autocast copies; the gathered root + layer in bf16
    plus their fp32 gradients: 6 B/param."""
    card = model_card.load("llama-3.2-1b")
    full = [*LLAMA_1B, "model.lora_rank=0"]
    one = vram.estimate(card, parallel_cfg("none", *full), device="cpu")
    two = vram.estimate(card, parallel_cfg("fsdp", *full), device="cpu", world_size=2)
    P = card.total_params()
    assert one.row("full FT grads + AdamW").gib > 12 * P / GIB  # one process: + autocast copies
    assert two.row("full FT grads + AdamW").gib == pytest.approx(12 * P / 2 / GIB)
    assert two.row("base weights").gib == pytest.approx(4 * P / 2 / GIB)
    assert two.row("FSDP gathered weights").gib == pytest.approx((LLAMA_1B_ROOT + LLAMA_1B_LAYER) * 6 / GIB)


def test_ddp_keeps_the_whole_model_per_rank_and_adds_the_gradient_all_reduce():
    """ddp, N = 2: weights and state as N = 1; activations halve; engine/run/distributed.py's reduce_gradients holds
    8 B per trainable parameter after the backward (a phase of its own: the activations are freed by then)."""
    card = model_card.load("llama-3.2-1b")
    one = vram.estimate(card, parallel_cfg("none", *LLAMA_1B), device="cpu")
    two = vram.estimate(card, parallel_cfg("ddp", *LLAMA_1B), device="cpu", world_size=2)
    for name in ("base weights", "LoRA adapter + AdamW"):
        assert two.row(name).gib == one.row(name).gib
    assert two.row("activations").gib == pytest.approx(one.row("activations").gib / 2)
    reduce = two.row("ddp gradient all-reduce")
    assert (reduce.gib, reduce.phase) == (pytest.approx(11_272_192 * 8 / GIB), "reduce")
    g = {r.name: r.gib for r in two.rows}
    train = max(g["activations"] + g["logits + log-softmax"], reduce.gib)
    assert two.total_gib == pytest.approx(
        g["base weights"]
        + g["LoRA adapter + AdamW"]
        + g["sampler weights copy (hf)"]
        + max(g["rollout KV cache (hf generate)"], train)
    )


def test_rollout_on_its_own_device_takes_the_vllm_rows_off_the_training_device():
    """rollout.colocate = false: the training device carries no rollout row; the rollout device holds
    gpu_memory_utilization × its size (80 GiB here); without a size, the need (bf16 weights + the KV cache of
    8 prompts × 8 generations of 64 + 16 tokens). Two ranks start a server each; a named server is shared."""
    card = model_card.load("qwen3-1.7b")
    base = [
        "model.name=qwen3-1.7b",
        "rollout.backend=vllm",
        "rollout.gpu_memory_utilization=0.5",
        "model.dtype=bf16",
        "rollout.max_prompt_len=64",
        "rollout.max_completion_len=16",
    ]
    together = vram.estimate(card, cfg_of(*base), gpu_gib=80)
    apart = vram.estimate(card, cfg_of(*base, "rollout.colocate=false"), gpu_gib=80)
    assert [(d.name, d.kind) for d in apart.devices] == [("train", "train"), ("rollout", "rollout")]
    train, rollout = apart.devices
    assert not any(r.phase == "rollout" for r in train.rows)
    assert [(r.name, r.gib) for r in rollout.rows] == [("vLLM reservation", 40.0)] and rollout.total_gib == 40.0
    g = {r.name: r.gib for r in together.rows}
    fixed = g["base weights"] + g["LoRA adapter + AdamW"]
    transient = g["activations"] + g["logits + log-softmax"]
    assert together.total_gib == pytest.approx((fixed + 40 + transient) * 1.05 + 0.5)
    assert train.total_gib == pytest.approx((fixed + transient) * 1.05 + 0.5)
    assert apart.total_gib == max(train.total_gib, 40.0) and apart.fits
    need = card.total_params() * 2 + 2 * 2 * card.layers * 80 * card.kv_dim * 64
    unsized = vram.estimate(card, cfg_of(*base, "rollout.colocate=false"), device="cpu").device("rollout")
    assert unsized.total_gib == pytest.approx(need / GIB) and unsized.fits is None
    ddp = ["rollout.colocate=false", "train.parallel=ddp"]
    names = lambda b: [d.name for d in b.devices]  # noqa: E731
    assert names(vram.estimate(card, cfg_of(*base, *ddp), gpu_gib=80, world_size=2)) == [
        "train rank 0",
        "train rank 1",
        "rollout server 0",
        "rollout server 1",
    ]
    assert names(
        vram.estimate(card, cfg_of(*base, *ddp, "rollout.server=127.0.0.1:8000"), gpu_gib=80, world_size=2)
    ) == ["train rank 0", "train rank 1", "rollout"]


def test_a_reservation_that_cannot_hold_the_rollout_does_not_fit():
    card = model_card.load("qwen3-8b")
    cfg = cfg_of(
        "model.name=qwen3-8b",
        "rollout.backend=vllm",
        "rollout.colocate=false",
        "rollout.gpu_memory_utilization=0.1",
        "model.dtype=bf16",
    )
    est = vram.estimate(card, cfg, gpu_gib=80)
    assert est.device("rollout").total_gib == pytest.approx(8.0) and est.device("rollout").fits is False
    assert est.fits is False


def test_token_budget_micro_batches_size_activations_and_logits():
    """train.micro_batch_tokens = 300 with rows of 64 + 64 tokens: 300 // 128 = 2 rows per forward instead of
    the whole 8; activations scale by 2/8 and logits follow B = 2 (chunk 2). A budget below one row: 1 row."""
    card = model_card.load("llama-3.2-1b")
    whole = vram.estimate(card, cfg_of(*LLAMA_1B), device="cpu")
    budget = vram.estimate(card, cfg_of(*LLAMA_1B, "train.micro_batch_tokens=300"), device="cpu")
    assert budget.row("activations").gib == pytest.approx(whole.row("activations").gib * 2 / 8)
    logits = 2 * 65 * 128256 * 6 + 2 * 2 * 65 * 128256 * 4 + 2 * 64 * 8
    assert budget.row("logits + log-softmax").gib == pytest.approx(logits / GIB)
    assert "micro_batch_tokens 300 // 128 tok" in budget.row("activations").formula
    tiny = vram.estimate(card, cfg_of(*LLAMA_1B, "train.micro_batch_tokens=50"), device="cpu")
    assert tiny.row("activations").gib == pytest.approx(whole.row("activations").gib / 8)


def test_vllm_share_sizes_the_need_the_reservation_row_shows():
    """One arithmetic: vllm_share's auto value is the need that the reservation row reports it holds."""
    card = model_card.load("qwen3-8b")
    cfg = cfg_of("model.name=qwen3-8b", "rollout.backend=vllm", "model.dtype=bf16")
    need = vram.vllm_need(card, cfg)[0] / GIB
    assert vram.vllm_share(card, cfg, 80.0) == math.ceil((need * 1.2 + 1.0) / 80 * 100) / 100
    assert f"holds {need:.2f} GiB" in vram.estimate(card, cfg, gpu_gib=80).row("vLLM reservation").formula


@pytest.mark.parametrize(
    "mode, parallel, overrides, needle",
    [
        (
            "documented",
            "ddp",
            [],
            "vram error: --mode = 'documented': is Unsloth's one-GPU arithmetic; plans for 2 "
            "devices need --mode accurate",
        ),
        (
            "accurate",
            "none",
            [],
            "vram error: train.parallel = 'none': 2 processes need train.parallel = 'ddp' or 'fsdp'",
        ),
        (
            "accurate",
            "ddp",
            ["train.prompts_per_step=3"],
            "vram error: train.prompts_per_step = 3: must divide evenly among the 2 processes",
        ),
    ],
)
def test_per_device_plans_refuse_in_one_line(mode, parallel, overrides, needle):
    with pytest.raises(UserError) as err:
        vram.estimate(model_card.load("qwen3-0.6b"), parallel_cfg(parallel, *overrides), mode, world_size=2)
    assert str(err.value).startswith(needle) and "\n" not in str(err.value)


def test_json_lists_every_device():
    cfg = cfg_of("model.name=qwen3-1.7b", "rollout.backend=vllm", "rollout.colocate=false")
    out = json.loads(json.dumps(vram.estimate(model_card.load("qwen3-1.7b"), cfg, gpu_gib=24.0).to_json()))
    assert [(d["name"], d["kind"]) for d in out["devices"]] == [("train", "train"), ("rollout", "rollout")]
    assert out["total_gib"] == max(d["total_gib"] for d in out["devices"])
    assert out["rows"] == out["devices"][0]["rows"]
