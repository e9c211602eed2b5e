"""The dashboard on a multi-turn run (env.environment): the Samples tab shows an episode turn by turn with
trained and masked turns told apart without colour, one-completion samples as before, and the env/*
charts only for runs that have them. The real app on synthetic run directories (real files); the oracle
is the samples.jsonl / metrics.jsonl the test wrote, read back from disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import config as cfgmod
from grpo_studio.contract import rundir
from grpo_studio.contract.environments import STOPS
from grpo_studio.contract.metrics import fmt
from grpo_studio.studio import hardware
from grpo_studio.studio.app import StudioApp
from grpo_studio.studio.panels import TABS
from grpo_studio.studio.widgets.metric_chart import MetricChart
from tests.studio_helpers import anyio_backend, visible_text, wait_until  # noqa: F401

SAMPLES_KEY = str(len(TABS) + 3)  # Δlogp, Hardware, Samples after the chart tabs
ENV_CHARTS = ("lengths-turns", "lengths-tool_calls", "lengths-env_shares", "lengths-stops")


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(hardware, "gpus", lambda: [])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))


def app_on(runs: Path) -> StudioApp:
    return StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", runs, live_hardware=False, poll_s=3600)


def newest_first(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / rundir.SAMPLES).read_text().splitlines()][::-1]


def hand_episode_lines(row: dict) -> list[str]:
    """What the detail must show for an episode row, written out from the file's fields."""
    ep = row["episode"]
    model = sum(t["role"] == "model" for t in ep["turns"])
    lines = ["prompt (as rendered):", *row["prompt"].split("\n"), ""]
    lines.append(
        f"episode ({model} model turns, {len(ep['turns']) - model} env; the rewards score the last model turn):"
    )
    for t in ep["turns"]:
        if t["trained"]:
            lines += [f"▶ {t['role']} · trained"] + [("┃ " + x).rstrip() for x in t["text"].split("\n")]
        else:
            lines += [f"│ {t['role']} · masked (not trained)"] + [("│ " + x).rstrip() for x in t["text"].split("\n")]
    return lines + [f"stop: {ep['stop']} — {ep['why']}"]


async def highlight(pilot, table: DataTable, index: int) -> None:
    table.move_cursor(row=index)
    await pilot.pause()


@pytest.mark.anyio
async def test_samples_tab_shows_an_episode_turn_by_turn_and_one_completion_as_before(tmp_path, no_gpu):
    run_dir = write_run(tmp_path / "runs/episodes", 6, dtype="bf16", seed=7, episodes=True)
    rows = newest_first(run_dir)
    assert "episode" in rows[0] and "episode" in rows[1] and "episode" not in rows[2]
    app = app_on(tmp_path / "runs")
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_run(run_dir)
        await pilot.pause()
        await pilot.press(SAMPLES_KEY)
        dash = app.screen
        table = dash.query_one("#samples-table", DataTable)
        await wait_until(pilot, lambda: table.row_count == len(rows), timeout=60)
        detail, box = dash.query_one("#sample-detail", Static), dash.query_one("#sample-detail-box")

        # the newest row: a finished episode (tool call, the tool's result, the answer)
        await highlight(pilot, table, 0)
        shown = visible_text(detail).split("\n")
        assert shown == hand_episode_lines(rows[0])
        a, b = (int(x) for x in rows[0]["prompt"].rstrip("=").split("+"))
        assert shown[4:] == [  # the same, spelled out: trained and masked told apart by their markers alone
            "▶ model · trained",
            f'┃ <tool_call>{{"name": "calc", "arguments": {{"expression": "{a}+{b}"}}}}</tool_call>',
            "│ env · masked (not trained)",
            "│",  # the environment's text starts with a newline: kept
            "│ <|im_start|>tool",  # special tokens as-is
            f"│ {a + b}<|im_end|>",
            "│ <|im_start|>assistant",
            "│",
            "▶ model · trained",
            f"┃ <answer>{a + b}</answer>",
            "stop: done — the model answered without a tool call",
        ]
        assert box.has_class("episode") and box.outer_size.height > 8  # taller than a one-completion detail
        cells = [str(c) for c in table.get_row_at(0)]
        assert cells[0] == str(rows[0]["step"]) and cells[1] == fmt(rows[0]["advantage"])
        assert cells[4] == f"[2 model turns, 1 env · done] {rows[0]['completion']}"

        # an episode cut at env.max_turns: three model turns, each call answered by a masked tool turn
        await highlight(pilot, table, 1)
        shown = visible_text(detail).split("\n")
        assert shown == hand_episode_lines(rows[1])
        assert shown.count("▶ model · trained") == 3 and shown.count("│ env · masked (not trained)") == 2
        assert shown[-1] == f"stop: max_turns — {rows[1]['episode']['why']}"

        # a one-completion row: exactly the detail and the cell of before
        await highlight(pilot, table, 2)
        one = rows[2]
        assert visible_text(detail) == f"prompt (as rendered):\n{one['prompt']}\n\ncompletion:\n{one['completion']}"
        assert not box.has_class("episode") and box.outer_size.height == 8
        assert str(table.get_row_at(2)[4]) == repr(one["completion"])[1:-1][:120]


def charts(app, ids) -> dict[str, bool]:
    return {c.id: c.display for c in app.screen.query(MetricChart) if c.id in ids}


@pytest.mark.anyio
async def test_env_charts_only_for_a_run_with_episodes(tmp_path, no_gpu):
    episodic = write_run(tmp_path / "runs/episodes", 8, dtype="bf16", seed=7, episodes=True)
    plain = write_run(tmp_path / "runs/plain", 8, dtype="bf16", seed=7)
    rows = [json.loads(line) for line in (episodic / rundir.METRICS).read_text().splitlines()]
    app = app_on(tmp_path / "runs")
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_run(episodic)
        await pilot.pause()
        await pilot.press("4")  # Lengths
        await pilot.pause()
        assert charts(app, ENV_CHARTS) == dict.fromkeys(ENV_CHARTS, True)
        tools = app.screen.query_one("#lengths-tool_calls", MetricChart)
        assert [line.label for line in tools.lines] == ["tool_calls_mean", "calc"]
        assert tools.lines[1].ys == [r["env/tool_calls/calc"] for r in rows]
        stops = app.screen.query_one("#lengths-stops", MetricChart)
        assert [line.label for line in stops.lines] == list(STOPS)
        await pilot.press("5")  # Perf: the rollout's env/model split joins the step time
        await pilot.pause()
        step = app.screen.query_one("#perf-step_time", MetricChart)
        assert [line.label for line in step.lines][-2:] == ["env_s", "model_s"]
        assert step.lines[-2].ys == [r["perf/env_s"] for r in rows]

        await pilot.press("escape")
        app.open_run(plain)
        await pilot.pause()
        await pilot.press("4")
        await pilot.pause()
        assert charts(app, ENV_CHARTS) == dict.fromkeys(ENV_CHARTS, False)  # no empty env panels
        await pilot.press("5")
        await pilot.pause()
        step = app.screen.query_one("#perf-step_time", MetricChart)
        assert [line.label for line in step.lines] == [
            "step_s",
            "rollout_s",
            "step−rollout",
        ]  # perf/train_s, named as computed
