"""`rm:PATH` rewards: a tiny random sequence-classification model built here and saved to a folder.
The oracle is the same model called directly on each prompt + completion alone (no padding)."""

from __future__ import annotations

import functools

import pytest
import torch

from grpo_studio.contract.config import load
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.model import policy_loader
from grpo_studio.rewards import build, score

PROMPTS = ["6+1=", "12+30=", "2+2=", "9+9=", "1+1="]
COMPLETIONS = ["7", "<answer>42</answer>", "", "18 " * 70, "two"]  # "", and one past the 128 positions


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    base = policy_loader.resolve_model_path("tiny-arith")
    config = AutoConfig.from_pretrained(base, num_labels=1)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)  # scores far enough apart to tell completions apart
    out = tmp_path_factory.mktemp("tiny-rm")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


@functools.lru_cache(maxsize=1)
def _loaded(folder):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    return AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder).eval()


def direct(folder, text: str) -> float:
    """The model on one text, unpadded; the last 128 tokens when longer (its positions)."""
    tokenizer, model = _loaded(folder)
    ids = tokenizer(text, add_special_tokens=False).input_ids[-model.config.max_position_embeddings :]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


def rm_config(folder, batch_size: int):
    return load("tiny-arith", [f'rewards.funcs=["rm:{folder}"]', f"rewards.reward_model_batch_size={batch_size}"])


def test_scores_are_the_models_logit_on_prompt_plus_completion(reward_model_dir):
    funcs = build(rm_config(reward_model_dir, 2).rewards)
    ((name, fn),) = funcs
    assert name == f"rm_{reward_model_dir.name}" and fn.model.device == policy_loader.device()
    expected = [direct(reward_model_dir, p + c) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert len(set(round(e, 4) for e in expected)) == len(expected)  # the oracle tells them apart
    got = [row[0] for row in score(funcs, PROMPTS, COMPLETIONS, {"answer": ["7"] * 5})]
    assert got == pytest.approx(expected, abs=1e-4)


def test_conversational_prompts_are_the_messages_joined(reward_model_dir):
    """The tiny tokenizer has no chat template: prompt and completion contents joined by blank lines."""
    funcs = build([f"rm:{reward_model_dir}"])
    prompts = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": p}] for p in PROMPTS[:2]]
    got = [row[0] for row in score(funcs, prompts, COMPLETIONS[:2], {})]
    expected = [direct(reward_model_dir, f"Be brief.\n\n{p}\n\n{c}") for p, c in zip(PROMPTS[:2], COMPLETIONS[:2])]
    assert got == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("batch_size, forwards", [(2, 3), (16, 1)])
def test_batch_size_sets_the_forward_passes(reward_model_dir, batch_size, forwards):
    ((_, fn),) = build(rm_config(reward_model_dir, batch_size).rewards)
    widths = []
    fn.model.register_forward_hook(
        lambda module, args, kwargs, out: widths.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    fn(PROMPTS, COMPLETIONS)
    assert len(widths) == forwards and sum(widths) == len(PROMPTS)


def test_reward_model_errors_are_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    for entry, why in [
        (
            "rm:/nonexistent/rm",
            "not a local folder with config.json; give rm:PATH to a saved "
            "AutoModelForSequenceClassification (save_pretrained)",
        ),
        (f"rm:{tmp_path}", "cannot load a sequence-classification model there ("),
    ]:
        with pytest.raises(UserError) as err:
            build([entry])
        assert str(err.value).startswith(f"config error: rewards.funcs = '{entry}': {why}")
        assert "\n" not in str(err.value)


ASYNC_FILE = """
import asyncio

async def chars(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]
"""


def test_one_training_step_with_every_new_reward_kind(tmp_path, reward_model_dir):
    """rm:PATH, math_verify, a TRL reward by name and an async file reward in a real run: each sample's
    logged score is what the function gives on that sample, and each mean is in metrics.jsonl."""
    import json

    from grpo_studio.engine.run.trainer import Trainer
    from grpo_studio.rewards import builtin

    (tmp_path / "async_rewards.py").write_text(ASYNC_FILE)
    rm = f"rm_{reward_model_dir.name}"
    funcs = [
        "math_verify",
        f"rm:{reward_model_dir}",
        "trl.rewards:think_format_reward",
        f"{tmp_path}/async_rewards.py:chars",
    ]
    cfg = load(
        "tiny-arith",
        [
            "train.steps=1",
            "train.prompts_per_step=2",
            "rollout.num_generations=2",
            "rollout.max_completion_len=8",
            "train.save_every=0",
            "train.eval_every=0",
            "rollout.backend=hf",
            f"rewards.funcs={json.dumps(funcs)}",
        ],
    )
    assert Trainer(cfg, tmp_path / "run").run() == "finished"
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4
    for s in samples:
        assert s["rewards"][rm] == pytest.approx(direct(reward_model_dir, s["prompt"] + s["completion"]), abs=1e-4)
        assert s["rewards"]["chars"] == len(s["completion"])
        assert s["rewards"]["think_format_reward"] == 0.0  # the tiny model writes no <think>
        a, b = s["prompt"].rstrip("=").split("+")  # the built-in task: "a+b=", answer a + b
        assert (
            s["rewards"]["math_verify"]
            == builtin.math_verify([s["prompt"]], [s["completion"]], answer=[str(int(a) + int(b))])[0]
        )
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    for name in ("math_verify", rm, "think_format_reward", "chars"):
        assert row[f"rewards/{name}/mean"] == pytest.approx(sum(s["rewards"][name] for s in samples) / 4, abs=1e-5)


def test_the_vram_planner_counts_the_reward_models_weights(reward_model_dir):
    """The planner's reward-model row is the loaded model's parameter bytes, exactly, and adds to the total."""
    from transformers import AutoModelForSequenceClassification

    from grpo_studio.contract import config, model_card
    from grpo_studio.contract.planner import vram

    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    card = model_card.load("tiny-arith")
    plan = vram.estimate(card, config.load("tiny-arith", [f"rewards.funcs=correctness,rm:{reward_model_dir}"]))
    (row,) = [r for r in plan.rows if r.name == f"reward model {reward_model_dir.name}"]
    assert row.gib * 2**30 == pytest.approx(nbytes, rel=1e-12) and row.phase == "persistent"
    without = vram.estimate(card, config.load("tiny-arith")).total_gib
    assert plan.total_gib == pytest.approx(without + row.gib * (1 + vram.ALLOCATOR_MARGIN))  # and its margin
