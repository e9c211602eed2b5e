"""Per-token log-probs π under the training model, two ways with the same numerics.

materialised (model.logits_chunk = 0): the forward keeps only the completion positions
    (`logits_to_keep`) and the fp32 log-softmax runs over row chunks; autograd saves each
    chunk's log-softmax, so training holds B×T×V fp32 values at its peak.
chunked (model.logits_chunk = N > 0): the lm_head and log-softmax run in tiles of token rows ×
    vocabulary columns inside one autograd Function (ChunkedLogSoftmax: an online log-sum-exp over
    the vocabulary tiles, cf. Liger's fused linear cross-entropy; engine/train/chunked_logsoftmax.py): at most
    N×V logits exist at once, forward or backward.
    On CUDA with trl installed it runs TRL 1.16's `trl.kernels` ChunkedLogProbFunction instead
    (Triton kernels over cuBLAS tiles, `triton_logps`). It applies the
    final-logit transforms that the model's own forward applies after its lm_head: Cohere's
    `logit_scale` (×), Granite's `logits_scaling` (÷) and Gemma-2/3's `final_logit_softcapping`
    (c·tanh(z/c)); the first call on a model checks one row against the model's own logits.

shared prefix (train.shared_prefix): each distinct prompt of a batch runs once and its KV cache is
    indexed out to the rows that share it before their completions run (`_shared_prefix_hidden`), given
    the rows' completion spans packed side by side into fewer rows (engine/train/completion_packing.py).

Log-probs use the same temperature as the sampler (TRL issue 4159: comparing μ at T with π at
T=1 makes the mismatch metric and the IS weights meaningless), and, given the sampler's kept sets
(`support`, Rollout.support: top-k/top-p with algo.logprob_support = sampler), the same support: every logit
outside a position's kept set is OUTSIDE before the log-softmax, so π and its entropy are those of the
truncated, renormalised distribution μ was drawn from, log π_S(y) = z_y − log Σ_{v∈S} e^{z_v}
(docs/mismatch.md, "Truncated sampling").
"""

from __future__ import annotations

import torch

from ..sampler.base import unpack_support
from . import completion_packing
from .chunked_logsoftmax import COLUMNS, OUTSIDE, ChunkedLogSoftmax


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generate() uses them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    temperature: float = 1.0,
    chunk_rows: int = 8,
    with_entropy: bool = False,
    logits_chunk: int = 0,
    shared_prefix: bool = False,
    spans: torch.Tensor | None = None,
    support: torch.Tensor | None = None,
):
    """Return (logps [B, T], entropy [B, T] or None) for the last `completion_len` tokens. `spans` [B]: each
    row's completion span (batching.spans); on the hidden-state paths (shared prefix, chunked) the lm_head and
    log-softmax run on those positions only, the padding after them reads 0. `support` [B, ≥T, ceil(V/8)]: the
    sampler's packed kept sets (Rollout.support), π renormalised on them; None: the whole vocabulary."""
    targets = input_ids[:, -completion_len:]
    if support is not None:
        support = support[:, :completion_len].to(targets.device)
    if logits_chunk == 0 and not shared_prefix:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
            logits_to_keep=completion_len + 1,
            use_cache=False,
        )
        logits = out.logits[:, :-1, :]  # t → t+1
        return materialised_logps(logits, targets, temperature, chunk_rows, with_entropy, support)
    if shared_prefix:
        hidden = _shared_prefix_hidden(model, input_ids, attention_mask, completion_len, spans)
    else:
        hidden = _completion_hidden(model, input_ids, attention_mask, completion_len)
    head = model.get_output_embeddings()
    scale, softcap = head_transform(model)
    B, T = targets.shape
    scored = torch.ones_like(targets, dtype=torch.bool) if spans is None else _within(spans.to(targets.device), T)
    r = int(scored.any(1).to(torch.uint8).argmax())  # the first row with a scored position (an episode may have none)
    check = (input_ids[r : r + 1], attention_mask[r : r + 1], hidden[r], scored[r])
    _check_head_transform(model, *check, head.weight, scale, softcap, logits_chunk)
    hidden, targets = hidden[scored], targets[scored]  # [N, H], [N]: each scored position a row
    kept = None if support is None else support[scored]
    if logits_chunk == 0:  # the same N×V logits at once as chunk_rows rows of T
        logits = _final_logits(head(hidden), scale, softcap).unsqueeze(1)
        logps, entropy = materialised_logps(
            logits,
            targets.unsqueeze(1),
            temperature,
            chunk_rows * T,
            with_entropy,
            None if kept is None else kept[:, None],
        )
    else:
        logps, entropy = fused_logps(
            hidden, head.weight, targets, temperature, logits_chunk, scale, softcap, with_entropy, kept
        )
    return _spread(logps, scored), (_spread(entropy, scored) if with_entropy else None)


def _within(spans: torch.Tensor, T: int) -> torch.Tensor:
    """[B, T] bool: the positions inside each row's completion span."""
    return torch.arange(T, device=spans.device) < spans.unsqueeze(1)


def _spread(values: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """[N] values of the scored positions back into [B, T], 0 elsewhere (differentiable)."""
    return values.new_zeros(scored.shape).masked_scatter(scored, values.reshape(-1))


def _completion_hidden(model, input_ids, attention_mask, T):
    """Final hidden states [B, T, H] of the positions that predict the T completion tokens (t predicts t+1)."""
    hidden = model.get_decoder()(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask), use_cache=False
    ).last_hidden_state
    return hidden[:, -(T + 1) : -1, :]


def prefix_groups(input_ids, attention_mask, T) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct prompts [P, 2·Lp] as ids then mask, the row → prompt index [B]) of a batch's prompt parts."""
    prompts = torch.cat([input_ids[:, :-T], attention_mask[:, :-T].to(input_ids.dtype)], dim=1)
    return torch.unique(prompts, dim=0, return_inverse=True)


def _shared_prefix_hidden(model, input_ids, attention_mask, T, spans=None):
    """_completion_hidden with each distinct prompt run once: the prompt pass fills a KV cache that is
    indexed out to the rows sharing it (autograd sums their gradients into the one pass, index_select's
    backward), then the completions run on it; given the rows' completion spans, packed into fewer rows where
    that saves one (engine/train/completion_packing.py; positions after a span then hold another row's values, which
    token_logprobs does not read). Same positions, same masks, same attention: exact up to the summation order
    of the attention kernels (see shared_prefix_refusal for where it applies)."""
    from transformers import DynamicCache

    unique, rows = prefix_groups(input_ids, attention_mask, T)
    width = input_ids.shape[1] - T
    ids, mask = unique[:, :width], unique[:, width:]
    decoder = model.get_decoder()
    cache = DynamicCache(config=model.config.get_text_config())
    prompt = decoder(
        input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), past_key_values=cache, use_cache=True
    ).last_hidden_state
    packing = None
    if spans is not None and bool(attention_mask[:, -T:].all()):
        packing = completion_packing.pack(input_ids[:, -T:], rows, mask.sum(1), spans)
    if packing is None:
        cache.batch_select_indices(rows)
        completion = decoder(
            input_ids=input_ids[:, -T:],
            attention_mask=attention_mask,
            past_key_values=cache,
            position_ids=position_ids(attention_mask)[:, -T:],
            use_cache=True,
        ).last_hidden_state
    else:
        cache.batch_select_indices(packing.slot_prompt)
        eager = attention_implementation(model) == "eager"
        packed = decoder(
            input_ids=packing.ids,
            attention_mask=completion_packing.attention_mask(packing, mask, prompt.dtype if eager else None),
            past_key_values=cache,
            position_ids=packing.positions,
            use_cache=True,
        ).last_hidden_state
        completion = packed.flatten(0, 1)[packing.gather]  # [B, T, H]: each row's inputs back in place
    # the last prompt position predicts the first completion token
    return torch.cat([prompt[rows, -1:, :], completion[:, :-1, :]], dim=1)


def use_shared_prefix(mode: str, model, input_ids, attention_mask, T) -> bool:
    """train.shared_prefix for one call: off; on (refused in one line where it cannot be exact); auto = on
    where it is exact and the batch repeats a prompt. However short the prompt, the shared pass runs fewer
    positions (each prompt once, the completions packed): measured faster on prompts of 6 tokens and fewer
    (docs/performance.md, "Short-prompt")."""
    if mode == "off":
        return False
    why = shared_prefix_refusal(model)
    if mode == "on":
        if why:
            from ...contract.errors import UserError

            raise UserError(
                f"{type(model).__name__} has {why}; set train.shared_prefix = auto or off",
                key="train.shared_prefix",
                value=mode,
            )
        return True
    return why is None and prefix_groups(input_ids, attention_mask, T)[0].shape[0] < input_ids.shape[0]


def attention_implementation(model) -> str:
    """The attention function the model's layers call (transformers' name; none set: eager)."""
    return getattr(model.config.get_text_config(), "_attn_implementation", None) or "eager"


def shared_prefix_refusal(model) -> str | None:
    """Why train.shared_prefix cannot run this model exactly (None: it can): it needs a decoder that takes
    a DynamicCache, eager or sdpa attention, and full attention in every layer (a sliding window or a
    recurrent/linear-attention layer would see a different context through the cache)."""
    cfg = model.config.get_text_config()
    attention = attention_implementation(model)
    if attention not in ("eager", "sdpa"):
        return f"attention implementation {attention!r} (supported: eager, sdpa)"
    kinds = set(getattr(cfg, "layer_types", None) or [])
    if kinds - {"full_attention"}:
        return f"layer types {sorted(kinds - {'full_attention'})} (supported: full_attention only)"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True) and not kinds:
        return f"sliding_window = {cfg.sliding_window}"
    if getattr(model, "is_gradient_checkpointing", False):
        return "model.gradient_checkpointing (transformers turns the prompt pass's KV cache off)"
    return None


def materialised_logps(logits, targets, temperature, chunk_rows=8, with_entropy=False, support=None):
    """(log p_y [B, T], entropy [B, T] or None) from whole [B, T, V] logits: fp32 log-softmax `chunk_rows`
    rows at a time, autograd keeping each chunk's log-softmax for the backward; given packed kept sets
    `support` [B, T, ceil(V/8)], over each position's kept tokens only (the rest OUTSIDE: probability 0)."""
    logps, entropies = [], []
    for rows in range(0, logits.shape[0], chunk_rows):
        chunk = logits[rows : rows + chunk_rows].float() / temperature
        if support is not None:
            chunk = chunk.masked_fill(~unpack_support(support[rows : rows + chunk_rows], chunk.shape[-1]), OUTSIDE)
        logsm = torch.log_softmax(chunk, dim=-1)
        logps.append(logsm.gather(-1, targets[rows : rows + chunk_rows].unsqueeze(-1)).squeeze(-1))
        if with_entropy:
            with torch.no_grad():
                entropies.append(-(logsm.exp() * logsm).sum(-1))
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def fused_logps(hidden, weight, targets, temperature, chunk, scale=1.0, softcap=None, with_entropy=True, support=None):
    """(log p_y [N], entropy [N] or None) of f(hidden·weightᵀ)/τ without [N, V] logits: TRL's Triton
    kernels on CUDA when trl is installed (the `kernels` extra), else ChunkedLogSoftmax, which alone takes the
    sampler's packed kept sets `support` [N, ceil(V/8)] (TRL's kernels sum over the whole vocabulary)."""
    if hidden.is_cuda and triton_kernels_available() and support is None:
        return triton_logps(hidden, weight, targets, temperature, chunk, scale, softcap, with_entropy)
    jacobian = torch.is_grad_enabled() and hidden.requires_grad
    return ChunkedLogSoftmax.apply(
        hidden, weight, targets, temperature, chunk, scale, softcap, jacobian, with_entropy, COLUMNS, support
    )


def triton_kernels_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("trl") is not None and importlib.util.find_spec("triton") is not None


def triton_logps(hidden, weight, targets, temperature, chunk, scale=1.0, softcap=None, with_entropy=True):
    """fused_logps through TRL 1.16's `trl.kernels.ChunkedLogProbFunction`: cuBLAS [n, v] tiles of h·Wᵀ
    (n ≤ its TOKEN_CHUNK_SIZE tokens, v vocabulary columns) folded into online-logsumexp statistics by a
    Triton kernel, recomputed in backward; the same f (logit_scale, then soft cap) and temperature. v is
    chosen so a tile holds at most `chunk`·V logits, the memory model.logits_chunk promises (docs/vram.md).
    Its entropy is differentiable; ours is a metric, so it is detached."""
    from trl.kernels import chunked_logprob

    rows, vocab = min(hidden.shape[0], chunked_logprob.TOKEN_CHUNK_SIZE), weight.shape[0]
    columns = max(1, min(vocab, chunk * vocab // max(rows, 1)))
    logps, entropy, *_ = chunked_logprob.ChunkedLogProbFunction.apply(
        hidden, weight, None, targets, temperature, columns, softcap, scale, ("entropy",) if with_entropy else ()
    )
    return logps, (entropy.detach() if with_entropy else None)


def head_transform(model) -> tuple[float, float | None]:
    """(scale, softcap): the model's forward turns h·Wᵀ into softcap·tanh(scale·h·Wᵀ / softcap)
    (softcap None: scale·h·Wᵀ). Cohere multiplies by logit_scale, Granite divides by logits_scaling,
    Gemma-2/3 soft-cap with final_logit_softcapping."""
    cfg = model.config.get_text_config()
    scale = float(getattr(cfg, "logit_scale", None) or 1.0) / float(getattr(cfg, "logits_scaling", None) or 1.0)
    softcap = getattr(cfg, "final_logit_softcapping", None)
    return scale, (float(softcap) if softcap else None)


@torch.no_grad()
def _check_head_transform(model, ids, attention, hidden_row, scored, weight, scale, softcap, logits_chunk) -> None:
    """Once per model: the logits from the final hidden states (the chunked path, `logits_chunk` > 0, or the
    shared-prefix pass) of one row's scored positions must equal the model's own, else the model transforms its
    logits in a way these paths do not know (refused in one line, naming the key that chose the path). A model
    whose own logits are not finite (weights gone NaN) says nothing of its transform: checked on a later call."""
    if getattr(model, "_grpo_head_checked", False) or not bool(scored.any()):  # no position to compare: later
        return
    from ...contract.errors import UserError

    T = hidden_row.shape[0]
    own = model(
        input_ids=ids,
        attention_mask=attention,
        position_ids=position_ids(attention),
        logits_to_keep=T + 1,
        use_cache=False,
    ).logits[0, :-1][scored]
    if not bool(torch.isfinite(own).all()):  # the step's own non-finite handling reports this (bad steps)
        return
    # a wrong transform is off by its scale; rounding is off by the logits' dtype (bf16: 2^-7 relative)
    tol = max(1e-3, 2 * torch.finfo(own.dtype).eps)
    own = own.float()
    ours = _final_logits(torch.nn.functional.linear(hidden_row[scored], weight).float(), scale, softcap)
    if not torch.allclose(ours, own, rtol=tol, atol=tol * max(1.0, own.abs().max().item())):
        name = type(model).__name__
        if logits_chunk:
            why = (
                f"{name} transforms its logits in a way the chunked path does not reproduce; set model.logits_chunk = 0"
            )
            raise UserError(why, key="model.logits_chunk", value=logits_chunk)
        why = f"{name} transforms its logits in a way the shared-prefix pass does not reproduce; set train.shared_prefix = off"
        raise UserError(why, key="train.shared_prefix")
    model._grpo_head_checked = True


def _final_logits(raw: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    z = raw * scale if scale != 1.0 else raw
    return softcap * torch.tanh(z / softcap) if softcap else z
