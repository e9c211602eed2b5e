"""The torch side of precision: torch dtypes, the FP16 dynamic loss scaler, gradient clipping.

The decision itself (FP8 flow, effective precisions, loss scaler on/off, the mismatch warning)
is contract/precision_plan.resolve; the dtype facts are contract/dtypes.DTYPES.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from ...contract.dtypes import DTYPES


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype the weights of config dtype `name` are stored in (fp8: bf16 master weights)."""
    return getattr(torch, DTYPES[name].torch)


# --------------------------------------------------------------------------------------------
# FP16 dynamic loss scaling


class LossScaler:
    """Dynamic loss scaling for FP16 training, with torch.amp.GradScaler's semantics but explicit.

    Why not wrap torch.amp.GradScaler: in torch 2.13 GradScaler("cpu") exists, but its unscale_
    raises "ValueError: Attempting to unscale FP16 gradients" - it is built for autocast with
    fp32 master params, while model.dtype = fp16 here holds fp16 params (full fine-tune) and
    fp16 grads. This class unscales grads of any dtype in place and is testable on CPU.

    One step:
        scaler.scale(loss).backward()
        ok = scaler.unscale_and_check(params)     # grads /= scale in place; False on inf/NaN
        if ok: norm = clip_grad_norm(params, max_norm); optimizer.step()   # clip AFTER unscale
        scaler.update(not ok)                     # skip + shrink on overflow, grow when stable
    or simply `stepped, norm = scaler.step(optimizer, params, max_norm)`.

    update(found_inf): overflow → scale *= backoff_factor (not below min_scale), skipped_steps
    += 1, growth counter reset; otherwise after growth_interval consecutive finite steps
    scale *= growth_factor. With enabled=False (bf16/fp32) the scale stays 1.0 and
    unscale_and_check only checks finiteness, so NaN steps are still skipped and counted.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        *,
        enabled: bool = True,
        min_scale: float = 1.0,
    ):
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor = {growth_factor}: must be > 1")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor = {backoff_factor}: must be in (0, 1)")
        if growth_interval < 1:
            raise ValueError(f"growth_interval = {growth_interval}: must be >= 1")
        self.enabled = enabled
        self.init_scale = float(init_scale) if enabled else 1.0
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale) if enabled else 1.0
        self._scale = self.init_scale
        self._growth_tracker = 0  # consecutive finite steps since the last change
        self.skipped_steps = 0

    @classmethod
    def from_config(cls, cfg, plan) -> LossScaler:
        """cfg.precision's knobs; enabled as the PrecisionPlan says (fp16; bf16 needs no scaler)."""
        p = cfg.precision
        return cls(
            p.loss_scale_init,
            p.loss_scale_growth,
            p.loss_scale_backoff,
            p.loss_scale_growth_interval,
            enabled=plan.loss_scaling,
        )

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        # 2510.26788 §3: multiply the loss so small fp16 gradients do not flush to zero.
        return loss * self._scale if self.enabled else loss

    def unscale_and_check(
        self, params: Iterable[torch.nn.Parameter], shard_sum: Callable[[float], float] = float
    ) -> bool:
        """Divide every .grad by the scale in place; True when all grads are finite.

        On False the grads are garbage: skip the optimizer step and zero them. The scale is a
        power of two by default, so unscaling is exact except where fp16 grads underflow.
        `shard_sum` sums over the ranks when each holds a shard of the gradients (FSDP): one
        rank's inf then skips the step on all.
        """
        grads = [_local(p.grad) for p in params if p.grad is not None]
        finite = shard_sum(float(not all(bool(torch.isfinite(g).all()) for g in grads))) == 0
        if finite and self.enabled and self._scale != 1.0:
            inv = 1.0 / self._scale
            for g in grads:
                g.mul_(inv)
        return finite

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.skipped_steps += 1
            self._growth_tracker = 0
            if self.enabled:
                self._scale = max(self._scale * self.backoff_factor, self.min_scale)
            return
        if not self.enabled:
            return
        self._growth_tracker += 1
        if self._growth_tracker >= self.growth_interval:
            self._scale *= self.growth_factor
            self._growth_tracker = 0

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        params: Iterable[torch.nn.Parameter],
        max_norm: float | None = None,
        shard_sum: Callable[[float], float] = float,
    ) -> tuple[bool, float]:
        """unscale → check → clip → optimizer.step() → update. Returns (stepped, grad_norm).

        grad_norm is the unscaled pre-clip norm, or inf on a skipped step. On a skipped step the
        grads are zeroed and the optimizer is not stepped.
        """
        params = [p for p in params if p.grad is not None]
        ok = self.unscale_and_check(params, shard_sum)
        if ok:
            norm = clip_grad_norm(params, max_norm, shard_sum)
            optimizer.step()
        else:
            norm = math.inf
            for p in params:
                p.grad = None
        self.update(not ok)
        return ok, norm

    def metrics(self) -> dict[str, float]:
        return {"precision/loss_scale": self._scale, "precision/skipped_steps": float(self.skipped_steps)}

    def state_dict(self) -> dict:
        return {
            "scale": self._scale,
            "growth_tracker": self._growth_tracker,
            "skipped_steps": self.skipped_steps,
            "init_scale": self.init_scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "min_scale": self.min_scale,
            "enabled": self.enabled,
        }

    def load_state_dict(self, state: dict) -> None:
        self._scale = float(state["scale"])
        self._growth_tracker = int(state["growth_tracker"])
        self.skipped_steps = int(state["skipped_steps"])
        for k in ("init_scale", "growth_factor", "backoff_factor", "min_scale"):
            if k in state:
                setattr(self, k, float(state[k]))
        if "growth_interval" in state:
            self.growth_interval = int(state["growth_interval"])
        if "enabled" in state:
            self.enabled = bool(state["enabled"])


def clip_grad_norm(
    params: Iterable[torch.nn.Parameter], max_norm: float | None, shard_sum: Callable[[float], float] = float
) -> float:
    """Global L2 grad norm computed in fp32 (an fp16 norm overflows past 65504); scales grads down
    in place to max_norm when it is exceeded (max_norm None or <= 0: measure only). Returns the
    pre-clip norm, like torch.nn.utils.clip_grad_norm_. Sharded grads (FSDP DTensors): each rank
    squares its shard and `shard_sum` adds the ranks' parts."""
    grads = [_local(p.grad) for p in params if p.grad is not None]
    total = math.sqrt(max(shard_sum(sum(float(g.detach().float().pow(2).sum()) for g in grads)), 0.0))
    if not total:
        return 0.0
    if max_norm and max_norm > 0 and math.isfinite(total) and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for g in grads:
            g.mul_(coef)
    return total


def _local(grad: torch.Tensor) -> torch.Tensor:
    """This rank's part of a gradient: an FSDP DTensor's local shard (its in-place ops change the DTensor)."""
    return grad.to_local() if hasattr(grad, "to_local") else grad
