"""The word-problems recipe as shipped: a format warm-up on 64 solved problems that are none of the task's
questions (so neither a training nor a held-out one), each in the reasoning prompt's layout and within the run's
token budget, and the GSM8K reward set's values on example replies by hand: the demonstrations' layout earns every
reward, GSM8K's own answer line only correctness and int, an unmarked right number nothing (the answer alone,
eval/answer_accuracy, still counts it)."""

from __future__ import annotations

import pytest

from grpo_studio import rewards
from grpo_studio.contract import config
from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path
from grpo_studio.engine.prompts import data, tasks
from grpo_studio.engine.run import evaluation
from grpo_studio.engine.train import warmup
from grpo_studio.rewards import builtin


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path("smollm2-135m-instruct"))


def test_the_demonstrations_are_none_of_the_tasks_questions_and_show_the_layout():
    demos = tasks.word_problems_demos()
    questions = {row["question"] for row in tasks.word_problems()}
    assert len(demos) == 64 and len({d["messages"][1]["content"] for d in demos}) == 64
    for demo in demos:
        system, user, reply = demo["messages"]
        assert (system["role"], system["content"], user["role"], reply["role"]) == (
            "system",
            builtin.SYSTEM_PROMPT,
            "user",
            "assistant",
        )
        assert user["content"] not in questions
        assert reply["content"].startswith("<reasoning>\n") and reply["content"].endswith("\n</answer>")
    assert demos[0]["messages"][2]["content"] == (
        "<reasoning>\nAfter buying, Isla has 7 + 2 = 9. After giving 8 away, 9 - 8 = 1.\n</reasoning>\n"
        "<answer>\n1\n</answer>"
    )


def test_the_recipe_loads_and_its_warm_up_renders_as_the_runs_prompts(tok):
    cfg = config.load("word-problems")
    assert (cfg.warmup.source, cfg.warmup.steps, cfg.warmup.batch_size) == ("builtin:word-problems-demos", 8, 8)
    assert data.system_prompt(cfg.data, gsm8k=True) == builtin.SYSTEM_PROMPT  # the demos' system turn
    examples = warmup.prepare(cfg, tok, None)
    assert len(examples) == 64
    first = examples[0]
    trained = tok.decode([t for t, m in zip(first.ids, first.trained, strict=True) if m])
    assert trained == tasks.word_problems_demos()[0]["messages"][2]["content"] + "<|im_end|>"
    assert max(sum(e.trained) for e in examples) <= cfg.rollout.max_completion_len


REPLIES = {  # reply -> (correctness, xmlcount, soft_format, strict_format, int), reference 12
    "<reasoning>\n5 + 7 = 12.\n</reasoning>\n<answer>\n12\n</answer>": (2.0, 0.5, 0.5, 0.5, 0.5),
    "<reasoning>\n5 + 7 = 13.\n</reasoning>\n<answer>\n13\n</answer>": (0.0, 0.5, 0.5, 0.5, 0.5),
    "5 + 7 = 12.\n#### 12": (2.0, 0.0, 0.0, 0.0, 0.5),
    "She has 5 + 7 = 12 apples.": (0.0, 0.0, 0.0, 0.0, 0.0),
}


@pytest.mark.parametrize("reply, expected", REPLIES.items())
def test_the_rewards_of_example_replies_by_hand(reply, expected):
    cfg = config.load("word-problems")
    funcs = dict(rewards.build(cfg.rewards))
    assert list(funcs) == ["correctness", "xmlcount", "soft_format", "strict_format", "int"]
    completion = [[{"role": "assistant", "content": reply}]]
    got = tuple(fn([None], completion, answer=["5 + 7 = 12.\n#### 12"])[0] for fn in funcs.values())
    assert got == expected
    # the answer alone: the last number, whatever marks it
    assert evaluation.answer_right(reply, "#### 12", builtin.DEFAULT) == ("13" not in reply)
