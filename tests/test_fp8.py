"""FP8 simulation: the quantiser's error bounds, the linear path, and the unified vs rollout_only flows."""

import copy

import pytest
import torch
from torch import nn

from grpo_studio.engine.precision.fp8 import (
    ACT_BLOCK,
    FP8_MAX,
    WEIGHT_BLOCK,
    Fp8Linear,
    apply_fp8,
    dequantize_blocks,
    fp8_layers,
    fp8_linear_forward,
    quantize_blocks,
    quantize_dequantize,
)
from grpo_studio.engine.precision.mismatch import mismatch_metrics

# e4m3: 3 mantissa bits → relative rounding error ≤ 2^-4 for normal values (|q| ≥ 2^-6);
# subnormal spacing 2^-9 → absolute error ≤ 2^-10 in scaled units (i.e. ≤ 2^-10 · scale).
REL = 2.0**-4
SUB_ABS = 2.0**-10
FP32_SLACK = 1 + 2.0**-20  # two extra fp32 roundings (x·448/amax and q·scale)

# Shapes of the bundled tiny model's GEMMs (hidden 256, intermediate 512/768, 4 heads × 64,
# 2 KV heads, vocab 64) plus ragged ones that leave partial blocks.
SHAPES = [(256, 256), (256, 768), (768, 256), (512, 256), (128, 256), (64, 256), (64, 64), (200, 130), (1, 300)]


def blocky(shape, block, seed=0):
    """Random matrix whose blocks span 10 orders of magnitude (per-tensor scaling would fail)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    br, bc = block
    nr, nc = -(-shape[0] // br), -(-shape[1] // bc)
    mag = 10.0 ** torch.empty(nr, nc).uniform_(-7, 3, generator=g)
    return x * mag.repeat_interleave(br, 0)[: shape[0]].repeat_interleave(bc, 1)[:, : shape[1]]


def block_scales(x, block):
    """Each element's block scale absmax/448, computed independently of grpo_studio.engine.precision.fp8."""
    br, bc = block
    s = torch.empty_like(x)
    for i in range(0, x.shape[0], br):
        for j in range(0, x.shape[1], bc):
            s[i : i + br, j : j + bc] = x[i : i + br, j : j + bc].abs().max() / FP8_MAX
    return s


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", [WEIGHT_BLOCK, ACT_BLOCK])
def test_round_trip_error_within_e4m3_bound_at_every_block(shape, block):
    x = blocky(shape, block)
    y = quantize_dequantize(x, block)
    assert y.shape == x.shape and y.dtype == torch.float32
    s = block_scales(x, block)
    err = (y - x).abs()
    bound = torch.maximum(REL * x.abs(), SUB_ABS * s) * FP32_SLACK
    assert bool((err <= bound).all()), float((err / bound).max())
    # and it really is 3-bit rounding, not something finer: in a 128-wide sample of normal
    # values the worst relative error comes close to 2^-4
    normal = x.abs() >= s * FP8_MAX * 2.0**-6
    worst = float((err[normal] / x.abs()[normal]).max())
    assert worst > 0.8 * REL if normal.sum() > 1000 else worst <= REL * FP32_SLACK


def test_hand_computed_group():
    # one 1×4 group: absmax 4 → factor 448/4 = 112 → [448, 112, 33.6, −1.12]
    # e4m3 rounding: 448 and 112 (= 1.75·2^6) exact; 33.6 → 32 (spacing 4 in [32, 64));
    # −1.12 → −1.125 (spacing 1/8 in [1, 2)); dequantise by 4/448.
    x = torch.tensor([[4.0, 1.0, 0.3, -0.01]])
    q, s = quantize_blocks(x, (1, 4))
    assert q.float().tolist() == [[448.0, 112.0, 32.0, -1.125]]
    assert s.tolist() == [[pytest.approx(4 / 448)]]
    assert quantize_dequantize(x, (1, 4)).tolist() == [[4.0, 1.0, pytest.approx(32 / 112), pytest.approx(-1.125 / 112)]]


def test_exactly_representable_blocks_round_trip_exactly():
    # values on the e4m3 grid, each block's absmax pinned to 448·2^-3 → scale 2^-3 exactly
    g = torch.Generator().manual_seed(1)
    grid = (torch.randn(256, 384, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    grid[::128, ::128] = 448.0
    x = grid * 2.0**-3
    assert torch.equal(quantize_dequantize(x, WEIGHT_BLOCK), x)


def test_scales_shape_partial_blocks_and_zero_blocks():
    x = torch.randn(3, 5, 200)
    q, s = quantize_blocks(x, ACT_BLOCK)
    assert q.shape == (15, 200) and q.dtype == torch.float8_e4m3fn and s.shape == (15, 2)
    q, s = quantize_blocks(torch.randn(130, 200), WEIGHT_BLOCK)
    assert q.shape == (130, 200) and s.shape == (2, 2)
    z = torch.zeros(130, 200)
    z[:128, :128] = 1.0
    y = quantize_dequantize(z, WEIGHT_BLOCK)
    assert torch.equal(y, z)  # zero blocks stay zero (no 0/0)
    assert torch.equal(dequantize_blocks(*quantize_blocks(z, WEIGHT_BLOCK), WEIGHT_BLOCK), z)
    assert (
        quantize_dequantize(torch.randn(4, 7, dtype=torch.bfloat16), (1, 128), out_dtype=None).dtype == torch.bfloat16
    )


def test_activation_groups_are_per_token():
    # a token's quantisation does not depend on its neighbours: prefill of T tokens and the
    # rollout's one-token decode steps see the same fp8 activations.
    x = blocky((9, 300), ACT_BLOCK, seed=3)
    full = quantize_dequantize(x, ACT_BLOCK)
    rows = torch.cat([quantize_dequantize(x[i : i + 1], ACT_BLOCK) for i in range(9)])
    assert torch.equal(full, rows)


@pytest.mark.parametrize("shape", SHAPES)
def test_fp8_linear_error_bound_and_shapes(shape):
    N, K = shape
    g = torch.Generator().manual_seed(N * 1000 + K)
    w = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16)
    b = torch.randn(N, generator=g).to(torch.bfloat16)
    x = torch.randn(2, 3, K, generator=g).to(torch.bfloat16)
    y = fp8_linear_forward(x, w, b, backend="sim")
    assert y.shape == (2, 3, N) and y.dtype == torch.bfloat16
    exact = x.double() @ w.double().t() + b.double()
    # |x̂ŵ − xw| ≤ |x||w|·((1 + 2^-4)^2 − 1) (+ subnormal terms, + bf16 output rounding 2^-8)
    mag = x.double().abs() @ w.double().abs().t()
    bound = mag * ((1 + REL) ** 2 - 1) + 1e-3 * mag + 2.0**-8 * exact.abs() + 1e-6
    assert bool(((y.double() - exact).abs() <= bound).all())
    # and the fp8 path is not the bf16 path
    assert not torch.equal(y, nn.functional.linear(x, w, b))
    # leading dims fold into rows
    assert torch.equal(y.view(6, N), fp8_linear_forward(x.view(6, K), w, b, backend="sim"))


def test_autocast_does_not_change_the_fp8_gemm():
    # a full fine-tune runs the trainer under bf16 autocast; the simulated GEMM must stay fp32
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(256, 256, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(7, 256, generator=g).to(torch.bfloat16)
    plain = fp8_linear_forward(x, w, None, backend="sim")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = fp8_linear_forward(x, w, None, backend="sim")
    assert torch.equal(plain, auto)


def test_straight_through_gradients():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g, requires_grad=True)
    x = torch.randn(5, 256, generator=g, requires_grad=True)
    fp8_linear_forward(x, w, None, backend="sim").sum().backward()
    xq, wq = quantize_dequantize(x, ACT_BLOCK), quantize_dequantize(w, WEIGHT_BLOCK)
    # d/dx Σ x̂ŵᵀ = 1·ŵ, d/dw = 1ᵀ·x̂ (identity through the quantiser)
    torch.testing.assert_close(x.grad, torch.ones(5, 64) @ wq)
    torch.testing.assert_close(w.grad, torch.ones(64, 5) @ xq)


# ---------------------------------------------------------------- whole models


def tiny_qwen3(dtype=torch.bfloat16, intermediate=768):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=256,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).to(dtype).eval()


def token_logps(model, ids):
    with torch.no_grad():
        logits = model(ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0], logits


IDS = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("intermediate", [512, 768])
def test_apply_fp8_patches_every_linear_but_lm_head(intermediate):
    model = tiny_qwen3(intermediate=intermediate)
    n = apply_fp8(model)
    assert n == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert all(
        isinstance(m, Fp8Linear) for m in (model.model.layers[0].self_attn.q_proj, model.model.layers[1].mlp.down_proj)
    )
    assert type(model.lm_head) is nn.Linear
    before = model.state_dict()
    assert apply_fp8(model) == 0  # idempotent
    assert apply_fp8(model, enabled=False) == 14 and fp8_layers(model) == []
    assert model.state_dict().keys() == before.keys()


def test_unified_flow_gives_identical_logits_rollout_only_does_not():
    trainer = tiny_qwen3()
    rollout = copy.deepcopy(trainer)  # the rollout engine's copy of the same weights
    plain_logps, plain_logits = token_logps(trainer, IDS)

    apply_fp8(trainer)  # unified: both sides quantise with the same function
    apply_fp8(rollout)
    t_logps, t_logits = token_logps(trainer, IDS)
    r_logps, r_logits = token_logps(rollout, IDS)
    assert torch.equal(t_logits, r_logits)
    m = mismatch_metrics(r_logps, t_logps, torch.ones_like(t_logps, dtype=torch.bool))
    assert m["mismatch/k3"] == 0.0 and m["mismatch/abs_dlogp_max"] == 0.0

    apply_fp8(trainer, enabled=False)  # rollout_only: the trainer runs its bf16 master weights
    t_logps, t_logits = token_logps(trainer, IDS)
    assert torch.equal(t_logits, plain_logits)  # the patch is fully undone
    assert not torch.equal(t_logits, r_logits)
    m = mismatch_metrics(r_logps, t_logps, torch.ones_like(t_logps, dtype=torch.bool))
    assert m["mismatch/abs_dlogp_max"] > 0 and m["mismatch/k3"] > 0


def test_unified_flow_with_lora_and_training_gradients():
    from peft import LoraConfig, get_peft_model

    base = tiny_qwen3()
    apply_fp8(base)  # before peft: peft wraps the Fp8Linear base layers
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert isinstance(layer.base_layer, Fp8Linear) and type(layer.lora_A["default"]) is nn.Linear
    other = get_peft_model(tiny_qwen3(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    assert apply_fp8(other) == 14  # after peft: base layers only, adapters untouched
    assert sum("lora_" in n for n in fp8_layers(other)) == 0

    rollout = copy.deepcopy(model)
    model.train()
    out = model(IDS).logits.float()
    with torch.no_grad():
        ref = rollout.eval()(IDS).logits.float()
    assert torch.equal(out, ref)  # training forward == rollout forward
    out.logsumexp(-1).mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(float(g.abs().sum()) > 0 for n, p in model.named_parameters() if "lora_B" in n for g in [p.grad])


@pytest.mark.parametrize("M, N, K", [(37, 768, 256), (5, 256, 768), (128, 128, 512), (1, 256, 640)])
def test_scaled_mm_layouts_pass_torch_shape_checks(M, N, K):
    # The CUDA path cannot run here; torch's meta kernels run the same shape/stride checks
    # as the real op, so at least the scale layouts are verified on CPU.
    from grpo_studio.engine.precision.fp8 import scaled_mm_blockwise

    xq, xs = quantize_blocks(torch.randn(M, K), ACT_BLOCK)
    wq, ws = quantize_blocks(torch.randn(N, K), WEIGHT_BLOCK)
    y = scaled_mm_blockwise(*(t.to("meta") for t in (xq, xs, wq, ws)))
    assert y.shape == (M, N) and y.dtype == torch.float32


def test_torch_shape_checks_do_bite():
    # scale_b without the L4 padding (K/128 = 2 is not a multiple of 4) is rejected
    F = torch.nn.functional
    xq, xs = quantize_blocks(torch.randn(37, 256), ACT_BLOCK)
    wq, ws = quantize_blocks(torch.randn(768, 256), WEIGHT_BLOCK)
    meta = [t.to("meta") for t in (xq, xs.t().contiguous().t(), wq, ws)]
    with pytest.raises(RuntimeError, match="L4"):
        F.scaled_mm(
            meta[0],
            meta[2].t(),
            meta[1],
            F.ScalingType.BlockWise1x128,
            meta[3].t(),
            F.ScalingType.BlockWise128x128,
            output_dtype=torch.float32,
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_kernel_matches_simulation():
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) < (8, 9):
        pytest.skip("no FP8 tensor cores (compute capability < 8.9)")
    g = torch.Generator().manual_seed(0)
    for N, K in [(256, 256), (768, 256), (256, 768), (256, 512)]:
        w = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16).to(dev).requires_grad_()
        x = torch.randn(37, K, generator=g).to(torch.bfloat16).to(dev).requires_grad_()
        real = fp8_linear_forward(x, w, None, backend="cuda")
        sim = fp8_linear_forward(x, w, None, backend="sim")
        # same fp8 operands; only fp32 summation order differs, then the bf16 output rounding
        torch.testing.assert_close(real.float(), sim.float(), rtol=2.0**-7, atol=1e-3)
        real.float().sum().backward()
        assert torch.isfinite(w.grad).all() and torch.isfinite(x.grad).all()
    from grpo_studio.engine.precision import fp8 as F

    assert not F._CUDA_FP8_BROKEN  # the real kernel ran, no silent fallback to the simulation
