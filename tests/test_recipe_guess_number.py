"""The guess-number recipe as shipped: its warm-up is the 50 games played by binary search, each fitting the run's
token budget, and env/step/range_halving is log2 of the range before a guess over the range after it, checked by
hand on scripted games and through the episodes' metrics row."""

from __future__ import annotations

import math

import pytest

from grpo_studio.contract import config, environments, metrics
from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path
from grpo_studio.engine.prompts import data, tasks
from grpo_studio.engine.rollout import episodes
from grpo_studio.engine.rollout.episodes import Episode, step_metrics
from grpo_studio.engine.train import warmup


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path("smollm2-135m-instruct"))


def game(secret):
    env = environments.load("guess_number").factory()
    env.reset(secret=secret)
    return env


def bits(env, guess: str):
    return env.step(guess)[3]["metrics"]["range_halving"]


def test_the_range_halving_of_a_scripted_game_by_hand():
    env = game(37)
    assert bits(env, "25") == 1.0  # 50 possible -> 26..50, 25 left
    assert bits(env, "40") == math.log2(25 / 14)  # 26..50 -> 26..39
    assert bits(env, "10") == 0.0  # already ruled out by "Higher." after 25: narrows nothing
    assert bits(env, "39") == math.log2(14 / 13)  # 26..38
    assert env.step("no idea")[3] == {"valid": False}  # not a guess: no metric
    assert bits(env, "37") == math.log2(13)  # found: one left
    env.reset(secret=1)
    assert bits(env, "1") == math.log2(50)  # reset gives the whole range back


def test_the_demonstrations_are_binary_search_and_win_every_game_in_six_guesses():
    demos = tasks.guess_number_demos()
    assert len(demos) == 50
    for secret, demo in enumerate(demos, start=1):
        guesses = [int(m["content"]) for m in demo["messages"] if m["role"] == "assistant"]
        assert guesses[-1] == secret and len(guesses) <= 6
        low, high = 1, 50
        for g in guesses:  # each guess the middle of what the answers so far leave
            assert g == (low + high) // 2
            low, high = (g + 1, high) if g < secret else (low, g - 1)
    assert [m["content"] for m in demos[36]["messages"][2:]] == [  # secret 37, as the hand trace above
        "25", "Higher.", "38", "Lower.", "31", "Higher.", "34", "Higher.", "36", "Higher.", "37",
    ]  # fmt: skip
    env = game(37)
    assert sum(bits(env, g) for g in ("25", "38", "31", "34", "36", "37")) == pytest.approx(math.log2(50))


def test_the_recipe_loads_and_its_warm_up_fits_the_runs_token_budget(tok):
    cfg = config.load("guess-number")
    assert (cfg.warmup.source, cfg.warmup.steps, cfg.rewards.funcs) == ("builtin:guess-number-demos", 24, [])
    rows = data.load_rows(cfg.data, "train") + data.load_rows(cfg.data, "eval")
    made = episodes.make(cfg, tok, rows)
    examples = warmup.prepare(cfg, tok, made)
    assert len(examples) == 50
    # an episode's completion span: from the first guess (after the generation prompt) to the game's end
    longest = max(len(e.ids) - e.trained.index(1) for e in examples)
    assert longest <= cfg.rollout.max_completion_len


def test_episodes_log_the_mean_over_every_guess_and_the_schema_knows_it():
    a, b, c = Episode(None, [], None, stop="done"), Episode(None, [], None, stop="done"), Episode(None, [], None)
    for info in ({"metrics": {"range_halving": 1.0}}, {"metrics": {"range_halving": 0.0}}, {"valid": False}):
        step_metrics(a, info)
    step_metrics(b, {"metrics": {"range_halving": 0.5, "bad name": 1.0, "nan": float("nan"), "s": "x"}})
    step_metrics(c, ["not", "a", "dict"])
    row = episodes.metrics([a, b, c], [], model_s=0.0)
    assert row["env/step/range_halving"] == 0.5  # (1 + 0 + 0.5) / 3 guesses
    assert not [k for k in row if k.startswith("env/step/") and k != "env/step/range_halving"]
    metrics.check_row(row)
    assert metrics.lookup("env/step/range_halving").name == "env/step/<name>"
    assert metrics.lookup("env/step/a/b") is None
    assert "env/step/<name>" not in metrics.names([])
