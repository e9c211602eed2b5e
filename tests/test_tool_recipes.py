"""The multi-turn recipes (tool-calc, tool-lookup, guess-number) as a user runs them: each loads, its environment,
template and every episode's first prompt pass the checks made before weights load, its warm-up conversations
tokenise, and its reward gives full marks to a right final reply (the demonstrations' own answers, both a year
and a town) and nothing to a wrong one. The warm-up demonstrations hold the real tools' results."""

from __future__ import annotations

import pytest

from grpo_studio import rewards
from grpo_studio.contract import config, environments
from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path
from grpo_studio.engine.prompts import data, tasks
from grpo_studio.engine.rollout import episodes
from grpo_studio.engine.train import warmup


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path("smollm2-135m-instruct"))


@pytest.mark.parametrize("recipe", ["tool-calc", "tool-lookup", "guess-number"])
def test_the_recipe_passes_every_check_before_weights_load(recipe, tok):
    cfg = config.load(recipe)
    rows = data.load_rows(cfg.data, "train") + data.load_rows(cfg.data, "eval")
    made = episodes.make(cfg, tok, rows)  # refuses a prompt longer than rollout.max_prompt_len
    assert made.env.name == environments.load(cfg.env.environment).name
    assert len(warmup.prepare(cfg, tok, made)) == {"tool-calc": 500, "tool-lookup": 400, "guess-number": 50}[recipe]


@pytest.mark.parametrize("recipe", ["tool-calc", "tool-lookup"])
def test_the_reward_scores_a_right_final_reply_and_only_that(recipe):
    cfg = config.load(recipe)
    ((name, fn),) = rewards.build(cfg.rewards)
    demos = tasks.TASKS[cfg.warmup.source]()[:20]
    answers = [d["messages"][-1]["content"] for d in demos]
    replies = [[{"role": "assistant", "content": a + "."}] for a in answers]
    assert fn([None] * 20, replies, answer=answers) == [2.0] * 20
    wrong = [[{"role": "assistant", "content": f"{a}0"}] for a in answers]
    assert fn([None] * 20, wrong, answer=answers) == [0.0] * 20


def test_the_demonstrations_hold_the_real_tools_results():
    calculator = environments.load("calculator").factory()
    for demo in tasks.tool_arith_demos(50):
        call, result, answer = (
            demo["messages"][1]["tool_calls"][0]["function"],
            demo["messages"][2],
            demo["messages"][3],
        )
        assert result["content"] == calculator.calculate(**call["arguments"]) == answer["content"]
    lookup = environments.load("lookup").factory()
    for demo in tasks.lookup_demos():
        name = demo["messages"][1]["tool_calls"][0]["function"]["arguments"]["name"]
        with pytest.raises(ValueError, match="no person named"):  # someone the table does not hold
            lookup.lookup(name)
        assert demo["messages"][2]["content"].startswith(f"{name}: born ")
        assert demo["messages"][3]["content"] in demo["messages"][2]["content"]
