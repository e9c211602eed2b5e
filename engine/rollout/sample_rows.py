"""samples.jsonl rows of one rollout: the prompt as rendered, the completion, each reward, the advantage and
the group, and which completion tokens the loss trains. `tokens` counts the completion's tokens (EOS
included), `trained` how many of them are in the loss, `truncated` whether it ran to max_completion_len;
when only part of a completion is trained (tokens left out as too stale, train.max_staleness), `masked`
lists the character spans [start, end) of the text that were left out. An episode's row also holds its
turns: each model turn (trained) and environment message (masked), and why it ended. The loss's own
IS-ratio masking (algo.is_mode = mask) is per step and shows in mismatch/masked_frac, not here."""

from __future__ import annotations

import math


def masked_spans(ids: list[int], trained: list[bool], decode) -> list[list[int]]:
    """Character spans of the decoded text covered by each run of untrained tokens."""
    spans, i = [], 0
    while i < len(ids):
        if trained[i]:
            i += 1
            continue
        j = i
        while j < len(ids) and not trained[j]:
            j += 1
        spans.append([len(decode(ids[:i])), len(decode(ids[:j]))])
        i = j
    return spans


def rows(prompts, texts, table, advantages, names, group_size, out, mask, decode, episodes=None) -> list[dict]:
    """One row per completion, less its step (the step that writes them). `out`: the Rollout (completion ids,
    its token mask, truncation); `mask`: the loss mask of the same tokens; `decode`: ids -> text as the
    completion was decoded."""
    valid, loss = out.mask.bool(), (mask.cpu() > 0) & out.mask.bool()
    result = []
    for i, (p, c, scores, a) in enumerate(zip(prompts, texts, table, advantages.tolist())):
        row = {
            "prompt": p,
            "completion": c,
            "advantage": a,
            "group": i // group_size,
            "rewards": {n: (None if math.isnan(v) else v) for n, v in zip(names, scores)},
            "tokens": int(valid[i].sum()),
            "trained": int(loss[i].sum()),
            "truncated": bool(out.truncated[i]),
        }
        if episodes is None and 0 < row["trained"] < row["tokens"]:
            n = row["tokens"]
            ids = out.completion_ids[i, :n].tolist()
            row["masked"] = masked_spans(ids, loss[i, :n].tolist(), decode)
        result.append(row)
    for row, episode in zip(result, episodes or []):
        row["episode"] = {"turns": episode.segments, "stop": episode.stop, "why": episode.why}
    return result
