"""The Perf tab's time split and the Hardware tab's per-rank rows, from the metrics a run wrote
(each shown only where the run has it)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ...contract import metrics
from ...contract.metrics import fmt
from ..rundata import RunData
from .metric_chart import percent

MFU = "perf/mfu"
WAIT, SYNC, IDLE = "perf/trainer_wait_s", "perf/sync_s", "perf/idle_s"
# The step's wall time in parts that add up to it (contract/metrics.py): waiting for the rollout, training
# (π_old, log-probs, loss, backward, AdamW: the step less the other three), the weight sync, and the rest
# (rewards, advantages, metrics: perf/idle_s). None: the derived training part.
SPLIT = [("wait for rollout", WAIT), ("train (derived)", None), ("weight sync", SYNC), ("other", IDLE)]
# The derived part's formula, under the table: it is not the file's perf/train_s (the step less its rollout,
# which the step-time chart plots as step−rollout).
DERIVED = "train (derived) = step − wait − sync − other (π_old, log-probs, loss, backward, AdamW)"
RANK = re.compile(r"^(?:perf|mem)/rank(\d+)/")
R = metrics.RANK
RANK_COLUMNS = {f"perf/rank{R}/step_s": "step s", f"perf/rank{R}/comm_s": "comm s", f"mem/rank{R}/peak_gib": "peak GiB"}


@dataclass(frozen=True)
class SplitRow:
    phase: str
    last: float | None
    mean: float | None
    share: float | None  # of the mean step time


def mean(run: RunData, key: str) -> float | None:
    ys = run.series(key)[1]
    return sum(ys) / len(ys) if ys else None


def time_split(run: RunData) -> list[SplitRow]:
    """Last step and run mean of each part of the step (SPLIT), with its share of the mean step time; nothing
    for a run that does not report all of them (runs before perf/idle_s)."""
    keys = (metrics.STEP_S, WAIT, SYNC, IDLE)
    if not all(run.series(key)[1] for key in keys):
        return []
    last = {key: run.last(key) for key in keys}
    avg = {key: mean(run, key) for key in keys}

    def part(values: dict, key: str | None) -> float:
        return values[key] if key else values[metrics.STEP_S] - values[WAIT] - values[SYNC] - values[IDLE]

    step = avg[metrics.STEP_S]
    return [
        SplitRow(phase, part(last, key), part(avg, key), part(avg, key) / step if step else None)
        for phase, key in SPLIT
    ]


def whole_percents(shares: list[float]) -> list[int]:
    """Shares as whole percents that add up to the rounded percent of their sum (100 for a split of the
    step), by the largest-remainder method: each share's floor, then one more point to the largest
    remainders (the earlier share first on a tie). Rounding each alone reads 99% or 101%."""
    scaled = [round(100 * s, 9) for s in shares]  # 0.29 * 100 is 28.999…: its floor is 29
    out = [math.floor(x) for x in scaled]
    by_remainder = sorted(range(len(scaled)), key=lambda i: out[i] - scaled[i])
    for i in by_remainder[: round(sum(scaled)) - sum(out)]:
        out[i] += 1
    return out


def split_table(run: RunData) -> Group | None:
    """The split as a table, then the derived part's formula and the sampling time, each a line of the box's
    width (a table caption would wrap at the table's)."""
    rows = time_split(run)
    if not rows:
        return None
    sampling, hidden = mean(run, "perf/rollout_s"), run.last("perf/overlap_frac")
    caption = DERIVED + (
        ""
        if sampling is None
        else f"\nsampling {fmt(sampling)} s per step"
        + (f"; {percent(hidden)} of the last rollout's sampling hidden behind training" if hidden else "")
    )
    table = Table(box=None, header_style="bold", padding=(0, 1))
    for name, justify in (("part of step", "left"), ("last s", "right"), ("mean s", "right"), ("of step", "right")):
        table.add_column(name, justify=justify)
    shares = ["–"] * len(rows) if rows[0].share is None else [f"{p}%" for p in whole_percents([r.share for r in rows])]
    for r, share in zip(rows, shares):
        table.add_row(r.phase, fmt(r.last), fmt(r.mean), share)
    mfu = run.last(MFU)
    table.add_row(
        "step",
        fmt(run.last(metrics.STEP_S)),
        fmt(mean(run, metrics.STEP_S)),
        "" if mfu is None else f"MFU {percent(mfu)}" + (" (peak stale)" if mfu > 1 else ""),
        style="bold",
    )
    return Group(table, Text(caption, style="dim"))  # wrapped at the box's width: no word cut


def rank_values(run: RunData) -> dict[int, dict[str, float | None]]:
    """{rank: {schema pattern ("perf/rank<i>/step_s"): last value}} for every per-rank column of the run
    (contract/metrics.py PER_RANK)."""
    out: dict[int, dict[str, float | None]] = {}
    for key in run.columns:
        m, known = RANK.match(key), metrics.lookup(key)
        if m and known:
            out.setdefault(int(m.group(1)), {})[known.name] = run.last(key)
    return dict(sorted(out.items()))


def rank_table(run: RunData) -> Table | None:
    ranks = rank_values(run)
    if not ranks:
        return None
    table = Table(box=None, header_style="bold", padding=(0, 1))
    table.add_column("rank")
    for label in RANK_COLUMNS.values():
        table.add_column(label, justify="right")
    for rank, values in ranks.items():
        table.add_row(f"rank {rank}", *[fmt(values.get(pattern)) for pattern in RANK_COLUMNS])
    return table
