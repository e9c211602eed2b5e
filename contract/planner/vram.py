"""The VRAM planner: estimate(card, config) -> rows of GiB, each with the formula that produced it.

Pure python: imported by the studio, which never imports torch. A plan's parts (Row, Device, Breakdown, the
constants) are in contract/planner/breakdown.py, one training rank's formulas in train_memory.py; both are
re-exported here.

Two modes (formulas and sources in docs/vram.md):
  documented  Unsloth's GRPO memory arithmetic (unsloth.ai/blog/grpo, "Long-context GRPO"), as published
              (contract/planner/documented.py).
  accurate    from the architecture, following what this engine does (engine/model/policy_loader.py, logprobs.py,
              trainer.py); checked against real training steps by `grpo-studio bench vram-accuracy`.

Accurate mode plans every device of the run (contract/planner/devices.py): `world_size` training ranks
(train.parallel ddp or fsdp) and, with rollout.colocate = false, the rollout server's device(s).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .. import backend
from ..config import AUTO, Config
from ..errors import UserError
from ..model_card import Card
from .breakdown import (  # noqa: F401 - a plan's parts, re-exported
    ALLOCATOR_MARGIN,
    BYTES,
    CUDA_CONTEXT_GIB,
    GIB,
    LOGPROB_CHUNK_ROWS,
    NF4_BLOCK,
    NF4_NESTED_BLOCK,
    PHASES,
    ROLLOUT_BYTES,
    VLLM_HEADROOM,
    VLLM_OVERHEAD_GIB,
    Breakdown,
    Device,
    Row,
    _g,
    _n,
    phase_peak,
)
from .reward_models import reward_model_rows
from .train_memory import (  # noqa: F401 - one rank's formulas, re-exported
    activation_bytes,
    logits_bytes,
    nf4_model_bytes,
    per_layer_token_bytes,
    rank_prompts,
    reference_bytes,
    train_rows,
    train_state_bytes,
    weight_bytes,
)

MODES = ("documented", "accurate")
VARIANTS = ("efficient", "standard")
SOLVE_KEYS = ("max_completion_len", "num_generations", "lora_rank", "context")


def kv_cache_bytes(card: Card, cfg: Config, sequences: int) -> tuple[float, str]:
    r = cfg.rollout
    T, b = r.max_prompt_len + r.max_completion_len, ROLLOUT_BYTES[cfg.rollout_dtype]
    if card.sliding_window and card.sliding_pattern:
        glob = card.layers // card.sliding_pattern
        layer_tokens = glob * T + (card.layers - glob) * min(T, card.sliding_window)
        lt = f"({glob} global · {T} + {card.layers - glob} sliding · {min(T, card.sliding_window)}) tok"
    else:
        layer_tokens, lt = card.layers * T, f"{card.layers} layers · {T} tok"
    return (
        2 * b * layer_tokens * card.kv_dim * sequences,
        f"2 (K,V) · {b} B · {lt} · {card.kv_dim} kv dim · {sequences} seqs",
    )


def accurate(
    card: Card, cfg: Config, gpu_gib: float | None = None, device: str = "cuda", world_size: int = 1
) -> tuple[list[Row], str, bool]:
    """The rows of one training device (rank), the phase-peak rule in words, and whether the rollout's memory
    stays live during training (phase_peak sums the two phases, else takes the larger). Rows with
    in_total=False are shown but not summed into the device's total. Each of `world_size` ranks trains on
    its share of the prompts; train.parallel = fsdp shards weights and trainable state among them. With
    rollout.colocate = false the rollout's rows are the rollout device's (contract/planner/devices.py)."""
    r = cfg.rollout
    shards = world_size if cfg.train.parallel == "fsdp" else 1
    rows: list[Row] = []
    w, wf = weight_bytes(card, cfg)
    if shards > 1:
        wf += f" ÷ {shards} (FSDP2 fully_shard: each rank holds 1/{shards} of every parameter)"
    rows.append(Row("base weights", _g(w / shards), wf, "persistent"))
    name, s, sf = train_state_bytes(card, cfg, shards)
    rows.append(Row(name, _g(s), sf, "persistent"))
    act, af, host = activation_bytes(card, cfg, device, world_size)
    rows.append(Row("activations", _g(act), af, "train"))
    lg, lf = logits_bytes(card, cfg, world_size)
    rows.append(Row("logits + log-softmax", _g(lg), lf, "train"))
    if cfg.algo.beta > 0:
        ref, rf = reference_bytes(card, cfg, world_size)
        rows.append(Row("reference log-probs", _g(ref), rf, "train"))
    rows += [
        Row(name, _g(nbytes), formula, "persistent") for name, nbytes, formula in reward_model_rows(cfg.rewards.funcs)
    ]
    vllm = backend.resolve(r.backend, load_in_4bit=cfg.model.load_in_4bit)[0] == "vllm"
    if not vllm:
        seqs = rank_prompts(cfg, world_size) * cfg.train.steps_per_generation * r.num_generations  # one rollout
        kv, kvf = kv_cache_bytes(card, cfg, seqs)
        rows.append(Row("sampler weights copy (hf)", *_hf_copy_bytes(card, cfg), "persistent"))
        rows.append(Row("rollout KV cache (hf generate)", _g(kv), kvf, "rollout"))
        rule = (
            "weights + sampler copy + train state + max(rollout KV, train activations + logits): "
            "hf generate frees its cache"
        )
        overlap = False
    elif not r.colocate:
        rule, overlap = "weights + train state + activations + logits; vLLM is on the rollout device", False
    else:
        rows.append(vllm_row(card, cfg, gpu_gib))
        rule, overlap = _vllm_rule(r.sleep)
    if device == "cuda":
        rows.append(Row("CUDA context", CUDA_CONTEXT_GIB, "CUDA context + cuBLAS workspace (typical)", "overhead"))
    if host:
        rows.append(
            Row(
                "host RAM: offloaded checkpoints",
                _g(host),
                "checkpointed layer inputs kept in pinned host RAM (not GPU)",
                "train",
                False,
            )
        )
    return rows, rule, overlap


def vllm_need(card: Card, cfg: Config) -> tuple[float, str]:
    """Bytes vLLM needs for one rollout: the weights in rollout.dtype and the KV cache of all its sequences
    (prompts_per_step × steps_per_generation × G: the engine sizes every vLLM for the whole rollout)."""
    r, rb, P = cfg.rollout, ROLLOUT_BYTES[cfg.rollout_dtype], card.total_params()
    kv, kvf = kv_cache_bytes(card, cfg, cfg.train.prompts_per_step * cfg.train.steps_per_generation * r.num_generations)
    return P * rb + kv, f"weights {_n(P)} · {rb} B + KV cache ({kvf})"


def vllm_row(card: Card, cfg: Config, gpu_gib: float | None) -> Row:
    """vLLM's memory on the device it runs on: gpu_memory_utilization × the device's size, or without a
    size the need itself."""
    need, need_f = vllm_need(card, cfg)
    if not gpu_gib:
        return Row(
            "vLLM reservation",
            _g(need),
            need_f + " (no GPU size: the need, not gpu_memory_utilization × total)",
            "rollout",
        )
    share = vllm_share(card, cfg, gpu_gib)
    shown = f"{share:g}" if cfg.rollout.gpu_memory_utilization != AUTO else f"auto = {share:g}"
    return Row(
        "vLLM reservation",
        share * gpu_gib,
        f"gpu_memory_utilization {shown} × {gpu_gib:g} GiB (holds {_g(need):.2f} GiB of weights + KV: {need_f})",
        "rollout",
    )


def vllm_share(card: Card, cfg: Config, total_gib: float) -> float:
    """rollout.gpu_memory_utilization as vLLM receives it: the key's value, or for `auto` the share of
    `total_gib` that holds vllm_need (the rollout's weights and KV cache), with VLLM_HEADROOM and
    VLLM_OVERHEAD_GIB, rounded up to 0.01 and capped at 0.95."""
    if cfg.rollout.gpu_memory_utilization != AUTO:
        return cfg.rollout.gpu_memory_utilization
    need = _g(vllm_need(card, cfg)[0])
    return min(0.95, math.ceil((need * VLLM_HEADROOM + VLLM_OVERHEAD_GIB) / total_gib * 100) / 100)


def _hf_copy_bytes(card: Card, cfg: Config) -> tuple[float, str]:
    """The hf backend's own copy of the policy (engine/sampler/hf.py), in rollout.dtype."""
    where = "the hf backend samples from its own copy in rollout.dtype, synced after each step (engine/sampler/hf.py)"
    if cfg.model.load_in_4bit:
        base, text = nf4_model_bytes(card, cfg, cfg.rollout_dtype)
        n = card.lora_params(cfg.model.lora_rank, cfg.model.lora_target_modules)
        return _g(base + 4 * n), f"{text} + {_n(n)} LoRA params · 4 B (unmerged adapters): {where}"
    rb, P = ROLLOUT_BYTES[cfg.rollout_dtype], card.total_params()
    return _g(P * rb), f"{_n(P)} params · {rb} B: {where}"


def _vllm_rule(sleep: bool) -> tuple[str, bool]:
    if sleep:
        return "weights + train state + max(vLLM, activations + logits): vLLM sleeps during training", False
    return "weights + train state + vLLM + activations + logits: vLLM keeps its memory during training", True


# ---- entry points ------------------------------------------------------------------------


def estimate(
    card: Card,
    cfg: Config,
    mode: str = "accurate",
    gpu_gib: float | None = None,
    variant: str = "efficient",
    device: str = "cuda",
    doc_training: Row | None = None,
    world_size: int = 1,
) -> Breakdown:
    """The plan of every device (Breakdown.devices); `gpu_gib` is the size of each device (all alike)."""
    from . import devices, documented, micro_batch  # all build on this module's rows

    if mode not in MODES:
        raise UserError(kind="vram", key="--mode", value=mode, allowed=MODES)
    if variant not in VARIANTS:
        raise UserError(kind="vram", key="--variant", value=variant, allowed=VARIANTS)
    cfg = micro_batch.for_plan(cfg, device, world_size)  # micro_batch_size = auto: its rows here
    out = Breakdown(mode=mode, model=card.name, gpu_gib=gpu_gib)
    out.params, out.active_params, out.params_line = (
        card.total_params(),
        card.active_params_per_token(),
        card.params_line() if card.num_experts else "",  # shown beside an MoE's plan
    )
    if mode == "documented":
        if world_size > 1:
            raise UserError(
                f"is Unsloth's one-GPU arithmetic; plans for {world_size} devices need --mode accurate",
                kind="vram",
                key="--mode",
                value=mode,
            )
        rows = documented.documented(card, cfg, variant, doc_training)
        out.devices = [Device("train", "train", rows, sum(r.gib for r in rows))]
        out.peak_rule = f"sum of the doc's rows ({variant} column)"
    else:
        out.devices, out.peak_rule = devices.plan(card, cfg, gpu_gib, device, world_size)
    for dev in out.devices:
        dev.fits = dev.fits if dev.fits is not None or not gpu_gib else dev.total_gib <= gpu_gib
    out.rows = out.devices[0].rows
    out.total_gib = max(d.total_gib for d in out.devices)
    if gpu_gib:
        out.fits = all(d.fits for d in out.devices)
    return out


# ---- inverse solving ---------------------------------------------------------------------


@dataclass
class Solution:
    """What solve() found for `key`, by status:
    fits            `value` is the largest that fits (`total_gib`); `value + step` needs `next_total_gib`;
                    `limiting_row` is the row that grew most
    never_fits      even the smallest `value` needs `total_gib`; `limiting_row` is the largest row
    never_outgrows  the cap `value` still fits (`total_gib`): the key barely changes the total"""

    key: str
    status: Literal["fits", "never_fits", "never_outgrows"]
    value: int
    step: int
    total_gib: float
    next_total_gib: float | None
    limiting_row: str


def _with(cfg: Config, key: str, value: int) -> Config:
    import copy

    new = copy.deepcopy(cfg)
    r = new.rollout
    if key == "context":  # keep the prompt:completion split
        prompt = max(1, value * r.max_prompt_len // (r.max_prompt_len + r.max_completion_len))
        r.max_prompt_len, r.max_completion_len = prompt, max(1, value - prompt)
    elif key == "lora_rank":
        new.model.lora_rank = value
    else:
        setattr(r, key, value)
    return new


def solve(
    card: Card,
    cfg: Config,
    key: str,
    gpu_gib: float,
    mode: str = "accurate",
    variant: str = "efficient",
    device: str = "cuda",
    world_size: int = 1,
    need: Callable[[Breakdown], float] | None = None,
) -> Solution:
    """The largest value of `key` whose estimate fits `gpu_gib` (binary search; totals are monotone), or
    why there is none (Solution.status). What must fit is `need` of the estimate: by default its total (the
    largest device's; the pre-flight check passes the devices that share one memory); rows named are the
    largest device's."""
    need = need or (lambda b: b.total_gib)
    if key not in SOLVE_KEYS:
        raise UserError(kind="vram", key="--solve", value=key, allowed=SOLVE_KEYS)
    if key == "lora_rank" and cfg.model.lora_rank == 0:
        raise UserError("--solve lora_rank with model.lora_rank = 0 (full fine-tune): set a rank > 0", kind="vram")
    pin = estimate(card, cfg, mode, gpu_gib, variant, device).rows[0] if mode == "documented" else None

    def est(c: Config) -> Breakdown:
        return estimate(card, c, mode, gpu_gib, variant, device, pin, world_size)

    lo_value = {"num_generations": 2, "context": 2}.get(key, 1)
    cap = {"lora_rank": 4096, "num_generations": 65536}.get(key, 1_000_000)

    def total(v: int) -> float:
        return need(est(_with(cfg, key, v)))

    low = est(_with(cfg, key, lo_value))
    if need(low) > gpu_gib:
        big = max(low.largest().rows, key=lambda r: r.gib if r.in_total else -1)
        return Solution(key, "never_fits", lo_value, 0, need(low), None, big.name)
    top = total(cap)
    if top <= gpu_gib:
        return Solution(key, "never_outgrows", cap, 0, top, None, "")
    lo, hi = lo_value, cap  # total(lo) fits, total(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(mid) <= gpu_gib else (lo, mid)
    at, nxt = est(_with(cfg, key, lo)), est(_with(cfg, key, hi))
    growth = {r.name: r.gib for r in nxt.largest().rows}
    base = {r.name: r.gib for r in low.largest().rows}
    limiting = max(growth, key=lambda n: growth[n] - base.get(n, 0.0))
    return Solution(key, "fits", lo, hi - lo, need(at), need(nxt), limiting)
