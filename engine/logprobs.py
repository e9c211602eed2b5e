"""Per-token log-probs π under the training model, two ways with the same numerics.

materialised (model.logits_chunk = 0): the forward keeps only the completion positions
    (`logits_to_keep`) and the fp32 log-softmax runs over row chunks; autograd saves each
    chunk's log-softmax, so training holds B×T×V fp32 values at its peak.
chunked (model.logits_chunk = N > 0): the lm_head and log-softmax run N tokens at a time
    inside one autograd Function that saves only the final hidden states and recomputes each
    chunk's logits in backward (the memory-efficient path of Unsloth's GRPO, cf. Liger's fused
    linear cross-entropy): at most N×V logits exist at once, forward or backward. It applies the
    final-logit transforms that the model's own forward applies after its lm_head: Cohere's
    `logit_scale` (×), Granite's `logits_scaling` (÷) and Gemma-2/3's `final_logit_softcapping`
    (c·tanh(z/c)); the first call on a model checks one row against the model's own logits.

Log-probs use the same temperature as the sampler (TRL issue 4159: comparing μ at T with π at
T=1 makes the mismatch metric and the IS weights meaningless).
"""

from __future__ import annotations

import torch


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generate() uses them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int,
                   temperature: float = 1.0, chunk_rows: int = 8, with_entropy: bool = False,
                   logits_chunk: int = 0):
    """Return (logps [B, T], entropy [B, T] or None) for the last `completion_len` tokens."""
    targets = input_ids[:, -completion_len:]
    if logits_chunk > 0:
        return _chunked(model, input_ids, attention_mask, targets, temperature, logits_chunk, with_entropy)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                logits_to_keep=completion_len + 1, use_cache=False)
    logits = out.logits[:, :-1, :]                       # position t predicts token t+1
    logps, entropies = [], []
    for rows in range(0, logits.shape[0], chunk_rows):
        chunk = logits[rows:rows + chunk_rows].float() / temperature
        logsm = torch.log_softmax(chunk, dim=-1)
        logps.append(logsm.gather(-1, targets[rows:rows + chunk_rows].unsqueeze(-1)).squeeze(-1))
        if with_entropy:
            with torch.no_grad():
                entropies.append(-(logsm.exp() * logsm).sum(-1))
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def _chunked(model, input_ids, attention_mask, targets, temperature, chunk, with_entropy):
    B, T = targets.shape
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids(attention_mask), use_cache=False).last_hidden_state
    hidden = hidden[:, -(T + 1):-1, :].reshape(B * T, -1)      # position t predicts token t+1
    head = model.get_output_embeddings()
    scale, softcap = head_transform(model)
    _check_head_transform(model, input_ids[:1], attention_mask[:1], hidden[:T], head.weight, scale, softcap)
    logps, entropy = ChunkedLogSoftmax.apply(hidden, head.weight, targets.reshape(-1), temperature, chunk,
                                             scale, softcap)
    return logps.view(B, T), (entropy.view(B, T) if with_entropy else None)


def head_transform(model) -> tuple[float, float | None]:
    """(scale, softcap): the model's forward turns h·Wᵀ into softcap·tanh(scale·h·Wᵀ / softcap)
    (softcap None: scale·h·Wᵀ). Cohere multiplies by logit_scale, Granite divides by logits_scaling,
    Gemma-2/3 soft-cap with final_logit_softcapping."""
    cfg = model.config.get_text_config()
    scale = float(getattr(cfg, "logit_scale", None) or 1.0) / float(getattr(cfg, "logits_scaling", None) or 1.0)
    softcap = getattr(cfg, "final_logit_softcapping", None)
    return scale, (float(softcap) if softcap else None)


@torch.no_grad()
def _check_head_transform(model, ids, attention, hidden_row, weight, scale, softcap) -> None:
    """Once per model: the chunked logits of one row must equal the model's own, else the model
    transforms its logits in a way this path does not know (refused in one line)."""
    if getattr(model, "_grpo_head_checked", False):
        return
    from grpo_studio.engine.contract.errors import UserError

    T = hidden_row.shape[0]
    own = model(input_ids=ids, attention_mask=attention, position_ids=position_ids(attention),
                logits_to_keep=T + 1, use_cache=False).logits[0, :-1].float()
    ours = _final_logits(torch.nn.functional.linear(hidden_row, weight).float(), scale, softcap)
    if not torch.allclose(ours, own, rtol=1e-3, atol=1e-3 * max(1.0, own.abs().max().item())):
        raise UserError(f"{type(model).__name__} transforms its logits in a way the chunked path does not "
                        f"reproduce; set model.logits_chunk = 0", key="model.logits_chunk", value=T)
    model._grpo_head_checked = True


def _final_logits(raw: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    z = raw * scale if scale != 1.0 else raw
    return softcap * torch.tanh(z / softcap) if softcap else z


class ChunkedLogSoftmax(torch.autograd.Function):
    """log softmax(f(h·Wᵀ)/τ)[y] and its entropy, `chunk` rows of h at a time, recomputed in backward;
    f is the model's final-logit transform (scale, then an optional soft cap: head_transform)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, scale=1.0, softcap=None):
        logps = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(logps)
        for s in range(0, hidden.shape[0], chunk):
            raw = torch.nn.functional.linear(hidden[s:s + chunk], weight).float()
            logits = _final_logits(raw, scale, softcap) / temperature
            lse = torch.logsumexp(logits, dim=-1)
            logps[s:s + chunk] = logits.gather(1, targets[s:s + chunk, None]).squeeze(1) - lse
            entropy[s:s + chunk] = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)  # H = lse − E_p[z]
        ctx.save_for_backward(hidden, weight, targets)
        ctx.temperature, ctx.chunk, ctx.scale, ctx.softcap = temperature, chunk, scale, softcap
        ctx.mark_non_differentiable(entropy)
        return logps, entropy

    @staticmethod
    def backward(ctx, grad_logps, _grad_entropy):
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            h = hidden[s:s + ctx.chunk]
            raw = torch.nn.functional.linear(h, weight).float()
            capped = _final_logits(raw, ctx.scale, ctx.softcap)
            # d log p_y / d z = onehot(y) − softmax(z), times the incoming grad, through z = f(h·Wᵀ)/τ
            dz = -torch.softmax(capped / ctx.temperature, dim=-1) * grad_logps[s:s + ctx.chunk, None]
            dz.scatter_add_(1, targets[s:s + ctx.chunk, None], grad_logps[s:s + ctx.chunk, None])
            dz = dz * (ctx.scale / ctx.temperature)
            if ctx.softcap:  # d/du c·tanh(u/c) = 1 − tanh²(u/c) = 1 − (f/c)²
                dz = dz * (1 - (capped / ctx.softcap) ** 2)
            if grad_hidden is not None:
                grad_hidden[s:s + ctx.chunk] = (dz @ weight.float()).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += dz.t() @ h.float()
        return grad_hidden, (grad_weight.to(weight.dtype) if grad_weight is not None else None), None, None, None, None, None
