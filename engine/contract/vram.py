"""The VRAM planner: estimate(card, config) -> rows of GiB, each with the formula that produced it.

Pure python: imported by the studio, which never imports torch.

Two modes (formulas and sources in docs/vram.md):
  documented  Unsloth's GRPO memory arithmetic (unsloth.ai/blog/grpo, "Long-context GRPO"), as published.
  accurate    from the architecture, following what this engine does (engine/policy_loader.py, logprobs.py,
              trainer.py); checked against real training steps by `grpo-studio bench vram-accuracy`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

from grpo_studio.engine.contract import backend
from grpo_studio.engine.contract.config import AUTO, Config
from grpo_studio.engine.contract.dtypes import DTYPES
from grpo_studio.engine.contract.errors import UserError
from grpo_studio.engine.contract.model_card import Card

GIB = 2 ** 30
MODES = ("documented", "accurate")
VARIANTS = ("efficient", "standard")
SOLVE_KEYS = ("max_completion_len", "num_generations", "lora_rank", "context")
# When a row's memory is live: the whole run, while sampling, during the forward/backward, or not tensor
# memory at all (CUDA context, allocator margin). The accurate total is picked by phase (phase_peak).
PHASES = ("persistent", "rollout", "train", "overhead")
BYTES = {name: d.train_bytes for name, d in DTYPES.items()}            # trainer storage per weight
ROLLOUT_BYTES = {name: d.rollout_bytes for name, d in DTYPES.items()}  # rollout weight / KV element
NF4_BLOCK = 64          # bitsandbytes 4-bit: one absmax scale per 64 weights
NF4_NESTED_BLOCK = 256  # double quantisation: the absmax scales in uint8, one fp32 scale per 256 of them
LOGPROB_CHUNK_ROWS = 8  # engine/logprobs.py token_logprobs(chunk_rows=8)
CUDA_CONTEXT_GIB = 0.5  # CUDA context + cuBLAS workspace, typical for torch on recent GPUs
ALLOCATOR_MARGIN = 0.05  # caching-allocator fragmentation, share of the tensor total
VLLM_HEADROOM = 1.2     # rollout.gpu_memory_utilization = auto: the need for one rollout, plus 20% ...
VLLM_OVERHEAD_GIB = 1.0  # ... plus vLLM's own non-KV memory (profiling activations, sampler buffers, graphs)

# Unsloth's published "Training Memory Cost" for Llama 3.1 8B, 20K context, 8 generations.
# No derivation is published; the planner takes them as the doc's inputs.
DOC_TRAINING_GB = {"standard": 414.0, "efficient": 42.0}
DOC_SETUP = ("llama-3.1-8b", 20480, 8)


@dataclass
class Row:
    name: str
    gib: float
    formula: str
    phase: str            # one of PHASES
    in_total: bool = True


@dataclass
class Breakdown:
    mode: str
    model: str
    rows: list[Row] = field(default_factory=list)
    total_gib: float = 0.0
    gpu_gib: float | None = None
    fits: bool | None = None
    peak_rule: str = ""

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)

    def to_json(self) -> dict:
        return {"mode": self.mode, "model": self.model,
                "rows": [{k: v for k, v in asdict(r).items()} for r in self.rows],
                "total_gib": round(self.total_gib, 4), "gpu_gib": self.gpu_gib, "fits": self.fits,
                "peak_rule": self.peak_rule}


def _g(nbytes: float) -> float:
    return nbytes / GIB


def _n(x: float) -> str:
    """A compact number for formula text: 20480 -> 20480, 8.03e9 -> 8.03e9."""
    return f"{x:.3g}" if abs(x) >= 1e6 else f"{x:g}"


# ---- documented mode ---------------------------------------------------------------------

def documented(card: Card, cfg: Config, variant: str = "efficient", training: Row | None = None) -> list[Row]:
    """Unsloth's GRPO table: training + GRPO logits + inference weights copy + KV cache.

    `training` pins the training row (inverse solving keeps the starting config's row: the doc's
    figure belongs to one setup and must not switch on and off while a key is searched)."""
    r, m = cfg.rollout, cfg.model
    G, T, V = r.num_generations, r.max_prompt_len + r.max_completion_len, card.vocab
    size_b = card.nominal_b or card.total_params() / 1e9
    if (card.name, T, G) == DOC_SETUP:
        train = DOC_TRAINING_GB[variant]
        train_f = (f"doc's published training memory for this setup ({variant}: {train:g} GB); "
                   f"Unsloth publishes no derivation, taken as the doc's input")
    elif m.lora_rank == 0:
        train = 16 * size_b
        train_f = f"full fine-tune: 16 B/param × {size_b:g}B (mixed-precision AdamW rule; not in Unsloth's doc)"
    elif m.load_in_4bit:
        train = size_b
        train_f = f"QLoRA rule of thumb: params in B ≈ GB → {size_b:g}"
    else:
        train = 4 * size_b
        train_f = f"LoRA 16-bit ≈ 4 × QLoRA rule of thumb: 4 × {size_b:g}"
    logits = 2 * 2 * G * T * V / (8 if variant == "efficient" else 1)
    logits_f = f"2 · 2 B · {G} gen · {T} ctx · {V} vocab" + (" ÷ 8 (Unsloth memory-efficient GRPO loss)"
                                                             if variant == "efficient" else " (standard)")
    if variant == "efficient":
        infer, infer_f = 0.0, "0: weights shared with vLLM (Unsloth)"
    else:
        infer = 2 * size_b
        infer_f = f"2 B · {size_b:g}B params (separate vLLM copy; the doc counts 1B params ≈ 1 GB)"
    kv = 2 * 2 * card.layers * T * card.kv_dim
    kv_f = f"2 · 2 B · {card.layers} layers · {T} ctx · ({card.kv_heads} kv heads · {card.head_dim} head_dim) per batch"
    if training is not None:
        train, train_f = training.gib, training.formula
    return [Row("training", train, train_f, "persistent"), Row("GRPO logits", _g(logits), logits_f, "train"),
            Row("inference weights copy", infer, infer_f, "persistent"), Row("KV cache", _g(kv), kv_f, "rollout")]


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


def train_state_bytes(card: Card, cfg: Config) -> tuple[str, float, str]:
    m, P = cfg.model, card.total_params()
    if m.lora_rank > 0:
        n = card.lora_params(m.lora_rank, m.lora_target_modules)
        return "LoRA adapter + AdamW", 16.0 * n, (
            f"{_n(n)} LoRA params (Σ r·(d_in+d_out) over targets × {card.layers} layers) · 16 B "
            f"(fp32 weight 4 + grad 4 + Adam m,v 8)")
    text = f"{_n(P)} params · 12 B (fp32 grad 4 + Adam m,v 8)"
    extra = 0.0
    if m.dtype in ("bf16", "fp16", "fp8"):
        # torch.autocast caches one low-precision copy of every weight used in a matmul
        cast = card.layers * (card.layer_linear_params() + card.expert_params()) + card.vocab * card.hidden
        extra = 2.0 * cast
        text += f" + {_n(cast)} matmul weights · 2 B (autocast {m.dtype} copies)"
    return "full FT grads + AdamW", 12.0 * P + extra, text


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


def train_rows(cfg: Config) -> int:
    """Sequences in one forward/backward: train.micro_batch_size, or the whole step's batch."""
    batch = cfg.train.prompts_per_step * cfg.rollout.num_generations
    return min(batch, cfg.train.micro_batch_size) if cfg.train.micro_batch_size > 0 else batch


def activation_bytes(card: Card, cfg: Config, device: str) -> tuple[float, str, float]:
    """(GPU bytes, formula, host bytes) for the decoder stack + final norm over B·T tokens."""
    r, m = cfg.rollout, cfg.model
    B, T = train_rows(cfg), r.max_prompt_len + r.max_completion_len
    per, text = per_layer_token_bytes(card, cfg, device, T)
    full = m.lora_rank == 0
    outside = (4 * card.hidden + 4) + (4 * card.hidden + 8 if full else 0)   # final norm (+ ids for embedding grad)
    if full:
        outside += BYTES[m.dtype] * card.hidden * (r.max_completion_len + 1) / T   # lm_head input (kept rows)
    tokens = B * T
    if not m.gradient_checkpointing:
        return tokens * (card.layers * per + outside), (
            f"{B} seqs · {T} tok · ({card.layers} layers · {per:g} B + {outside:.0f} B outside); "
            f"per token per layer: {text}"), 0.0
    res = 4 if (full or m.dtype == "fp32") else BYTES[m.dtype]
    kept = tokens * card.layers * res * card.hidden
    one = tokens * per
    host = kept if m.offload_checkpoints else 0.0
    where = "host RAM" if m.offload_checkpoints else "GPU"
    return (kept - host) + one + tokens * outside, (
        f"checkpointed: {B}·{T} tok · {card.layers} layers · {res}·{card.hidden} B layer inputs ({where}) "
        f"+ one layer recomputed in backward ({per:g} B/token: {text}) + {outside:.0f} B/token outside"), host


def logits_bytes(card: Card, cfg: Config) -> tuple[float, str]:
    r, m = cfg.rollout, cfg.model
    B, c, V = train_rows(cfg), r.max_completion_len, card.vocab
    a = BYTES[m.dtype]
    if m.logits_chunk > 0:
        n = m.logits_chunk
        return n * V * (a + 8) + B * c * 4, (f"chunked: {n} tok · {V} vocab · ({a} logits + 4 fp32 + 4 grad) "
                                            f"+ {B}·{c} fp32 log-probs")
    chunk = min(B, LOGPROB_CHUNK_ROWS)
    total = B * (c + 1) * V * (4 + a) + 2 * chunk * (c + 1) * V * 4 + B * c * 8
    return total, (f"materialised over completion tokens (logits_to_keep): {B} seqs · {c + 1} tok · {V} vocab · "
                   f"(4 B fp32 log-softmax saved + {a} B logits/grad) + 2 fp32 chunk temporaries "
                   f"({chunk} rows, engine/logprobs.py)")


def reference_bytes(card: Card, cfg: Config) -> tuple[float, str]:
    r, m = cfg.rollout, cfg.model
    B, c, V = train_rows(cfg), r.max_completion_len, card.vocab
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


def accurate(card: Card, cfg: Config, gpu_gib: float | None = None,
             device: str = "cuda") -> tuple[list[Row], str, bool]:
    """Rows, the phase-peak rule in words, and whether the rollout's memory stays live during training
    (phase_peak sums the two phases, else takes the larger). Rows with in_total=False are shown but not
    summed into the GPU total."""
    r = cfg.rollout
    rows: list[Row] = []
    w, wf = weight_bytes(card, cfg)
    rows.append(Row("base weights", _g(w), wf, "persistent"))
    name, s, sf = train_state_bytes(card, cfg)
    rows.append(Row(name, _g(s), sf, "persistent"))
    act, af, host = activation_bytes(card, cfg, device)
    rows.append(Row("activations", _g(act), af, "train"))
    lg, lf = logits_bytes(card, cfg)
    rows.append(Row("logits + log-softmax", _g(lg), lf, "train"))
    if cfg.algo.beta > 0:
        ref, rf = reference_bytes(card, cfg)
        rows.append(Row("reference log-probs", _g(ref), rf, "train"))
    seqs = cfg.train.prompts_per_step * cfg.train.steps_per_generation * r.num_generations  # one rollout
    kv, kvf = kv_cache_bytes(card, cfg, seqs)
    vllm = backend.resolve(r.backend, load_in_4bit=cfg.model.load_in_4bit)[0] == "vllm"
    if not vllm:
        rows.append(Row("sampler weights copy (hf)", *_hf_copy_bytes(card, cfg), "persistent"))
        rows.append(Row("rollout KV cache (hf generate)", _g(kv), kvf, "rollout"))
        rule = ("weights + sampler copy + train state + max(rollout KV, train activations + logits): "
                "hf generate frees its cache")
        overlap = False
    else:
        rb = ROLLOUT_BYTES[cfg.rollout_dtype]
        need = card.total_params() * rb + kv
        need_f = f"weights {_n(card.total_params())} · {rb} B + KV cache ({kvf})"
        if not r.colocate:
            rows.append(Row("vLLM (own GPU)", _g(need), need_f + "; on the rollout GPU, not in this total", "rollout",
                            False))
            rule, overlap = "training GPU only: vLLM runs on its own GPU", True
        elif gpu_gib:
            share = vllm_share(card, cfg, gpu_gib)
            shown = f"{share:g}" if r.gpu_memory_utilization != AUTO else f"auto = {share:g}"
            rows.append(Row("vLLM reservation", share * gpu_gib,
                            f"gpu_memory_utilization {shown} × {gpu_gib:g} GiB "
                            f"(holds {_g(need):.2f} GiB of weights + KV: {need_f})", "rollout"))
            rule, overlap = _vllm_rule(r.sleep)
        else:
            rows.append(Row("vLLM reservation", _g(need), need_f + " (no GPU size: the need, not "
                            "gpu_memory_utilization × total)", "rollout"))
            rule, overlap = _vllm_rule(r.sleep)
    if device == "cuda":
        rows.append(Row("CUDA context", CUDA_CONTEXT_GIB, "CUDA context + cuBLAS workspace (typical)", "overhead"))
    if host:
        rows.append(Row("host RAM: offloaded checkpoints", _g(host),
                        "checkpointed layer inputs kept in pinned host RAM (not GPU)", "train", False))
    return rows, rule, overlap


def vllm_share(card: Card, cfg: Config, total_gib: float) -> float:
    """rollout.gpu_memory_utilization as vLLM receives it: the key's value, or for `auto` the share of
    `total_gib` that holds the rollout's weights and the KV cache of one rollout's sequences, with
    VLLM_HEADROOM and VLLM_OVERHEAD_GIB, rounded up to 0.01 and capped at 0.95."""
    r = cfg.rollout
    if r.gpu_memory_utilization != AUTO:
        return r.gpu_memory_utilization
    sequences = cfg.train.prompts_per_step * cfg.train.steps_per_generation * r.num_generations
    need = _g(card.total_params() * ROLLOUT_BYTES[cfg.rollout_dtype] + kv_cache_bytes(card, cfg, sequences)[0])
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
    """Tensor memory at the peak: the persistent rows plus the rollout and train phases, summed when the
    rollout's memory stays live during training (`overlap`), else the larger of the two."""
    by = {phase: sum(r.gib for r in rows if r.in_total and r.phase == phase) for phase in PHASES}
    return by["persistent"] + (by["rollout"] + by["train"] if overlap else max(by["rollout"], by["train"]))


# ---- entry points ------------------------------------------------------------------------

def estimate(card: Card, cfg: Config, mode: str = "accurate", gpu_gib: float | None = None,
             variant: str = "efficient", device: str = "cuda", doc_training: Row | None = None) -> Breakdown:
    if mode not in MODES:
        raise UserError(kind="vram", key="--mode", value=mode, allowed=MODES)
    if variant not in VARIANTS:
        raise UserError(kind="vram", key="--variant", value=variant, allowed=VARIANTS)
    out = Breakdown(mode=mode, model=card.name, gpu_gib=gpu_gib)
    if mode == "documented":
        out.rows = documented(card, cfg, variant, doc_training)
        out.total_gib = sum(r.gib for r in out.rows)
        out.peak_rule = f"sum of the doc's rows ({variant} column)"
    else:
        out.rows, out.peak_rule, overlap = accurate(card, cfg, gpu_gib, device)
        tensors = phase_peak(out.rows, overlap)
        if device == "cuda":
            out.rows.append(Row("allocator margin", ALLOCATOR_MARGIN * tensors,
                                f"{ALLOCATOR_MARGIN:.0%} of {tensors:.2f} GiB tensor memory (caching-allocator "
                                "fragmentation)", "overhead"))
        out.total_gib = tensors + sum(r.gib for r in out.rows if r.phase == "overhead")
    if gpu_gib:
        out.fits = out.total_gib <= gpu_gib
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
          variant: str = "efficient", device: str = "cuda") -> Solution:
    """The largest value of `key` whose estimate fits `gpu_gib` (binary search; totals are monotone), or
    why there is none (Solution.status)."""
    if key not in SOLVE_KEYS:
        raise UserError(kind="vram", key="--solve", value=key, allowed=SOLVE_KEYS)
    if key == "lora_rank" and cfg.model.lora_rank == 0:
        raise UserError("--solve lora_rank with model.lora_rank = 0 (full fine-tune): set a rank > 0", kind="vram")
    pin = estimate(card, cfg, mode, gpu_gib, variant, device).rows[0] if mode == "documented" else None

    def est(c: Config) -> Breakdown:
        return estimate(card, c, mode, gpu_gib, variant, device, pin)

    lo_value = {"num_generations": 2, "context": 2}.get(key, 1)
    cap = {"lora_rank": 4096, "num_generations": 65536}.get(key, 1_000_000)

    def total(v: int) -> float:
        return est(_with(cfg, key, v)).total_gib

    low = est(_with(cfg, key, lo_value))
    if low.total_gib > gpu_gib:
        big = max(low.rows, key=lambda r: r.gib if r.in_total else -1)
        return Solution(key, "never_fits", lo_value, 0, low.total_gib, None, big.name)
    top = total(cap)
    if top <= gpu_gib:
        return Solution(key, "never_outgrows", cap, 0, top, None, "")
    lo, hi = lo_value, cap           # total(lo) fits, total(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(mid) <= gpu_gib else (lo, mid)
    at, nxt = est(_with(cfg, key, lo)), est(_with(cfg, key, hi))
    growth = {r.name: r.gib for r in nxt.rows}
    base = {r.name: r.gib for r in low.rows}
    limiting = max(growth, key=lambda n: growth[n] - base.get(n, 0.0))
    return Solution(key, "fits", lo, hi - lo, at.total_gib, nxt.total_gib, limiting)
