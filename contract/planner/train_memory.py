"""The VRAM planner's accurate mode, one training rank's memory: the weights as stored (a 4-bit base as
bitsandbytes allocates it), the trainable state, the activations saved for the backward, the logits and
log-softmax, and the reference forward (algo.beta > 0); each as bytes with the formula in words.

Pure python, like contract/planner/vram.py.
"""

from __future__ import annotations

from ..config import AUTO, Config, check_processes
from ..dtypes import low_precision
from ..model_card import ROUTED, Card
from .breakdown import BYTES, LOGPROB_CHUNK_ROWS, NF4_BLOCK, NF4_NESTED_BLOCK, _n


def weight_bytes(card: Card, cfg: Config) -> tuple[float, str]:
    m, P = cfg.model, card.total_params()
    if m.lora_rank == 0:
        return (
            4.0 * P,
            f"{_n(P)} params · 4 B (full fine-tune keeps fp32 master weights, engine/model/policy_loader.py)",
        )
    b = BYTES[m.dtype]
    if m.load_in_4bit:
        return nf4_model_bytes(card, cfg, m.dtype)
    return float(P * b), f"{_n(P)} params · {b} B ({m.dtype})"


def nf4_model_bytes(card: Card, cfg: Config, dtype: str) -> tuple[float, str]:
    """A 4-bit base as bitsandbytes allocates it (engine/model/policy_loader.quantization): each decoder linear
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
    scale_text = (
        f"uint8 absmax per {NF4_BLOCK} + fp32 per {NF4_NESTED_BLOCK} of those (double quant)"
        if dq
        else f"fp32 absmax per {NF4_BLOCK}"
    )
    return lin + rest * b, (
        f"{_n(n_lin)} linear params in NF4 ({lin * 8 / n_lin:.3f} bits each: 4-bit codes, "
        f"{scale_text}, code tables) + {_n(rest)} embedding/norm params · {b} B ({dtype})"
    )


def train_state_bytes(card: Card, cfg: Config, shards: int = 1) -> tuple[str, float, str]:
    """Trainable parameters' fp32 state; FSDP2 keeps 1/`shards` of it on each rank, and a full fine-tune computes
    in model.dtype through its mixed-precision policy instead of autocast's weight copies (engine/model/fsdp.py)."""
    m, P = cfg.model, card.total_params()
    per = f" ÷ {shards} (FSDP2: each rank holds its shard)" if shards > 1 else ""
    if m.lora_rank > 0:
        n = card.lora_params(m.lora_rank, m.lora_target_modules)
        return (
            "LoRA adapter + AdamW",
            16.0 * n / shards,
            (
                f"{_n(n)} LoRA params (Σ r·(d_in+d_out) over targets × {card.layers} layers) · 16 B "
                f"(fp32 weight 4 + grad 4 + Adam m,v 8){per}"
            ),
        )
    text = f"{_n(P)} params · 12 B (fp32 grad 4 + Adam m,v 8){per}"
    extra = 0.0
    if low_precision(m.dtype) and shards == 1:
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
    if card.family in ROUTED:  # grouped experts: each token's hidden state gathered once per chosen expert, + the sum
        terms["MoE routed copies"] = a * (card.experts_per_token + 1) * h
    if full:
        casts = 5 if a < 4 else 2  # autocast casts the input of each q,k,v,gate,up linear; fp32 shares it
        terms["linear inputs"] = casts * a * h + a * i
    else:
        targets = (
            {n for n, *_ in card.linears()}
            if m.lora_target_modules in ([], ["all-linear"])
            else set(m.lora_target_modules)
        )
        fp32_inputs = 0
        seen = set()
        for name, din, _, _ in card.linears():
            if name not in targets:
                continue
            src = {
                "q_proj": "attn_in",
                "k_proj": "attn_in",
                "v_proj": "attn_in",
                "qkv_proj": "attn_in",
                "gate_proj": "mlp_in",
                "up_proj": "mlp_in",
                "gate_up_proj": "mlp_in",
            }.get(name, name)
            if a < 4 or src not in seen:  # fp32 model: peft's cast is a no-op, the input is shared
                fp32_inputs += 4 * din
            seen.add(src)
        terms["LoRA inputs (fp32)"] = fp32_inputs + 4 * m.lora_rank * len(targets & {n for n, *_ in card.linears()})
    if device == "cpu":
        terms["CPU SDPA mask copy"] = a * seq
    text = " + ".join(f"{k} {v:g}" for k, v in terms.items())
    return float(sum(terms.values())), text


def rank_prompts(cfg: Config, world_size: int = 1) -> int:
    """Prompts per step on one rank: each rank samples its contiguous share (engine/run/distributed.py shard)."""
    check_processes(cfg, world_size, kind="vram")
    return cfg.train.prompts_per_step // world_size


def train_rows(cfg: Config, world_size: int = 1) -> int:
    """Sequences in one forward/backward on one rank: train.micro_batch_size, or under train.micro_batch_tokens
    as many full-length rows as the budget holds (engine/rollout/batching.py: rows × the longest row <= budget; a
    row wider than the budget goes alone), or the rank's whole step batch (also for an `auto` micro-batch, which
    vram.estimate fills in first: contract/planner/micro_batch.py)."""
    t, r = cfg.train, cfg.rollout
    batch = rank_prompts(cfg, world_size) * r.num_generations
    if t.micro_batch_tokens > 0:
        return max(1, min(batch, t.micro_batch_tokens // (r.max_prompt_len + r.max_completion_len)))
    return min(batch, t.micro_batch_size) if t.micro_batch_size not in (0, AUTO) else batch


def _rows_text(cfg: Config, rows: int) -> str:
    budget, T = cfg.train.micro_batch_tokens, cfg.rollout.max_prompt_len + cfg.rollout.max_completion_len
    return f"{rows} seqs (micro_batch_tokens {budget} // {T} tok)" if budget else f"{rows} seqs"


def activation_bytes(card: Card, cfg: Config, device: str, world_size: int = 1) -> tuple[float, str, float]:
    """(GPU bytes, formula, host bytes) for the decoder stack + final norm over B·T tokens of one rank."""
    r, m = cfg.rollout, cfg.model
    B, T = train_rows(cfg, world_size), r.max_prompt_len + r.max_completion_len
    per, text = per_layer_token_bytes(card, cfg, device, T)
    full = m.lora_rank == 0
    outside = (4 * card.hidden + 4) + (4 * card.hidden + 8 if full else 0)  # final norm (+ ids for embedding grad)
    if full:
        outside += BYTES[m.dtype] * card.hidden * (r.max_completion_len + 1) / T  # lm_head input (kept rows)
    tokens = B * T
    # LoRA on an MoE's fused experts: peft's ParamWrapper builds each layer's W + ΔW (fp32) in the forward
    merged = 0 if full or card.family not in ROUTED else 4 * 3 * card.num_experts * card.intermediate * card.hidden
    if merged:
        text += f"; + {merged:g} B a layer: merged LoRA experts (4 · 3 · E · i · h)"
    if not m.gradient_checkpointing:
        return (
            tokens * (card.layers * per + outside) + card.layers * merged,
            (
                f"{_rows_text(cfg, B)} · {T} tok · ({card.layers} layers · {per:g} B + {outside:.0f} B outside); "
                f"per token per layer: {text}"
            ),
            0.0,
        )
    res = 4 if full else BYTES[m.dtype]  # fp32 full fine-tune masters; else as stored (fp32 also 4 B)
    kept = tokens * card.layers * res * card.hidden
    one = tokens * per
    host = kept if m.offload_checkpoints else 0.0
    where = "host RAM" if m.offload_checkpoints else "GPU"
    return (
        (kept - host) + one + tokens * outside + merged,
        (
            f"checkpointed: {B}·{T} tok · {card.layers} layers · {res}·{card.hidden} B layer inputs ({where}) "
            f"+ one layer recomputed in backward ({per:g} B/token: {text}) + {outside:.0f} B/token outside"
        ),
        host,
    )


def logits_bytes(card: Card, cfg: Config, world_size: int = 1) -> tuple[float, str]:
    r, m = cfg.rollout, cfg.model
    B, c, V = train_rows(cfg, world_size), r.max_completion_len, card.vocab
    a = BYTES[m.dtype]
    if m.logits_chunk > 0:
        n = m.logits_chunk
        return n * V * (a + 8) + B * c * 4, (
            f"chunked: {n} tok · {V} vocab · ({a} logits + 4 fp32 + 4 grad) + {B}·{c} fp32 log-probs"
        )
    chunk = min(B, LOGPROB_CHUNK_ROWS)
    total = B * (c + 1) * V * (4 + a) + 2 * chunk * (c + 1) * V * 4 + B * c * 8
    return total, (
        f"materialised over completion tokens (logits_to_keep): {_rows_text(cfg, B)} · {c + 1} tok · "
        f"{V} vocab · (4 B fp32 log-softmax saved + {a} B logits/grad) + 2 fp32 chunk temporaries "
        f"({chunk} rows, engine/train/logprobs.py)"
    )


def reference_bytes(card: Card, cfg: Config, world_size: int = 1) -> tuple[float, str]:
    r, m = cfg.rollout, cfg.model
    B, c, V = train_rows(cfg, world_size), r.max_completion_len, card.vocab
    a = BYTES[m.dtype]
    chunk = min(B, LOGPROB_CHUNK_ROWS)
    fwd = B * (c + 1) * V * a + 2 * chunk * (c + 1) * V * 4 + B * c * 4
    if m.lora_rank > 0:
        return fwd, (
            f"beta > 0, LoRA: adapters disabled, no weight copy; no-grad forward "
            f"{B}·{c + 1}·{V} logits · {a} B + fp32 chunks + {B}·{c} log-probs · 4 B"
        )
    P = card.total_params()
    return fwd + P * a, f"beta > 0, full FT: frozen copy {_n(P)} params · {a} B + no-grad logits forward"
