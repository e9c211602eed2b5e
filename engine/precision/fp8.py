"""FP8 (e4m3) linear layers with fine-grained scaling, shared by the rollout and the trainer.

Scaling follows DeepSeek-V3 (arXiv 2412.19437, §3.3) and DeepGEMM: activations are scaled per
1×128 group along the reduction dim K (one scale per token per 128 channels), weights per
128×128 block, each scale = absmax / 448 (the e4m3 max), accumulation in fp32. Jet-RL uses
"fine-grained" FP8 scaling for its unified flow; its abstract does not state block sizes, so
these are the DeepSeek-V3 ones.

Two FP8 flows (contract/precision_plan.resolve decides which sides call apply_fp8):
  unified       Jet-RL: rollout forward and training forward both go through fp8_linear_forward,
                so for the same weights and input they produce identical logits.
  rollout_only  BF16-train + FP8-rollout: only the rollout model is patched.

Backends:
  sim   (CPU, and any device without FP8 GEMMs): quantise → dequantise with torch.float8_e4m3fn,
        then an fp32 matmul. The fp8 values and scales are exactly those a real FP8 GEMM
        consumes; products of two e4m3 values are exact in fp32, so the result equals an FP8
        GEMM with fp32 accumulation up to fp32 summation order (and the fp32 rounding of
        q·scale).
  cuda  (compute capability ≥ 8.9): torch.nn.functional.scaled_mm with BlockWise1x128 ×
        BlockWise128x128 scales on the same quantised tensors (cuBLAS has it on sm90 only).
        UNVERIFIED: no GPU was available when this was written; the gpu-marked test in
        tests/test_fp8.py checks it against the simulation. If the kernel rejects a shape or
        the arch, the device falls back to sim for the rest of the process.
The backend is per device, so "unified" is bit-identical only when both sides run on the same
backend (same device type).

Gradients: straight-through. The training forward uses the quantised operands; the backward
multiplies the (unquantised) output gradient by the quantised operands, and the gradient lands
on the BF16 master weights. (Jet-RL also quantises backward GEMMs; we do not simulate that.)

LoRA: apply_fp8 patches peft's base layers (the frozen nn.Linear inside each LoRA layer) and
leaves the adapters' own lora_A/lora_B matmuls in the model dtype: they are rank-r, cost
nothing, and keeping them unquantised keeps small LoRA updates from vanishing below fp8's
resolution of the weight. lm_head stays in the model dtype too, as in DeepSeek-V3 (§3.3.1
keeps the embedding and output head in higher precision) and in vLLM's FP8 checkpoints.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
ACT_BLOCK = (1, 128)  # per token, per 128 input channels (DeepSeek-V3 §3.3.2)
WEIGHT_BLOCK = (128, 128)  # per 128 output × 128 input channels
AMAX_FLOOR = 1e-12  # all-zero block: any positive scale round-trips zeros exactly
DEFAULT_SKIP = ("lm_head",)
LORA_PARTS = {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"}


# --------------------------------------------------------------------------------------------
# The one quantisation function (both sides, both backends)


def quantize_blocks(x: Tensor, block: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Quantise to float8_e4m3fn with one scale per block of the trailing 2-D matrix.

    x [..., R, C] is viewed as a matrix [prod(...)·R, C] (leading dims fold into rows, so an
    activation [B, T, K] with block (1, 128) gets one scale per token per 128 channels).
    Partial blocks at the edges (R or C not divisible by the block) are padded with zeros,
    which never change a block's absmax. Math in fp32.

    Returns (q, scale): q float8_e4m3fn with x's 2-D shape [R', C], scale fp32
    [ceil(R'/br), ceil(C/bc)] with dequantised x = q · scale (block-broadcast).
    """
    br, bc = block
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    R, C = x2.shape
    nr, nc = -(-R // br), -(-C // bc)
    xf = x2.detach().float()
    if nr * br != R or nc * bc != C:
        xf = torch.nn.functional.pad(xf, (0, nc * bc - C, 0, nr * br - R))
    blocks = xf.view(nr, br, nc, bc)
    amax = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(min=AMAX_FLOOR)
    # DeepSeek-V3 / DeepGEMM: q = x · (448 / absmax), scale = absmax / 448.
    q = (blocks * (FP8_MAX / amax)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    q = q.view(nr * br, nc * bc)[:R, :C]
    return q, (amax / FP8_MAX).view(nr, nc)


def dequantize_blocks(q: Tensor, scale: Tensor, block: tuple[int, int]) -> Tensor:
    """fp32 q · scale with each scale broadcast over its block (inverse of quantize_blocks)."""
    br, bc = block
    R, C = q.shape
    s = scale.repeat_interleave(br, dim=0)[:R].repeat_interleave(bc, dim=1)[:, :C]
    return q.float() * s


def quantize_dequantize(x: Tensor, block: tuple[int, int], *, out_dtype: torch.dtype | None = torch.float32) -> Tensor:
    """Simulated FP8 round trip of x with per-block absmax scaling; x's shape, fp32 by default.

    The result is fp32 because q·scale (4 significant bits times an fp32 scale) is generally not
    representable in bf16; pass out_dtype=None to get x.dtype back. No gradient flows (use
    fp8_linear_forward for the straight-through training path).
    """
    q, scale = quantize_blocks(x, block)
    y = dequantize_blocks(q, scale, block).view(x.shape)
    return y.to(out_dtype or x.dtype)


class _QuantSTE(torch.autograd.Function):
    """Forward: quantise→dequantise (fp32). Backward: identity (straight-through)."""

    @staticmethod
    def forward(ctx, x, block):
        ctx.in_dtype = x.dtype
        return quantize_dequantize(x, block)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.in_dtype), None


# --------------------------------------------------------------------------------------------
# FP8 linear


_CUDA_FP8_BROKEN: set[str] = set()  # devices where the real kernel raised once: use sim from then on


def cuda_fp8_supported(device: torch.device) -> bool:
    """Real FP8 GEMMs: a CUDA device with compute capability ≥ 8.9 (Ada, Hopper, Blackwell)."""
    if device.type != "cuda" or not torch.cuda.is_available() or str(device) in _CUDA_FP8_BROKEN:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def fp8_linear_forward(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, backend: str | None = None) -> Tensor:
    """y = x Wᵀ + b with x quantised per 1×128 group along K and W per 128×128 block.

    x [..., K], weight [N, K] → y [..., N] in x.dtype. backend None picks "cuda" on devices with
    FP8 support, else "sim". Differentiable (straight-through) in both backends.
    """
    lead, K = x.shape[:-1], x.shape[-1]
    if backend is None:
        backend = "cuda" if cuda_fp8_supported(x.device) else "sim"
    if backend == "cuda" and (K % 128 or weight.shape[0] % 128):
        backend = "sim"  # the blockwise kernel needs whole blocks; same choice on both sides
    x2 = x.reshape(-1, K)
    if backend == "cuda":
        try:
            y = _Fp8MatmulCuda.apply(x2, weight)
        except (RuntimeError, NotImplementedError, ValueError, TypeError):
            # no kernel for this shape/arch/build: remember the device, then simulate
            _CUDA_FP8_BROKEN.add(str(x.device))
            return fp8_linear_forward(x, weight, bias, backend="sim")
    else:
        # fp32 "accumulation" of exactly-representable fp8 products (see the module docstring);
        # autocast off, or a bf16 autocast region would round the dequantised operands to bf16
        # and the trainer's GEMM would no longer match the rollout's.
        with torch.autocast(device_type=x.device.type, enabled=False):
            y = _QuantSTE.apply(x2, ACT_BLOCK) @ _QuantSTE.apply(weight, WEIGHT_BLOCK).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).view(*lead, weight.shape[0])


def scaled_mm_blockwise(xq: Tensor, xs: Tensor, wq: Tensor, ws: Tensor) -> Tensor:
    """fp32 [M, N] = (xq·xs) @ (wq·ws)ᵀ on FP8 tensor cores via torch.nn.functional.scaled_mm.

    Layouts torch 2.13 asks for (BlockWise1x128 × BlockWise128x128, the DeepSeek-V3 recipe;
    cuBLAS implements it on sm90 with CUDA ≥ 12.9, elsewhere it raises and we simulate):
      mat_b column-major: wq.t() of the row-major [N, K] weight;
      scale_a [M, K/128] M-major (stride [1, M]);
      scale_b [L4, N/128] with L4 = K/128 rounded up to 4 (zero-padded), stride [1, L4].
    K and N must be multiples of 128. The same layouts pass torch's meta checks on CPU
    (tests/test_fp8.py::test_scaled_mm_layouts_pass_torch_shape_checks).
    """
    F = torch.nn.functional
    M, K = xq.shape
    N = wq.shape[0]
    if K % 128 or N % 128 or not hasattr(F, "scaled_mm"):
        raise NotImplementedError("blockwise fp8 scaled_mm needs K, N divisible by 128 and torch >= 2.9")
    kb = K // 128
    l4 = -(-kb // 4) * 4
    scale_a = torch.empty_strided((M, kb), (1, M), dtype=xs.dtype, device=xs.device).copy_(xs)
    scale_b = F.pad(ws, (0, l4 - kb)).t()  # [Nb, L4] row-major → [L4, Nb] with stride [1, L4]
    return F.scaled_mm(
        xq,
        wq.t(),
        scale_a,
        F.ScalingType.BlockWise1x128,
        scale_b,
        F.ScalingType.BlockWise128x128,
        output_dtype=torch.float32,
    )


class _Fp8MatmulCuda(torch.autograd.Function):
    """x2 [M, K] @ weight [N, K]ᵀ on FP8 tensor cores. UNVERIFIED: written without a GPU;
    tests/test_fp8.py::test_cuda_kernel_matches_simulation checks it on a CUDA machine."""

    @staticmethod
    def forward(ctx, x2, weight):
        xq, xs = quantize_blocks(x2, ACT_BLOCK)  # [M, K], [M, ceil(K/128)]
        wq, ws = quantize_blocks(weight, WEIGHT_BLOCK)  # [N, K], [ceil(N/128), ceil(K/128)]
        y = scaled_mm_blockwise(xq, xs, wq, ws)
        ctx.save_for_backward(xq, xs, wq, ws)
        ctx.dtypes = (x2.dtype, weight.dtype)
        return y

    @staticmethod
    def backward(ctx, g):  # straight-through, like the simulation
        xq, xs, wq, ws = ctx.saved_tensors
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = (g @ dequantize_blocks(wq, ws, WEIGHT_BLOCK)).to(ctx.dtypes[0])
        if ctx.needs_input_grad[1]:
            gw = (g.t() @ dequantize_blocks(xq, xs, ACT_BLOCK)).to(ctx.dtypes[1])
        return gx, gw


class Fp8Linear(nn.Linear):
    """nn.Linear whose forward runs fp8_linear_forward. Same parameters and state_dict keys, so
    apply_fp8 swaps the class in place and checkpoints, peft and deepcopy are unaffected."""

    fp8_backend: str | None = None  # None: automatic per device

    def forward(self, x: Tensor) -> Tensor:
        return fp8_linear_forward(x, self.weight, self.bias, backend=self.fp8_backend)


def apply_fp8(model: nn.Module, *, enabled: bool = True, skip: tuple[str, ...] = DEFAULT_SKIP) -> int:
    """Route every linear GEMM of a transformers (optionally peft-wrapped) model through FP8.

    Swaps the class of each plain nn.Linear to Fp8Linear (enabled=False swaps them back).
    Skipped: modules whose last name part is in `skip` (lm_head by default), LoRA adapter
    matrices (lora_A/lora_B, see the module docstring), and nn.Linear subclasses we do not know
    (e.g. bitsandbytes 4-bit layers). Works before or after peft.get_peft_model: peft wraps an
    Fp8Linear base layer like any nn.Linear. Returns the number of layers switched.
    """
    src, dst = (nn.Linear, Fp8Linear) if enabled else (Fp8Linear, nn.Linear)
    n = 0
    for name, module in model.named_modules():
        parts = name.split(".")
        if type(module) is not src or parts[-1] in skip or LORA_PARTS.intersection(parts):
            continue
        module.__class__ = dst
        n += 1
    return n


def fp8_layers(model: nn.Module) -> list[str]:
    """Names of the modules currently running the FP8 path."""
    return [name for name, m in model.named_modules() if isinstance(m, Fp8Linear)]
