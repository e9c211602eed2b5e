"""The dtype table: every fact about each `model.dtype` / `rollout.dtype` value, in one place.

Pure python (no torch): engine/precision.py turns `torch` into a torch dtype with getattr(torch, name).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dtype:
    torch: str  # torch dtype of the stored weights, also vLLM's dtype= (fp8 keeps bf16 master weights)
    train_bytes: int  # bytes per trainer weight (fp8: the bf16 master weights, engine/fp8.py)
    rollout_bytes: int  # bytes per rollout weight and KV element (fp8 quantises the rollout)
    mantissa_bits: int  # explicit mantissa bits: orders precisions in the mismatch warning
    loss_scaling: bool  # the trainer needs the dynamic loss scaler (fp16's 5 exponent bits underflow)
    ab_partner: str  # the dtype the studio's one-click precision A/B compares it against
    hint: str  # one line under the setup form's dtype select


DTYPES: dict[str, Dtype] = {
    "fp32": Dtype("float32", 4, 4, 23, False, "bf16", "least rollout/train mismatch; 2× bf16 memory"),
    "bf16": Dtype("bfloat16", 2, 2, 7, False, "fp16", "7-bit mantissa: the largest mismatch (k3)"),
    "fp16": Dtype("float16", 2, 2, 10, True, "bf16", "10-bit mantissa: ~8× less k3; loss scaling"),
    "fp8": Dtype("bfloat16", 2, 1, 3, False, "bf16", "unified fp8 is stable; bf16+fp8 rollout drifts"),
}
