"""The Samples tab's data and view: samples.jsonl rows carry the group, token counts and which tokens were
trained (engine/rollout/sample_rows.py, checked on real runs of the bundled model against hand counts), the filters
and search by hand, and the real app showing a truncated, masked completion behind the masked gutter."""

from __future__ import annotations

import json

import pytest

from grpo_studio.contract import config as cfgmod
from grpo_studio.contract import rundir
from grpo_studio.contract.samples_index import SamplesIndex, group_key
from grpo_studio.engine.rollout.sample_rows import masked_spans
from grpo_studio.engine.run.trainer import Trainer
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.widgets import sample_view
from tests.studio_helpers import anyio_backend, visible_text, wait_until  # noqa: F401

SETS = ["train.steps=1", "train.prompts_per_step=2", "rollout.num_generations=4", "train.save_every=0"]


def train(run_dir, *extra) -> list[dict]:
    trainer = Trainer(cfgmod.load("tiny-arith", [*SETS, *extra]), run_dir)
    try:
        assert trainer.run() == "finished"
    finally:
        trainer.close()
    return [json.loads(line) for line in (run_dir / rundir.SAMPLES).read_text().splitlines()]


@pytest.fixture(scope="module")
def masked_run(tmp_path_factory):
    """Every completion cut at 3 tokens and left out of the loss (algo.mask_truncated_completions)."""
    run_dir = tmp_path_factory.mktemp("samples") / "masked"
    train(run_dir, "rollout.max_completion_len=3", "algo.mask_truncated_completions=true")
    return run_dir


def test_rows_hold_group_token_counts_and_trained_tokens(tmp_path, masked_run):
    plain = train(tmp_path / "plain")
    assert [r["group"] for r in plain] == [0, 0, 0, 0, 1, 1, 1, 1]  # G = 4 completions per prompt
    assert all(len({r["prompt"] for r in plain if r["group"] == g}) == 1 for g in (0, 1))
    limit = cfgmod.load("tiny-arith").rollout.max_completion_len
    for r in plain:  # nothing masked: every token trained; a truncated one has exactly the budget's tokens
        assert r["trained"] == r["tokens"] and 1 <= r["tokens"] <= limit and "masked" not in r
        assert r["tokens"] == limit if r["truncated"] else r["tokens"] <= limit
    rows = [json.loads(line) for line in (masked_run / rundir.SAMPLES).read_text().splitlines()]
    truncated = [r for r in rows if r["truncated"]]
    assert truncated and all(r["tokens"] == 3 and r["trained"] == 0 for r in truncated)
    assert all(r["trained"] == r["tokens"] for r in rows if not r["truncated"])


def test_masked_spans_cover_the_text_of_each_run_of_untrained_tokens():
    pieces = {1: "ab", 2: "c", 3: "de", 4: "f"}

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    assert masked_spans([1, 2, 3, 4], [True, False, False, True], decode) == [[2, 5]]
    assert masked_spans([1, 2, 3, 4], [False, True, True, False], decode) == [[0, 2], [5, 6]]
    row = {"completion": "abcdef", "tokens": 4, "trained": 2, "masked": [[2, 5]]}
    assert sample_view.completion_lines(row) == ("completion (4 tokens; 2 trained, ⟦ ⟧ masked):", ["┃ ab⟦cde⟧f"])


def row(step, group, prompt, advantage, correct, completion="x", truncated=False):
    return {
        "step": step,
        "group": group,
        "prompt": prompt,
        "completion": completion,
        "advantage": advantage,
        "rewards": {"correctness": correct},
        "tokens": 4,
        "trained": 4,
        "truncated": truncated,
    }


def test_filters_and_search_by_hand(tmp_path):
    rows = [
        row(1, 0, "1+1=", 0.0, 2.0, "2"),
        row(1, 0, "1+1=", 0.0, 2.0, "2"),  # group 0: both right, no spread
        row(1, 1, "2+5=", 0.7, 2.0, "7"),
        row(1, 1, "2+5=", -0.7, 0.0, "8", truncated=True),
    ]
    (tmp_path / rundir.SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in rows))
    index = SamplesIndex(tmp_path / rundir.SAMPLES)
    assert index.update() == 4
    assert list(index.order("all")) == [3, 2, 1, 0]  # newest first
    assert index.order("best")[0] == 2 and index.order("worst")[0] == 3
    assert index.order("zero-variance") == [1, 0]
    assert index.order("truncated") == [3]
    assert index.search("2+5") == ([2, 3], False) and index.order("all", [2, 3]) == [3, 2]
    assert index.search("7") == ([2], False)  # the completion is searched too
    assert index.rows(index.group(3)) == rows[2:]
    group = [rows[2], rows[3]]
    assert sample_view.scores_line(rows[3], group) == (
        "step 1 · group 1 (2 completions, rewards 0 … 2) · advantage -0.7 · correctness 0"
    )
    assert "rewards all equal: zero variance" in sample_view.scores_line(rows[0], rows[:2])


@pytest.mark.anyio
async def test_the_tab_shows_a_masked_truncated_completion_and_filters_by_key(masked_run):
    rows = [json.loads(line) for line in (masked_run / rundir.SAMPLES).read_text().splitlines()]
    app = StudioApp(live_hardware=False)
    async with app.run_test(size=(100, 40)) as pilot:
        app.open_run(masked_run)
        await pilot.pause()
        await pilot.press("8")  # Samples
        detail = app.screen.query_one("#sample-detail")
        await wait_until(pilot, lambda: "prompt (as rendered)" in visible_text(detail), timeout=60)
        await pilot.press("t")  # truncated only
        await pilot.pause()
        panel = app.screen.query_one("#samples-panel")
        truncated = [r for r in rows if r["truncated"]]
        assert panel.rows == truncated[::-1]
        newest = truncated[-1]
        group = [r for r in rows if group_key(r) == group_key(newest)]
        assert str(detail.render()) == "\n".join(
            [
                f"prompt (as rendered):\n{newest['prompt']}\n",
                sample_view.scores_line(newest, group),
                "completion (3 tokens, cut at max_completion_len; none trained):",
                *[("│ " + line).rstrip() for line in newest["completion"].split("\n")],
            ]
        )
        assert sample_view.scores_line(newest, group).startswith(f"step 1 · group {newest['group']} (4 completions")
        await pilot.press("slash", *"zzz-no-such-text", "enter")
        await pilot.pause()
        await wait_until(pilot, lambda: "searching" not in visible_text(app.screen.query_one("#samples-filter")))
        assert panel.rows == [] and "truncated: no rows matching 'zzz-no-such-text'" in visible_text(
            app.screen.query_one("#samples-filter")
        )
