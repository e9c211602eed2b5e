"""The dtype table: every fact about each `model.dtype` / `rollout.dtype` value, in one place.

Pure python (no torch): engine/precision/numerics.py turns `torch` into a torch dtype with getattr(torch, name).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dtype:
    torch: str  # torch dtype of the stored weights, also vLLM's dtype= (fp8 keeps bf16 master weights)
    train_bytes: int  # bytes per trainer weight (fp8: the bf16 master weights, engine/precision/fp8.py)
    rollout_bytes: int  # bytes per rollout weight and KV element (fp8 quantises the rollout)
    mantissa_bits: int  # explicit mantissa bits: orders precisions in the mismatch warning
    loss_scaling: bool  # the trainer needs the dynamic loss scaler (fp16's 5 exponent bits underflow)
    quantised: bool  # its linears compute in FP8 GEMMs over bf16 master weights (engine/precision/fp8.py)
    autocast: bool  # a full fine-tune keeps fp32 master weights and computes under torch.autocast in this dtype
    less_mismatch: str | None  # the dtype of the same size whose rollout/train mismatch is lower (doctor's fix)
    ab_partner: str  # the dtype the studio's one-click precision A/B compares it against
    hint: str  # one line under the setup form's dtype select


DTYPES: dict[str, Dtype] = {
    "fp32": Dtype(
        "float32", 4, 4, 23, loss_scaling=False, quantised=False, autocast=False, less_mismatch=None,
        ab_partner="bf16", hint="least rollout/train mismatch; 2× bf16 memory",
    ),
    "bf16": Dtype(
        "bfloat16", 2, 2, 7, loss_scaling=False, quantised=False, autocast=True, less_mismatch="fp16",
        ab_partner="fp16", hint="7-bit mantissa: the largest mismatch (k3)",
    ),
    "fp16": Dtype(
        "float16", 2, 2, 10, loss_scaling=True, quantised=False, autocast=True, less_mismatch=None,
        ab_partner="bf16", hint="10-bit mantissa: ~8× less k3; loss scaling",
    ),
    "fp8": Dtype(
        "bfloat16", 2, 1, 3, loss_scaling=False, quantised=True, autocast=False, less_mismatch=None,
        ab_partner="bf16", hint="unified fp8 is stable; bf16+fp8 rollout drifts",
    ),
}  # fmt: skip
FP32 = "fp32"  # the full-precision name: a full fine-tune's master weights, the planner's 4-byte rows


def quantised(name: str) -> bool:
    """Whether `name` (a model.dtype or rollout.dtype value) computes its linears in FP8."""
    return DTYPES[name].quantised


def low_precision(name: str) -> bool:
    """Whether `name` computes below fp32 (bf16, fp16, fp8)."""
    return DTYPES[name].mantissa_bits < DTYPES[FP32].mantissa_bits


def is_float16(name: str) -> bool:
    """Whether `name` holds IEEE half-precision weights (fp16: 5 exponent bits)."""
    return DTYPES[name].torch == "float16"


def holds_fp8_masters(name: str) -> bool:
    """Whether a trainer in `name` holds the bf16 master weights an FP8 rollout quantises (bf16, fp8)."""
    return DTYPES[name].torch == DTYPES["fp8"].torch
