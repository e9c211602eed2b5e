"""DAPO's dynamic sampling (arXiv 2503.14476 §3.2, algo.dynamic_sampling): a group whose rewards are all
equal has advantage 0 and no gradient, so a rollout is sampled in rounds of its usual prompts until it holds
that many groups with reward signal. The first that many, in sampling order, are kept (verl's filter_groups
truncates the same way); the rest are dropped, their prompts consumed. Where algo.dynamic_sampling_max_rounds
runs out first, the first dropped groups fill the rollout to its shape and a warning event says so (verl
raises instead). Also the one sampled, scored round every rollout is built from (Scored)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ..sampler.base import Rollout
from .advantages import ZERO_STD, nanstd, weighted_totals


@dataclasses.dataclass
class Scored:
    """One sampled round of a rollout, scored: what Rollouts.next builds its GenerationBatch from."""

    request: dict  # rows, prompts, prompt_ids, step, version (engine/rollout/rollouts.py _request)
    out: Rollout
    waited: float  # seconds the trainer waited for the completions
    texts: list[str]  # the texts scored, one per completion
    table: list[list[float]]  # rewards [completion][function]
    per_prompt: int  # completions per entry of request["prompts"] / ["prompt_ids"]: G, or 1 for episodes


def signal(table: list[list[float]], weights: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per group, whether its weighted rewards differ (a std above reward/frac_zero_std's zero): DAPO's
    0 < |{o_i | is_equivalent(a, o_i)}| < G, for any reward."""
    totals = weighted_totals(torch.tensor(table, dtype=torch.float32), weights)
    return nanstd(totals.view(-1, group_size), dim=1) > ZERO_STD  # NaN (< 2 scored completions): no signal


def fill(
    sample: Callable[[int], Scored], weights, group_size: int, max_rounds: int, pad_id: int, dist, warn
) -> tuple[Scored, dict]:
    """Rounds `sample(round_no)` until the groups with signal fill one round's prompts, or max_rounds; every rank
    samples as many rounds (the prompt stream stays one). The rollout, and its sampling/* metrics."""
    rounds = [sample(0)]
    need = len(rounds[0].request["rows"])  # this rank's prompts of one rollout
    kept = signal(rounds[0].table, weights, group_size).nonzero().flatten().tolist()  # numbered across rounds
    while len(rounds) < max_rounds and dist.any(len(kept) < need):
        rounds.append(sample(len(rounds)))
        found = signal(rounds[-1].table, weights, group_size).nonzero().flatten()
        kept += (found + (len(rounds) - 1) * need).tolist()
    joined = _join(rounds, pad_id)
    chosen = kept[:need]
    if len(chosen) < need:  # out of rounds: the first groups without signal keep the rollout's shape
        flat = set(kept)
        chosen += [g for g in range(len(rounds) * need) if g not in flat][: need - len(chosen)]
        warn(
            f"algo.dynamic_sampling: {len(kept)} of {need} groups with reward signal after "
            f"algo.dynamic_sampling_max_rounds = {max_rounds} rounds; {need - len(kept)} groups whose rewards "
            f"are all equal (advantage 0) fill the rollout"
        )
    metrics = {
        "sampling/groups_kept": float(min(len(kept), need)),
        "sampling/groups_dropped": float((len(rounds) - 1) * need),
        "sampling/rounds": float(len(rounds)),
        # every round's completions over every round's sampling time
        "perf/rollout_tok_s": joined.out.mask.sum().item() / max(joined.out.seconds, 1e-9),
    }
    return _pick(joined, sorted(chosen), group_size), metrics


def _join(rounds: list[Scored], pad_id: int) -> Scored:
    """The rounds as one, their completions right-padded to the widest (rollout.async_mode off: one policy
    version, no per-token versions)."""
    outs = [s.out for s in rounds]
    width = max(o.completion_ids.shape[1] for o in outs)

    def cat(name: str, value) -> torch.Tensor:
        parts = [getattr(o, name) for o in outs]
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=value) for p in parts])

    out = dataclasses.replace(
        outs[0],
        completion_ids=cat("completion_ids", pad_id),
        mask=cat("mask", 0.0),
        logprobs=cat("logprobs", 0.0),
        truncated=torch.cat([o.truncated for o in outs]),
        seconds=sum(o.seconds for o in outs),
        support=None
        if outs[0].support is None  # the kept sets of the padding columns: every token (Rollout.support)
        else torch.cat(
            [torch.nn.functional.pad(o.support, (0, 0, 0, width - o.support.shape[1]), value=255) for o in outs]
        ),
    )
    request = {**rounds[0].request}
    for key in ("rows", "prompts", "prompt_ids"):
        request[key] = [item for s in rounds for item in s.request[key]]
    return Scored(
        request,
        out,
        sum(s.waited for s in rounds),
        [t for s in rounds for t in s.texts],
        [row for s in rounds for row in s.table],
        rounds[0].per_prompt,
    )


def _pick(s: Scored, groups: list[int], group_size: int) -> Scored:
    """Scored `s` cut to `groups` (prompts), each with its group_size completions, trimmed to their widest."""
    rows = torch.tensor([g * group_size + j for g in groups for j in range(group_size)], dtype=torch.long)
    width = int(s.out.mask[rows].sum(1).max())
    out = dataclasses.replace(
        s.out,
        completion_ids=s.out.completion_ids[rows, :width],
        mask=s.out.mask[rows, :width],
        logprobs=s.out.logprobs[rows, :width],
        truncated=s.out.truncated[rows],
        support=None if s.out.support is None else s.out.support[rows, :width],
    )
    request = {**s.request}
    for key in ("rows", "prompts", "prompt_ids"):
        request[key] = [request[key][g] for g in groups]
    return Scored(
        request, out, s.waited, [s.texts[i] for i in rows.tolist()], [s.table[i] for i in rows.tolist()], s.per_prompt
    )
