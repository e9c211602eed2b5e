"""contract/samples_index.py against the file itself: every row read back by its offset, the filters by hand,
an index grown by appends (a torn last line included) equal to one built fresh, restarts on a rewrite, truncation
or a FIFO put in its place, a 10 MB line; and the studio's Samples tab paging to the file's first row of 1,536 and
finding by search a string only in row 3 (in its worker thread)."""

from __future__ import annotations

import json
import os
import random

import pytest

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.benchmarks.ui_bench import sample_row
from grpo_studio.contract import diagnosis, rundir
from grpo_studio.contract.samples_index import SamplesIndex, group_key
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.widgets.samples_panel import PAGE
from tests.studio_helpers import anyio_backend, visible_text, wait_until  # noqa: F401

STEPS, PER_STEP = 12, 128  # 1,536 rows: a 12-step run of 16 prompts x 8 completions


def rows(steps: int = STEPS) -> list[dict]:
    rng = random.Random(0)
    out = [sample_row(step, i, 8, rng) for step in range(1, steps + 1) for i in range(PER_STEP)]
    for row in out[::16]:  # some groups with no signal: every advantage 0
        row["advantage"] = 0.0
    for row in out:
        if row["group"] % 2 == 0 and row["step"] % 3 == 0:
            row["advantage"] = 0.0
    return out


def lines(items: list[dict]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in items)


def built(path) -> SamplesIndex:
    index = SamplesIndex(path)
    while index.update() or index.pending:
        pass
    return index


def state(index: SamplesIndex) -> tuple:
    return tuple(
        list(a) for a in (index.offsets, index.lengths, index.steps, index.advantages, index.flags, index.group_ids)
    ) + (index.offset, index.skipped)


def test_every_row_comes_back_by_its_offset_and_the_filters_match_a_hand_count(tmp_path):
    want = rows()
    path = tmp_path / rundir.SAMPLES
    path.write_bytes(lines(want))
    index = built(path)
    assert len(index) == 1536 and index.step_range() == (1, 12)
    assert index.rows(range(len(index))) == want
    assert list(index.order("all"))[-1] == 0 and index.rows([index.order("all")[-1]]) == [want[0]]
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(want):
        groups.setdefault(group_key(row), []).append(i)
    flat = sorted(i for ids in groups.values() if diagnosis.no_signal([want[i] for i in ids]) for i in ids)
    assert flat and sorted(index.order("zero-variance")) == flat  # the doctor's test, group by group
    assert sorted(index.order("truncated")) == [i for i, r in enumerate(want) if r["truncated"]]
    best = index.order("best")
    assert want[best[0]]["advantage"] == max(r["advantage"] for r in want)
    assert index.group(100) == groups[group_key(want[100])]


def test_an_index_grown_by_appends_equals_one_built_fresh(tmp_path):
    data = lines(rows(3))
    path = tmp_path / rundir.SAMPLES
    grown = SamplesIndex(path, poll_bytes=4096)
    cuts = sorted(random.Random(1).sample(range(1, len(data)), 40)) + [len(data)]  # mid-line cuts: torn lines
    at = 0
    with open(path, "wb") as fh:
        for cut in cuts:
            fh.write(data[at:cut])
            fh.flush()
            at = cut
            grown.update()
            assert len(grown) == data[:cut].count(b"\n") or grown.pending  # a torn last line waits
    while grown.update() or grown.pending:
        pass
    assert state(grown) == state(built(path)) and grown.generation == 0


def test_a_rewritten_truncated_or_replaced_file_starts_the_index_over(tmp_path):
    path = tmp_path / rundir.SAMPLES
    path.write_bytes(lines(rows(2)))
    index = built(path)
    assert len(index) == 256
    first = lines(rows(1))
    with open(path, "r+b") as fh:  # truncated underneath (a resume cut it back to step 1)
        fh.truncate(len(first))
    index.update()
    assert index.restarted and index.generation == 1 and len(index) == 128
    other = lines([dict(r, completion="other") for r in rows(2)])
    path.write_bytes(other)  # rewritten in place, longer than before: the byte before the offset is no line end
    while index.update() or index.pending:
        pass
    assert index.generation == 2 and index.rows([0])[0]["completion"] == "other" and len(index) == 256
    path.unlink()
    os.mkfifo(path)  # a FIFO in its place: never opened, nothing of the old file kept
    index.update()
    assert len(index) == 0 and index.generation == 3 and index.rows([0]) == [None]
    assert index.warnings and "FIFO" in index.warnings[-1]


def test_a_10_mb_line_is_indexed_read_and_searched_whole(tmp_path):
    big = dict(rows(1)[0], completion="x" * (10 << 20) + "needle-at-the-end")
    path = tmp_path / rundir.SAMPLES
    path.write_bytes(lines([big, *rows(1)[1:3]]) + b"\x00\xff garbage\n" + lines(rows(1)[3:4]))
    index = built(path)
    assert len(index) == 4 and index.skipped == 1
    assert index.search("NEEDLE-AT-THE-END") == ([0], False)
    assert index.rows([0])[0]["completion"].endswith("needle-at-the-end")


def flat(widget) -> str:
    """The widget's text as one line (it wraps at 80 columns)."""
    return " ".join(visible_text(widget).split())


def run_with_samples(tmp_path) -> tuple:
    run_dir = write_run(tmp_path / "run", STEPS)
    want = rows()
    want[2] = dict(want[2], completion=want[2]["completion"] + " only-in-row-three")
    (run_dir / rundir.SAMPLES).write_bytes(lines(want))
    return run_dir, want


@pytest.mark.anyio
async def test_the_samples_tab_pages_to_the_first_row_of_1536(tmp_path):
    run_dir, want = run_with_samples(tmp_path)
    app = StudioApp(live_hardware=False)
    async with app.run_test(size=(80, 24)) as pilot:
        app.open_run(run_dir)
        await pilot.pause()
        await pilot.press("8")  # Samples
        panel = app.screen.query_one("#samples-panel")
        line = app.screen.query_one("#samples-filter")
        await wait_until(pilot, lambda: "of 1,536" in visible_text(line))
        assert panel.rows[0] == want[-1]  # newest first
        assert "all: 1–100 of 1,536 · 1,536 rows, steps 1–12 — a all" in flat(line)
        for _ in range(1536 // PAGE):
            await pilot.press("right_square_bracket")
        await pilot.pause()
        assert panel.rows[-1] == want[0] and panel.rows == want[: 1536 % PAGE][::-1]
        assert "all: 1,501–1,536 of 1,536" in flat(line)
        await pilot.press("right_square_bracket")  # past the end: stays on the last page
        await pilot.pause()
        assert panel.rows[-1] == want[0]
        await pilot.press("left_square_bracket")
        await pilot.pause()
        assert panel.rows[0] == want[-1 - 1400] and "all: 1,401–1,500 of" in flat(line)


@pytest.mark.anyio
async def test_search_covers_the_whole_file_in_a_worker(tmp_path):
    run_dir, want = run_with_samples(tmp_path)
    app = StudioApp(live_hardware=False)
    async with app.run_test(size=(80, 24)) as pilot:
        app.open_run(run_dir)
        await pilot.pause()
        await pilot.press("8")
        panel = app.screen.query_one("#samples-panel")
        line = app.screen.query_one("#samples-filter")
        await wait_until(pilot, lambda: "of 1,536" in visible_text(line))
        await pilot.press("slash", *"ONLY-IN-ROW-THREE", "enter")
        await wait_until(pilot, lambda: "matching" in visible_text(line))
        assert panel.rows == [want[2]] and "all: 1–1 of 1 matching 'ONLY-IN-ROW-THREE' · 1,536 rows" in flat(line)
