"""Per-token log-probs π under the training model.

The forward keeps only the completion positions (`logits_to_keep`), and the fp32
log-softmax runs over row chunks. Under no_grad that bounds the fp32 temporaries to
`chunk_rows`×T×V; with autograd each chunk's log-softmax is saved for backward, so the
training peak still holds B×T×V fp32 values (the VRAM planner's logits row models this).
Log-probs use the same temperature as the sampler (TRL issue 4159: comparing μ at T with π at
T=1 makes the mismatch metric and the IS weights meaningless).
"""

from __future__ import annotations

import torch


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generate() uses them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int,
                   temperature: float = 1.0, chunk_rows: int = 8, with_entropy: bool = False):
    """Return (logps [B, T], entropy [B, T] or None) for the last `completion_len` tokens."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                logits_to_keep=completion_len + 1, use_cache=False)
    logits = out.logits[:, :-1, :]                       # position t predicts token t+1
    targets = input_ids[:, -completion_len:]
    logps, entropies = [], []
    for rows in range(0, logits.shape[0], chunk_rows):
        chunk = logits[rows:rows + chunk_rows].float() / temperature
        logsm = torch.log_softmax(chunk, dim=-1)
        logps.append(logsm.gather(-1, targets[rows:rows + chunk_rows].unsqueeze(-1)).squeeze(-1))
        if with_entropy:
            with torch.no_grad():
                entropies.append(-(logsm.exp() * logsm).sum(-1))
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)
