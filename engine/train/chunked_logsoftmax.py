"""ChunkedLogSoftmax: log softmax(f(h·Wᵀ)/τ)[y] and its entropy, with their gradients, without [N, V] logits
(engine/train/logprobs.py's chunked path, model.logits_chunk = N > 0, where TRL's Triton kernels are not used).

The lm_head and the log-softmax run in tiles of token rows × vocabulary columns (`tile_shape`: at most N·V
logits per tile) folded into an online log-sum-exp; the tile loop (`_forward_block`), its reused fp32 buffers
and the logit transform of one tile live here, the model-facing choice of path in engine/train/logprobs.py.
Given the sampler's kept sets, each tile's logits outside them are OUTSIDE: the sums run over the kept tokens.
"""

from __future__ import annotations

import torch

from ..sampler.base import unpack_support

# A logit outside the sampler's kept set: finite, so e^{z−m} is exactly 0 and 0·z stays 0 in the entropy's and
# the Jacobian's sums (−inf would make them NaN), and a row's first kept logit resets any running max it set.
OUTSIDE = -1e30
COLUMNS = 8192  # vocabulary columns per tile: measured fastest of 2048-8192 at 512 × 151,936 on a 2-core CPU


def tile_shape(tokens: int, vocab: int, chunk: int, columns: int = COLUMNS) -> tuple[int, int]:
    """(rows, columns) of the logit tiles of a `chunk` budget: at most chunk·V logits per tile (what
    model.logits_chunk promises), as many token rows as fit next to `columns` vocabulary columns."""
    cols = min(vocab, columns)
    return max(1, min(tokens, chunk * vocab // cols)), cols


class ChunkedLogSoftmax(torch.autograd.Function):
    """log softmax(f(h·Wᵀ)/τ)[y] and its entropy without [N, V] logits; f is the model's final-logit
    transform (scale s, then an optional soft cap c: engine/train/logprobs.py head_transform).

    Tiles of rows × columns logits (tile_shape): for each block of token rows the vocabulary is swept in
    column tiles, folding each into an online log-sum-exp (running max m, Σ e^{z−m}, rescaled when m
    grows; Milakov & Gimelshein 2018, as in FlashAttention, Liger's fused linear cross-entropy and TRL's
    `trl.kernels`), so each lm_head tile is read once per block while it is in cache.

    d log p_y / dh = (s/τ)·(f′_y·W_y − Σ_v p_v·f′_v·W_v) does not depend on the incoming gradient (one
    scalar per row), so a forward that will be differentiated folds Σ_v e^{z_v−m}·f′_v·W_v into the same
    online sum (one more matmul per tile, the one the materialised backward does) and the backward only
    scales it by the incoming gradient: nothing is recomputed for the hidden states. Without a soft cap
    the entropy comes from that sum too, Σ_v p_v·z_v = (s/τ)·h·Σ_v p_v·W_v. Only a trained lm_head (full
    fine-tune), whose gradient sums rows weighted by their incoming gradients, recomputes the tiles.

    `support` [N, ceil(V/8)] (the sampler's packed kept sets, or None): each tile's logits outside them are
    OUTSIDE, so the log-sum-exp, p, the entropy and both gradients are those of the renormalised kept set."""

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        targets,
        temperature,
        chunk,
        scale=1.0,
        softcap=None,
        jacobian=False,
        with_entropy=True,
        columns=COLUMNS,
        support=None,
    ):
        n, vocab = hidden.shape[0], weight.shape[0]
        rows, cols = tile_shape(n, vocab, chunk, columns)
        out = {
            "logps": hidden.new_empty(n, dtype=torch.float32),
            "lse": hidden.new_empty(n, dtype=torch.float32),
            "entropy": hidden.new_empty(n, dtype=torch.float32) if with_entropy else None,
            "dcap_y": hidden.new_empty(n, dtype=torch.float32) if softcap else None,
            "dlogp_dh": hidden.new_zeros(hidden.shape, dtype=torch.float32) if jacobian else None,
        }
        buffers = _TileBuffers(rows * cols, hidden.device, two=bool(softcap) or (with_entropy and not jacobian))
        for r in range(0, n, rows):
            block = {k: (v[r : r + rows] if v is not None else None) for k, v in out.items()}
            kept = None if support is None else support[r : r + rows]
            _forward_block(
                hidden[r : r + rows],
                weight,
                targets[r : r + rows],
                temperature,
                scale,
                softcap,
                cols,
                buffers,
                block,
                kept,
            )
        ctx.save_for_backward(hidden, weight, targets, out["dlogp_dh"], out["lse"], out["dcap_y"])
        ctx.temperature, ctx.scale, ctx.softcap, ctx.rows, ctx.cols = temperature, scale, softcap, rows, cols
        ctx.support = support
        if with_entropy:
            ctx.mark_non_differentiable(out["entropy"])
        return out["logps"], out["entropy"]

    @staticmethod
    def backward(ctx, grad_logps, _grad_entropy):
        hidden, weight, targets, dlogp_dh, lse, dcap_y = ctx.saved_tensors
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:  # dlogp_dh exists: fused_logps asks for it whenever hidden can get a grad
            grad_hidden = (grad_logps[:, None] * dlogp_dh).to(hidden.dtype)
        if ctx.needs_input_grad[1]:  # dL/dW_v = (s/τ)·Σ_rows g·(onehot(y) − p)_v·f′_v·h, tile by tile
            k = ctx.scale / ctx.temperature
            grad_weight = torch.zeros_like(weight, dtype=torch.float32)
            buffers = _TileBuffers(ctx.rows * ctx.cols, hidden.device, two=bool(ctx.softcap))
            for r in range(0, hidden.shape[0], ctx.rows):
                h, y = hidden[r : r + ctx.rows], targets[r : r + ctx.rows]
                hg = h.float() * grad_logps[r : r + ctx.rows, None]
                h, hk = _prescale(h, weight, ctx.temperature, ctx.scale, ctx.softcap)
                kept = None if ctx.support is None else ctx.support[r : r + ctx.rows]
                for v0 in range(0, weight.shape[0], ctx.cols):
                    w = weight[v0 : v0 + ctx.cols]
                    z, th = _logit_tile(h, hk, w, buffers, ctx.temperature, ctx.softcap)
                    _mask_outside(z, kept, v0)
                    p = z.sub_(lse[r : r + ctx.rows, None]).exp_()
                    if ctx.softcap:
                        p.mul_(th.mul_(th).neg_().add_(1))
                    grad_weight[v0 : v0 + w.shape[0]].addmm_(p.t(), hg, alpha=-k)
                dcap = dcap_y[r : r + ctx.rows, None] if ctx.softcap else 1.0
                grad_weight.index_add_(0, y, hg.mul_(dcap), alpha=k)  # the onehot(y) term
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None, None, None


def _mask_outside(z: torch.Tensor, kept: torch.Tensor | None, v0: int) -> None:
    """Set a tile's logits z [n, w] of vocabulary columns v0.. to OUTSIDE where the packed kept sets `kept`
    [n, ceil(V/8)] leave them out (None: all kept)."""
    if kept is None:
        return
    first, w = v0 // 8, z.shape[1]
    packed = kept[:, first : (v0 + w + 7) // 8]
    bits = unpack_support(packed, 8 * packed.shape[1])
    z.masked_fill_(~bits[:, v0 - 8 * first : v0 - 8 * first + w], OUTSIDE)


class _TileBuffers:
    """One or two flat fp32 buffers of a tile's size, reused by every tile (no allocation per tile)."""

    def __init__(self, size: int, device, two: bool):
        self.flat = [torch.empty(size, dtype=torch.float32, device=device) for _ in range(1 + two)]

    def views(self, rows: int, cols: int) -> list[torch.Tensor]:
        return [b[: rows * cols].view(rows, cols) for b in self.flat]


def _prescale(h, weight, temperature, scale, softcap) -> tuple[torch.Tensor, float]:
    """(h′, k′) with k′·h′·Wᵀ = k·h·Wᵀ, k = s/c with a soft cap, else s/τ: fp32 rows take k (one pass over
    h, none over the tiles), other dtypes keep their rows and the fp32 tile is scaled."""
    k = scale / (softcap or temperature)
    if h.dtype == weight.dtype == torch.float32:
        return (h * k if k != 1.0 else h), 1.0
    return h, k


def _logit_tile(h, k, w, buffers, temperature, softcap):
    """(z, th) of one tile in fp32 buffers, h and k from _prescale: z = f(s·h·wᵀ)/τ, the logits the softmax
    sees; th = tanh(s·h·wᵀ/c) with a soft cap (f = c·tanh(·/c)), in the second buffer, else None."""
    views = buffers.views(h.shape[0], w.shape[0])
    raw = views[1] if softcap else views[0]
    if h.dtype == w.dtype == torch.float32:
        torch.mm(h, w.t(), out=raw)
    else:
        raw.copy_(torch.nn.functional.linear(h, w))
    if k != 1.0:
        raw.mul_(k)
    if softcap:
        return torch.mul(raw.tanh_(), softcap / temperature, out=views[0]), raw
    return raw, None


def _forward_block(h, weight, y, temperature, scale, softcap, cols, buffers, out, kept=None):
    """One block of token rows: sweep the vocabulary in column tiles, folding each into the online
    log-sum-exp (m, Σe), the entropy's Σ e·z and the Jacobian's Σ e·f′·W (over the kept sets `kept`, where
    given); write `out`'s rows."""
    n, k_h = h.shape[0], scale / temperature
    h, k = _prescale(h, weight, temperature, scale, softcap)
    m = h.new_full((n,), -torch.inf, dtype=torch.float32)
    s, t, zy = (h.new_zeros(n, dtype=torch.float32) for _ in range(3))
    acc = out["dlogp_dh"]  # [n, H] fp32 zeros, or None
    entropy_from_acc = acc is not None and not softcap
    for v0 in range(0, weight.shape[0], cols):
        w = weight[v0 : v0 + cols]
        z, th = _logit_tile(h, k, w, buffers, temperature, softcap)
        _mask_outside(z, kept, v0)
        hit = ((y >= v0) & (y < v0 + w.shape[0])).nonzero().squeeze(1)  # rows whose target is in this tile
        if hit.numel():
            zy[hit] = z[hit, y[hit] - v0]
            if softcap:
                out["dcap_y"][hit] = 1 - th[hit, y[hit] - v0] ** 2
        tile_max = z.amax(1)
        if (tile_max > m).any():  # rescale the sums to the new running max
            new = torch.maximum(m, tile_max)
            alpha = torch.exp(m - new)
            s.mul_(alpha)
            t.mul_(alpha)
            if acc is not None:
                acc.mul_(alpha[:, None])
            m = new
        if out["entropy"] is not None and not entropy_from_acc and not softcap:
            e = torch.sub(z, m[:, None], out=buffers.views(n, w.shape[0])[1]).exp_()
            s.add_(e.sum(1))
            t.add_(e.mul_(z).sum(1))
            continue
        e = z.sub_(m[:, None]).exp_()  # softcap: z's buffer, th kept in the other
        s.add_(e.sum(1))
        if softcap and out["entropy"] is not None:
            t.add_(torch.bmm(e[:, None, :], th[:, :, None]).view(-1), alpha=softcap / temperature)  # no temporary
        if acc is not None:
            acc.addmm_(
                e.mul_(th.mul_(th).neg_().add_(1)) if softcap else e, w.float() if w.dtype != torch.float32 else w
            )
    lse = out["lse"].copy_(m + s.log())
    out["logps"].copy_(zy - lse)
    if out["entropy"] is not None:  # H = lse − Σ p·z
        mean_z = (torch.linalg.vecdot(h.float(), acc) / s).mul_(k) if entropy_from_acc else t / s
        out["entropy"].copy_(lse - mean_z)
    if acc is not None:  # dlogp/dh = (s/τ)·(f′_y·W_y − Σ p·f′·W)
        wy = weight[y].float()
        acc.div_(s[:, None]).sub_(wy * out["dcap_y"][:, None] if softcap else wy).mul_(-k_h)
