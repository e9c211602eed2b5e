"""The VRAM planner: estimate(card, config) -> rows of GiB, each with the formula that produced it.

Pure python: imported by the studio, which never imports torch.

Two modes (formulas and sources in docs/vram.md):
  documented  Unsloth's GRPO memory arithmetic (unsloth.ai/blog/grpo, "Long-context GRPO"), as published
              (contract/planner/documented.py).
  accurate    from the architecture, following what this engine does (engine/policy_loader.py, logprobs.py,
              trainer.py); checked against real training steps by `grpo-studio bench vram-accuracy`.

Accurate mode plans every device of the run (contract/planner/devices.py): `world_size` training ranks
(train.parallel ddp or fsdp) and, with rollout.colocate = false, the rollout server's device(s).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Literal

from grpo_studio.contract import backend
from grpo_studio.contract.config import AUTO, Config
from grpo_studio.contract.dtypes import DTYPES
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.model_card import Card
from grpo_studio.contract.planner.reward_models import reward_model_rows

GIB = 2 ** 30
MODES = ("documented", "accurate")
VARIANTS = ("efficient", "standard")
SOLVE_KEYS = ("max_completion_len", "num_generations", "lora_rank", "context")
# When a row's memory is live: the whole run, while sampling, during the forward/backward, after the backward
# (the ddp gradient all-reduce: activations are freed by then), or not tensor memory at all (CUDA context,
# allocator margin). The accurate total is picked by phase (phase_peak).
PHASES = ("persistent", "rollout", "train", "reduce", "overhead")
BYTES = {name: d.train_bytes for name, d in DTYPES.items()}            # trainer storage per weight
ROLLOUT_BYTES = {name: d.rollout_bytes for name, d in DTYPES.items()}  # rollout weight / KV element
NF4_BLOCK = 64          # bitsandbytes 4-bit: one absmax scale per 64 weights
NF4_NESTED_BLOCK = 256  # double quantisation: the absmax scales in uint8, one fp32 scale per 256 of them
LOGPROB_CHUNK_ROWS = 8  # engine/logprobs.py token_logprobs(chunk_rows=8)
CUDA_CONTEXT_GIB = 0.5  # CUDA context + cuBLAS workspace, typical for torch on recent GPUs
ALLOCATOR_MARGIN = 0.05  # caching-allocator fragmentation, share of the tensor total
VLLM_HEADROOM = 1.2     # rollout.gpu_memory_utilization = auto: the need for one rollout, plus 20% ...
VLLM_OVERHEAD_GIB = 1.0  # ... plus vLLM's own non-KV memory (profiling activations, sampler buffers, graphs)


@dataclass
class Row:
    name: str
    gib: float
    formula: str
    phase: str            # one of PHASES
    in_total: bool = True


@dataclass
class Device:
    """One device of the run: a training rank (kind "train") or a rollout server's (kind "rollout"), its
    rows and its total; `fits` is None without a device size."""
    name: str
    kind: Literal["train", "rollout"]
    rows: list[Row] = field(default_factory=list)
    total_gib: float = 0.0
    fits: bool | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "rows": [asdict(r) for r in self.rows],
                "total_gib": round(self.total_gib, 4), "fits": self.fits}


@dataclass
class Breakdown:
    """`devices`: every device of the run; `rows` are the first training device's (all training ranks hold
    the same rows); `total_gib` is the largest device's total and `fits` whether every device fits, so a
    caller that reads one total and one verdict stays right with more than one device."""
    mode: str
    model: str
    rows: list[Row] = field(default_factory=list)
    total_gib: float = 0.0
    gpu_gib: float | None = None
    fits: bool | None = None
    peak_rule: str = ""
    devices: list[Device] = field(default_factory=list)

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)

    def device(self, name: str) -> Device:
        return next(d for d in self.devices if d.name == name)

    def largest(self) -> Device:
        return max(self.devices, key=lambda d: d.total_gib)

    def to_json(self) -> dict:
        return {"mode": self.mode, "model": self.model,
                "rows": [{k: v for k, v in asdict(r).items()} for r in self.rows],
                "total_gib": round(self.total_gib, 4), "gpu_gib": self.gpu_gib, "fits": self.fits,
                "peak_rule": self.peak_rule, "devices": [d.to_json() for d in self.devices]}


def _g(nbytes: float) -> float:
    return nbytes / GIB


def _n(x: float) -> str:
    """A compact number for formula text: 20480 -> 20480, 8.03e9 -> 8.03e9."""
    return f"{x:.3g}" if abs(x) >= 1e6 else f"{x:g}"


# ---- accurate mode -----------------------------------------------------------------------

def weight_bytes(card: Card, cfg: Config) -> tuple[float, str]:
    m, P = cfg.model, card.total_params()
    if m.lora_rank == 0:
        return 4.0 * P, f"{_n(P)} params · 4 B (full fine-tune keeps fp32 master weights, engine/policy_loader.py)"
    b = BYTES[m.dtype]
    if m.load_in_4bit:
        return nf4_model_bytes(card, cfg, m.dtype)
    return float(P * b), f"{_n(P)} params · {b} B ({m.dtype})"


def nf4_model_bytes(card: Card, cfg: Config, dtype: str) -> tuple[float, str]:
    """A 4-bit base as bitsandbytes allocates it (engine/policy_loader.quantization): each decoder linear
    of n weights holds n/2 B of NF4 codes, one absmax per 64-weight block (fp32; with model.double_quant
    uint8 plus one fp32 per 256 of them, an fp32 offset and that level's 256-entry fp32 code table) and the
    16-entry fp32 NF4 table; everything else (embeddings, lm_head, norms, MoE experts, which are not
    nn.Linear) stays in `dtype`."""
    dq = cfg.model.double_quant
    lin = 0
    for _, din, dout, copies in card.linears():
        n = din * dout
        blocks = -(-n // NF4_BLOCK)
        scales = blocks + 4 * -(-blocks // NF4_NESTED_BLOCK) + 4 + 4 * 256 if dq else 4 * blocks
        lin += copies * (-(-n // 2) + scales + 4 * 16)
    lin *= card.layers
    n_lin = card.layers * card.layer_linear_params()
    rest, b = card.total_params() - n_lin, BYTES[dtype]
    scale_text = (f"uint8 absmax per {NF4_BLOCK} + fp32 per {NF4_NESTED_BLOCK} of those (double quant)" if dq
                  else f"fp32 absmax per {NF4_BLOCK}")
    return lin + rest * b, (f"{_n(n_lin)} linear params in NF4 ({lin * 8 / n_lin:.3f} bits each: 4-bit codes, "
                            f"{scale_text}, code tables) + {_n(rest)} embedding/norm params · {b} B ({dtype})")


def train_state_bytes(card: Card, cfg: Config, shards: int = 1) -> tuple[str, float, str]:
    """Trainable parameters' fp32 state; FSDP2 keeps 1/`shards` of it on each rank, and a full fine-tune computes
    in model.dtype through its mixed-precision policy instead of autocast's weight copies (engine/fsdp.py)."""
    m, P = cfg.model, card.total_params()
    per = f" ÷ {shards} (FSDP2: each rank holds its shard)" if shards > 1 else ""
    if m.lora_rank > 0:
        n = card.lora_params(m.lora_rank, m.lora_target_modules)
        return "LoRA adapter + AdamW", 16.0 * n / shards, (
            f"{_n(n)} LoRA params (Σ r·(d_in+d_out) over targets × {card.layers} layers) · 16 B "
            f"(fp32 weight 4 + grad 4 + Adam m,v 8){per}")
    text = f"{_n(P)} params · 12 B (fp32 grad 4 + Adam m,v 8){per}"
    extra = 0.0
    if m.dtype in ("bf16", "fp16", "fp8") and shards == 1:
        # torch.autocast caches one low-precision copy of every weight used in a matmul
        cast = card.layers * (card.layer_linear_params() + card.expert_params()) + card.vocab * card.hidden
        extra = 2.0 * cast
        text += f" + {_n(cast)} matmul weights · 2 B (autocast {m.dtype} copies)"
    return "full FT grads + AdamW", 12.0 * P / shards + extra, text


def per_layer_token_bytes(card: Card, cfg: Config, device: str, seq: int) -> tuple[float, str]:
    """Bytes saved for backward per token per decoder layer (Llama/Qwen/Gemma blocks, SDPA).

    a = activation bytes; the RMSNorms run in fp32 (HF), peft casts LoRA inputs to the fp32
    adapter dtype, SDPA with a padding mask gets k/v repeated to all heads (transformers
    repeat_kv), and the CPU kernel keeps a per-layer mask copy (a·T per token).
    """
    m = cfg.model
    full = m.lora_rank == 0
    a = BYTES[m.dtype]
    h, q, kv, i = card.hidden, card.q_dim, card.kv_dim, card.intermediate
    if card.num_experts:  # MoE: experts_per_token expert MLPs see each token
        i = card.intermediate * card.experts_per_token
    norms = card.norms_per_layer * ((4 * h + 4) + (4 * h if full else 0))
    terms = {"norms": norms}
    if card.qk_norm:
        terms["qk-norm"] = 4 * (q + kv) + 4 * (card.heads + card.kv_heads) + (4 * (q + kv) if full else 0)
    terms["attention q,k,v,out"] = 4 * a * q + 4 * card.heads
    terms["mlp gate,act,up"] = 3 * a * i
    if full:
        casts = 5 if a < 4 else 2    # autocast casts the input of each q,k,v,gate,up linear; fp32 shares it
        terms["linear inputs"] = casts * a * h + a * i
    else:
        targets = {n for n, *_ in card.linears()} if m.lora_target_modules in ([], ["all-linear"]) \
            else set(m.lora_target_modules)
        fp32_inputs = 0
        seen = set()
        for name, din, _, _ in card.linears():
            if name not in targets:
                continue
            src = {"q_proj": "attn_in", "k_proj": "attn_in", "v_proj": "attn_in", "qkv_proj": "attn_in",
                   "gate_proj": "mlp_in", "up_proj": "mlp_in", "gate_up_proj": "mlp_in"}.get(name, name)
            if a < 4 or src not in seen:       # fp32 model: peft's cast is a no-op, the input is shared
                fp32_inputs += 4 * din
            seen.add(src)
        terms["LoRA inputs (fp32)"] = fp32_inputs + 4 * m.lora_rank * len(targets & {n for n, *_ in card.linears()})
    if device == "cpu":
        terms["CPU SDPA mask copy"] = a * seq
    text = " + ".join(f"{k} {v:g}" for k, v in terms.items())
    return float(sum(terms.values())), text


def rank_prompts(cfg: Config, world_size: int = 1) -> int:
    """Prompts per step on one rank: each rank samples its contiguous share (engine/distributed.py shard)."""
    if cfg.train.prompts_per_step % world_size:
        raise UserError(f"must divide evenly among the {world_size} processes (each rank samples its share of "
                        f"the prompts)", kind="vram", key="train.prompts_per_step", value=cfg.train.prompts_per_step)
    return cfg.train.prompts_per_step // world_size


def train_rows(cfg: Config, world_size: int = 1) -> int:
    """Sequences in one forward/backward on one rank: train.micro_batch_size, or under train.micro_batch_tokens
    as many full-length rows as the budget holds (engine/batching.py: rows × the longest row <= budget; a
    row wider than the budget goes alone), or the rank's whole step batch."""
    t, r = cfg.train, cfg.rollout
    batch = rank_prompts(cfg, world_size) * r.num_generations
    if t.micro_batch_tokens > 0:
        return max(1, min(batch, t.micro_batch_tokens // (r.max_prompt_len + r.max_completion_len)))
    return min(batch, t.micro_batch_size) if t.micro_batch_size > 0 else batch


def _rows_text(cfg: Config, rows: int) -> str:
    budget, T = cfg.train.micro_batch_tokens, cfg.rollout.max_prompt_len + cfg.rollout.max_completion_len
    return f"{rows} seqs (micro_batch_tokens {budget} // {T} tok)" if budget else f"{rows} seqs"


def activation_bytes(card: Card, cfg: Config, device: str, world_size: int = 1) -> tuple[float, str, float]:
    """(GPU bytes, formula, host bytes) for the decoder stack + final norm over B·T tokens of one rank."""
    r, m = cfg.rollout, cfg.model
    B, T = train_rows(cfg, world_size), r.max_prompt_len + r.max_completion_len
    per, text = per_layer_token_bytes(card, cfg, device, T)
    full = m.lora_rank == 0
    outside = (4 * card.hidden + 4) + (4 * card.hidden + 8 if full else 0)   # final norm (+ ids for embedding grad)
    if full:
        outside += BYTES[m.dtype] * card.hidden * (r.max_completion_len + 1) / T   # lm_head input (kept rows)
    tokens = B * T
    if not m.gradient_checkpointing:
        return tokens * (card.layers * per + outside), (
            f"{_rows_text(cfg, B)} · {T} tok · ({card.layers} layers · {per:g} B + {outside:.0f} B outside); "
            f"per token per layer: {text}"), 0.0
    res = 4 if (full or m.dtype == "fp32") else BYTES[m.dtype]
    kept = tokens * card.layers * res * card.hidden
    one = tokens * per
    host = kept if m.offload_checkpoints else 0.0
    where = "host RAM" if m.offload_checkpoints else "GPU"
    return (kept - host) + one + tokens * outside, (
        f"checkpointed: {B}·{T} tok · {card.layers} layers · {res}·{card.hidden} B layer inputs ({where}) "
        f"+ one layer recomputed in backward ({per:g} B/token: {text}) + {outside:.0f} B/token outside"), host


def logits_bytes(card: Card, cfg: Config, world_size: int = 1) -> tuple[float, str]:
    r, m = cfg.rollout, cfg.model
    B, c, V = train_rows(cfg, world_size), r.max_completion_len, card.vocab
    a = BYTES[m.dtype]
    if m.logits_chunk > 0:
        n = m.logits_chunk
        return n * V * (a + 8) + B * c * 4, (f"chunked: {n} tok · {V} vocab · ({a} logits + 4 fp32 + 4 grad) "
                                            f"+ {B}·{c} fp32 log-probs")
    chunk = min(B, LOGPROB_CHUNK_ROWS)
    total = B * (c + 1) * V * (4 + a) + 2 * chunk * (c + 1) * V * 4 + B * c * 8
    return total, (f"materialised over completion tokens (logits_to_keep): {_rows_text(cfg, B)} · {c + 1} tok · "
                   f"{V} vocab · (4 B fp32 log-softmax saved + {a} B logits/grad) + 2 fp32 chunk temporaries "
                   f"({chunk} rows, engine/logprobs.py)")


def reference_bytes(card: Card, cfg: Config, world_size: int = 1) -> tuple[float, str]:
    r, m = cfg.rollout, cfg.model
    B, c, V = train_rows(cfg, world_size), r.max_completion_len, card.vocab
    a = BYTES[m.dtype]
    chunk = min(B, LOGPROB_CHUNK_ROWS)
    fwd = B * (c + 1) * V * a + 2 * chunk * (c + 1) * V * 4 + B * c * 4
    if m.lora_rank > 0:
        return fwd, (f"beta > 0, LoRA: adapters disabled, no weight copy; no-grad forward "
                     f"{B}·{c + 1}·{V} logits · {a} B + fp32 chunks + {B}·{c} log-probs · 4 B")
    P = card.total_params()
    return fwd + P * a, f"beta > 0, full FT: frozen copy {_n(P)} params · {a} B + no-grad logits forward"


def kv_cache_bytes(card: Card, cfg: Config, sequences: int) -> tuple[float, str]:
    r = cfg.rollout
    T, b = r.max_prompt_len + r.max_completion_len, ROLLOUT_BYTES[cfg.rollout_dtype]
    if card.sliding_window and card.sliding_pattern:
        glob = card.layers // card.sliding_pattern
        layer_tokens = glob * T + (card.layers - glob) * min(T, card.sliding_window)
        lt = f"({glob} global · {T} + {card.layers - glob} sliding · {min(T, card.sliding_window)}) tok"
    else:
        layer_tokens, lt = card.layers * T, f"{card.layers} layers · {T} tok"
    return (2 * b * layer_tokens * card.kv_dim * sequences,
            f"2 (K,V) · {b} B · {lt} · {card.kv_dim} kv dim · {sequences} seqs")


def accurate(card: Card, cfg: Config, gpu_gib: float | None = None, device: str = "cuda",
             world_size: int = 1) -> tuple[list[Row], str, bool]:
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
    rows += [Row(name, _g(nbytes), formula, "persistent")
             for name, nbytes, formula in reward_model_rows(cfg.rewards.funcs)]
    vllm = backend.resolve(r.backend, load_in_4bit=cfg.model.load_in_4bit)[0] == "vllm"
    if not vllm:
        seqs = rank_prompts(cfg, world_size) * cfg.train.steps_per_generation * r.num_generations  # one rollout
        kv, kvf = kv_cache_bytes(card, cfg, seqs)
        rows.append(Row("sampler weights copy (hf)", *_hf_copy_bytes(card, cfg), "persistent"))
        rows.append(Row("rollout KV cache (hf generate)", _g(kv), kvf, "rollout"))
        rule = ("weights + sampler copy + train state + max(rollout KV, train activations + logits): "
                "hf generate frees its cache")
        overlap = False
    elif not r.colocate:
        rule, overlap = "weights + train state + activations + logits; vLLM is on the rollout device", False
    else:
        rows.append(vllm_row(card, cfg, gpu_gib))
        rule, overlap = _vllm_rule(r.sleep)
    if device == "cuda":
        rows.append(Row("CUDA context", CUDA_CONTEXT_GIB, "CUDA context + cuBLAS workspace (typical)", "overhead"))
    if host:
        rows.append(Row("host RAM: offloaded checkpoints", _g(host),
                        "checkpointed layer inputs kept in pinned host RAM (not GPU)", "train", False))
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
        return Row("vLLM reservation", _g(need), need_f + " (no GPU size: the need, not gpu_memory_utilization × "
                   "total)", "rollout")
    share = vllm_share(card, cfg, gpu_gib)
    shown = f"{share:g}" if cfg.rollout.gpu_memory_utilization != AUTO else f"auto = {share:g}"
    return Row("vLLM reservation", share * gpu_gib, f"gpu_memory_utilization {shown} × {gpu_gib:g} GiB "
               f"(holds {_g(need):.2f} GiB of weights + KV: {need_f})", "rollout")


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


def phase_peak(rows: list[Row], overlap: bool) -> float:
    """Tensor memory at the peak: the persistent rows plus the rollout and training phases, summed when the
    rollout's memory stays live during training (`overlap`), else the larger of the two; training is the
    larger of the forward/backward and the gradient all-reduce after it."""
    by = {phase: sum(r.gib for r in rows if r.in_total and r.phase == phase) for phase in PHASES}
    train = max(by["train"], by["reduce"])
    return by["persistent"] + (by["rollout"] + train if overlap else max(by["rollout"], train))


# ---- entry points ------------------------------------------------------------------------

def estimate(card: Card, cfg: Config, mode: str = "accurate", gpu_gib: float | None = None,
             variant: str = "efficient", device: str = "cuda", doc_training: Row | None = None,
             world_size: int = 1) -> Breakdown:
    """The plan of every device (Breakdown.devices); `gpu_gib` is the size of each device (all alike)."""
    from grpo_studio.contract.planner import devices, documented  # both build on this module's rows

    if mode not in MODES:
        raise UserError(kind="vram", key="--mode", value=mode, allowed=MODES)
    if variant not in VARIANTS:
        raise UserError(kind="vram", key="--variant", value=variant, allowed=VARIANTS)
    out = Breakdown(mode=mode, model=card.name, gpu_gib=gpu_gib)
    if mode == "documented":
        if world_size > 1:
            raise UserError(f"is Unsloth's one-GPU arithmetic; plans for {world_size} devices need --mode accurate",
                            kind="vram", key="--mode", value=mode)
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


def solve(card: Card, cfg: Config, key: str, gpu_gib: float, mode: str = "accurate",
          variant: str = "efficient", device: str = "cuda", world_size: int = 1,
          need: Callable[[Breakdown], float] | None = None) -> Solution:
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
    lo, hi = lo_value, cap           # total(lo) fits, total(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(mid) <= gpu_gib else (lo, mid)
    at, nxt = est(_with(cfg, key, lo)), est(_with(cfg, key, hi))
    growth = {r.name: r.gib for r in nxt.largest().rows}
    base = {r.name: r.gib for r in low.largest().rows}
    limiting = max(growth, key=lambda n: growth[n] - base.get(n, 0.0))
    return Solution(key, "fits", lo, hi - lo, need(at), need(nxt), limiting)
