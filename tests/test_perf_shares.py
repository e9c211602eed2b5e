"""Shares shown as whole percents add up to 100 (largest remainder), on hand cases: the Perf tab's split of the
step and the Mismatch tab's tokens by lag."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from rich.console import Console

from grpo_studio.studio import lag
from grpo_studio.studio.rundata import RunData
from grpo_studio.studio.widgets.perf_tables import split_table, whole_percents


@pytest.mark.parametrize(
    ("shares", "percents"),
    [
        ([1 / 3, 1 / 3, 1 / 3], [34, 33, 33]),  # each alone: 33 + 33 + 33 = 99
        ([1 / 6, 1 / 6, 2 / 3], [17, 17, 66]),  # each alone: 17 + 17 + 67 = 101; floors 16, 16, 66, two to go
        ([0.125, 0.125, 0.375, 0.375], [13, 13, 37, 37]),  # all remainders .5: the earlier first
        ([0.185, 0.705, 0.105, 0.005], [19, 71, 10, 0]),  # each alone: 18 + 70 + 10 + 0 = 98; halves: first two
        ([0.29, 0.71], [29, 71]),  # 100 · 0.29 = 28.999…96 in binary: still 29
        ([0.5, 0.5, 0.0], [50, 50, 0]),
        ([1.0], [100]),
    ],
)
def test_largest_remainder_by_hand(shares, percents):
    assert sum(shares) == pytest.approx(1.0)
    assert whole_percents(shares) == percents


def test_random_splits_add_up_to_100_and_each_is_within_a_point():
    rng = random.Random(0)
    for _ in range(2000):
        raw = [rng.random() ** 3 for _ in range(rng.randint(2, 6))]
        shares = [r / sum(raw) for r in raw]
        got = whole_percents(shares)
        assert sum(got) == 100
        assert all(abs(p - 100 * s) < 1 for p, s in zip(got, shares))


def test_perf_table_shares_add_up_to_100():
    """A step of 3 s: 1 s waiting for the rollout, 1 s weight sync, nothing else, so training is 1 s: thirds."""
    run = RunData(Path("/nonexistent"))
    run.add_metrics(
        [{"step": 1, "perf/step_s": 3.0, "perf/trainer_wait_s": 1.0, "perf/sync_s": 1.0, "perf/idle_s": 0.0}]
    )
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(split_table(run))
    lines = console.export_text().splitlines()[1:6]  # the table's parts, under its header
    rows = {line.split()[0]: line.split()[-1] for line in lines}
    assert [rows["wait"], rows["train"], rows["weight"], rows["other"]] == ["34%", "33%", "33%", "0%"]


def test_tokens_by_lag_add_up_to_100():
    assert lag.lag_shares({"lag": {"0": 1, "1": 1, "2": 1}}) == "tokens by lag 0: 34% · 1: 33% · 2: 33%"
