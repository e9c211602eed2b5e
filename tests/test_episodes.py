"""Episodes' token bookkeeping against oracles, on SmolLM2's real tokenizer and the shipped ChatML tools template.

The model's side is scripted (ScriptedSampler: the texts a model would write, as ids with known log-probs), so
every expected id, mask and stop reason is computed by hand or by `apply_chat_template` over the conversation.
tests/test_episodes_train.py runs episodes through the trainer with real samplers.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from grpo_studio.contract import environments
from grpo_studio.contract.config import EnvConfig
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path
from grpo_studio.engine.rollout import tool_template
from grpo_studio.engine.rollout.episodes import Episodes, metrics
from grpo_studio.engine.sampler.base import Rollout, Sampling

ENVS = Path(__file__).with_name("episode_envs.py")
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path("smollm2-135m-instruct"))


class ScriptedSampler:
    """The model's turns as scripted text: reply(context text) -> the turn's text, ending in <|im_end|> unless it
    is cut. μ of the t-th sampled token of a call is -(t + 1) / 100."""

    name = "scripted"

    def __init__(self, tok, reply):
        self.tok, self.reply, self.calls = tok, reply, []

    def generate(self, prompt_ids, sampling: Sampling) -> Rollout:
        self.calls.append((prompt_ids, sampling))
        rows = []
        for ids in prompt_ids:
            text = self.reply(self.tok.decode(ids))
            turn = self.tok.encode(text, add_special_tokens=False)[: sampling.max_tokens]
            rows.append(turn)
        width = max(map(len, rows))
        pad = lambda r, v: r + [v] * (width - len(r))  # noqa: E731
        eos = self.tok.eos_token_id
        return Rollout(
            completion_ids=torch.tensor([pad(r, eos) for r in rows]),
            mask=torch.tensor([pad([1.0] * len(r), 0.0) for r in rows]),
            logprobs=torch.tensor([pad([-(t + 1) / 100 for t in range(len(r))], 0.0) for r in rows]),
            truncated=torch.tensor([not r or r[-1] != eos for r in rows]),
        )


def _episodes(tok, cls: str, max_tokens=200, **env_keys) -> Episodes:
    env = environments.load(f"{ENVS}:{cls}")
    template = tool_template.CHATML_TOOLS.read_text()
    return Episodes(env, tok, template, EnvConfig(environment=cls, **env_keys), max_tokens)


def _turns(context: str) -> int:
    return context.count("<|im_start|>assistant")


def test_a_tool_episode_is_the_chat_template_of_its_conversation(tok):
    """Flat ids = apply_chat_template(whole conversation); mask 1 exactly on the model's turns (end-of-turn token
    included), 0 on the environment's ("\\n", the tool turn, the next assistant header); μ kept where sampled."""
    script = lambda context: (CALL if _turns(context) == 1 else "It is 5.") + "<|im_end|>"  # noqa: E731
    episodes = _episodes(tok, "Adder")
    out, (episode,) = episodes.run(ScriptedSampler(tok, script), [{"prompt": "What is 2 + 3?"}], 1, Sampling(1, 200))

    conversation = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "assistant", "content": "It is 5."},
    ]
    tools = environments.schemas(episode.instance, episodes.env)
    whole = tok.apply_chat_template(conversation, tools=tools, chat_template=episodes.template, return_dict=False)
    assert episode.prompt_ids + episode.ids == whole[:-1]  # the render ends "<|im_end|>\n"; the episode at eos
    assert len(episode.ids) == len(episode.mask) == len(episode.logprobs)

    first = tok.encode(CALL + "<|im_end|>", add_special_tokens=False)
    env = tok.encode("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    second = tok.encode("It is 5.<|im_end|>", add_special_tokens=False)
    assert episode.ids == first + env + second
    assert episode.mask == [1.0] * len(first) + [0.0] * len(env) + [1.0] * len(second)
    hand = lambda n: [-(t + 1) / 100 for t in range(n)]  # noqa: E731
    assert episode.logprobs == pytest.approx(hand(len(first)) + [0.0] * len(env) + hand(len(second)))
    assert (episode.stop, episode.turns, episode.calls, episode.reward, episode.answer) == (
        "done",
        2,
        {"add": 1},
        1.0,
        "It is 5.",
    )
    assert episode.instance.calls == [(2, 3)]
    # the Rollout the trainer reads is the episode, right-padded
    assert out.completion_ids[0, : len(episode.ids)].tolist() == episode.ids
    assert out.mask[0].tolist() == episode.mask and not out.truncated[0]
    assert [s["role"] for s in episode.segments] == ["model", "env", "model"]
    assert [s["trained"] for s in episode.segments] == [True, False, True]


def test_reset_text_joins_the_last_user_message_and_second_turns_see_the_tool_result(tok):
    seen = []

    def script(context):
        seen.append(context)
        return (CALL if _turns(context) == 1 else "5") + "<|im_end|>"

    _episodes(tok, "Adder").run(
        ScriptedSampler(tok, script), [{"prompt": "Add.", "note": " (2 and 3)"}], 1, Sampling(1, 200)
    )
    assert "<|im_start|>user\nAdd. (2 and 3)<|im_end|>" in seen[0]  # TRL: reset's string appended to the prompt
    assert seen[1].endswith("<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("turn", "cls", "stop", "why"),
    [
        (
            '<tool_call>{"name": "add", "arguments": {"a": 2,</tool_call>',
            "Adder",
            "error",
            "malformed tool call: not JSON",
        ),
        ('<tool_call>{"name": "add"', "Adder", "error", "<tool_call> without </tool_call>"),
        ('<tool_call>{"name": "mul", "arguments": {}}</tool_call>', "Adder", "error", "unknown tool 'mul'; tools: add"),
        (
            '<tool_call>{"name": "add", "arguments": [2, 3]}</tool_call>',
            "Adder",
            "error",
            "arguments must be a JSON object",
        ),
        (
            '<tool_call>{"name": "boom", "arguments": {"x": 1}}</tool_call>',
            "Faulty",
            "error",
            "tool boom raised RuntimeError: kaboom",
        ),
        (
            '<tool_call>{"name": "hang", "arguments": {"x": 1}}</tool_call>',
            "Faulty",
            "timeout",
            "env.tool_timeout_s = 0.2 s",
        ),
        ("anything", "BadStep", "error", "step must return (messages, done, reward or None, info)"),
    ],
)
def test_bad_input_ends_its_episode_with_a_stop_reason(tok, turn, cls, stop, why):
    """Each ends its own episode; the other episode of the same call (a plain answer) is done as usual."""
    script = lambda context: (turn if "ALPHA" in context else "fine") + "<|im_end|>"  # noqa: E731
    rows = [{"prompt": "ALPHA"}, {"prompt": "BETA"}]
    out, (bad, good) = _episodes(tok, cls, tool_timeout_s=0.2).run(
        ScriptedSampler(tok, script), rows, 1, Sampling(1, 200)
    )
    assert (bad.stop, good.stop if cls != "BadStep" else "done") == (stop, "done")
    assert why in bad.why
    assert bad.mask == [1.0] * len(bad.ids)  # its turn stays trained: nothing of the environment was appended
    if cls != "BadStep":
        assert metrics([bad, good], ["add"], 0.0)["env/tool_failure_frac"] == 1.0


def test_max_turns_gives_n_turns_and_n_actions(tok):
    """env.max_turns = 3: three model turns; the turn shape's step runs three times, the tools shape's third call
    runs (get_reward sees it) but its result is not appended."""
    episodes = _episodes(tok, "Counter", max_turns=3)
    _, (episode,) = episodes.run(ScriptedSampler(tok, lambda c: "go<|im_end|>"), [{"prompt": "p"}], 1, Sampling(1, 500))
    assert (episode.stop, episode.turns, len(episode.instance.steps), episode.reward) == ("max_turns", 3, 3, 1.5)

    _, (tools,) = _episodes(tok, "Adder", max_turns=3).run(
        ScriptedSampler(tok, lambda c: CALL + "<|im_end|>"), [{"prompt": "p"}], 1, Sampling(1, 500)
    )
    assert (tools.stop, tools.turns, len(tools.instance.calls), tools.reward) == ("max_turns", 3, 3, 3.0)
    assert tools.segments[-1]["role"] == "model" and tools.mask[-1] == 1.0  # ends on the model's end-of-turn


def test_one_token_budget_rolls_back_an_overflowing_tool_result_and_cut_turns_run_nothing(tok):
    call = tok.encode(CALL + "<|im_end|>", add_special_tokens=False)
    env = tok.encode("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    # room for the call, not for the result plus one model token: rolled back, the episode ends at the call
    _, (rolled,) = _episodes(tok, "Adder", max_tokens=len(call) + len(env)).run(
        ScriptedSampler(tok, lambda c: CALL + "<|im_end|>"), [{"prompt": "p"}], 1, Sampling(1, 500)
    )
    assert (rolled.stop, rolled.ids, rolled.instance.calls) == ("length", call, [(2, 3)])
    # one more token: the result fits, and the second turn gets exactly the one token left
    sampler = ScriptedSampler(tok, lambda c: CALL + "<|im_end|>")
    _, (fits,) = _episodes(tok, "Adder", max_tokens=len(call) + len(env) + 1).run(
        sampler, [{"prompt": "p"}], 1, Sampling(1, 500)
    )
    assert (fits.stop, len(fits.ids), sampler.calls[1][1].max_tokens) == ("length", len(call) + len(env) + 1, 1)
    assert len(fits.instance.calls) == 1  # the cut second turn (a call without its end) never ran
    assert metrics([fits], ["add"], 0.0)["env/env_token_frac"] == pytest.approx(len(env) / len(fits.ids))


def test_the_first_turn_is_sampled_as_a_one_turn_rollout(tok):
    """Same prompts, the rollout's seed and budget: what plain GRPO would request with n rows per prompt."""
    sampler = ScriptedSampler(tok, lambda c: "x<|im_end|>")
    _episodes(tok, "OneStep", max_tokens=50).run(
        sampler, [{"prompt": "a"}, {"prompt": "b"}], 3, Sampling(3, 50, seed=7)
    )
    ((contexts, sampling),) = sampler.calls
    assert sampling == Sampling(n=1, max_tokens=50, seed=7)
    assert len(contexts) == 6 and contexts[0] == contexts[2] != contexts[3]


def test_loss_gradient_is_exactly_zero_on_environment_tokens():
    """d loss / d log π is 0 wherever the mask is 0, for every loss type, with the KL term and rollout correction on."""
    from grpo_studio.contract.config import AlgoConfig
    from grpo_studio.engine.train.losses import LossInputs, policy_loss

    torch.manual_seed(0)
    mask = torch.tensor([[1.0, 1, 0, 0, 1, 1], [1, 0, 0, 1, 0, 0]])
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        logps = (torch.randn(2, 6) - 1).requires_grad_()
        inputs = LossInputs(
            logps=logps,
            old_logps=logps.detach() + 0.1 * torch.randn(2, 6),
            advantages=torch.tensor([1.0, -0.5]),
            mask=mask,
            rollout_logps=torch.where(mask.bool(), logps.detach() - 0.05, torch.zeros(2, 6)),
            ref_logps=logps.detach() - 0.2,
        )
        algo = AlgoConfig(loss_type=loss_type, beta=0.04, is_level="token")
        loss, _ = policy_loss(inputs, algo, max_completion_len=6, num_items_in_batch=mask.sum())
        loss.backward()
        assert torch.equal(logps.grad[mask == 0], torch.zeros(int((mask == 0).sum()))), loss_type
        assert (logps.grad[mask == 1] != 0).all(), loss_type


def test_a_broken_environment_class_is_refused_in_one_line(tmp_path):
    for cls, why in [
        ("Broken", "Broken has neither tools (public typed methods with docstrings) nor a step(text) method"),
        ("Nope", "class 'Nope' not found in"),
    ]:
        with pytest.raises(UserError) as err:
            environments.load(f"{ENVS}:{cls}")
        assert why in str(err.value) and "\n" not in str(err.value)
        assert str(err.value).startswith("config error: env.environment = ")
    untyped = tmp_path / "untyped.py"
    untyped.write_text(
        "class E:\n    def reset(self, **row): pass\n    def tool(self, x):\n        'Do.'\n        return x\n"
    )
    with pytest.raises(UserError, match=re.escape("tool E.tool: ")):
        environments.load(f"{untyped}:E")
    with pytest.raises(UserError, match="allowed: calculator, lookup, guess_number, 'file.py:Class' or 'module:Class'"):
        environments.load("calculater")


def test_the_template_check_refuses_a_template_that_is_not_prefix_preserving(tok):
    """SmolLM2's own template renders no tools: auto takes the shipped ChatML tools template, which passes; a
    template that drops the tool's result, or renders the last turn differently, is refused in one line."""
    from grpo_studio.contract.config import DataConfig

    assert tool_template.choose(tok, DataConfig()) == tool_template.CHATML_TOOLS.read_text()
    shipped = tool_template.CHATML_TOOLS.read_text()
    moving = shipped.replace(
        "{%- for message in turns -%}", "{%- for message in turns -%}{%- if loop.last %}[last]{% endif -%}"
    )
    with pytest.raises(UserError, match="not prefix-preserving"):
        tool_template.check(tok, moving)
    with pytest.raises(UserError, match="does not render an assistant's tool_calls"):
        tool_template.choose(tok, DataConfig(chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}"))
    with pytest.raises(UserError, match="need a chat template"):
        tool_template.choose(tok, DataConfig(chat_template="plain"))


def test_metrics_of_a_rollout_by_hand():
    from grpo_studio.engine.rollout.episodes import Episode

    a = Episode(
        None,
        [],
        None,
        ids=[1, 2, 3, 4],
        mask=[1.0, 0.0, 0.0, 1.0],
        turns=2,
        calls={"add": 1},
        attempted_calls=1,
        stop="done",
    )
    b = Episode(None, [], None, ids=[1, 2], mask=[1.0, 1.0], turns=1, attempted_calls=1, failed_calls=1, stop="error")
    m = metrics([a, b], ["add"], model_s=2.0)
    assert m["env/turns_mean"] == 1.5 and m["env/turns_max"] == 2
    assert m["env/tool_calls_mean"] == 1.0 and m["env/tool_calls/add"] == 0.5
    assert m["env/tool_failure_frac"] == 0.5 and m["env/env_token_frac"] == 2 / 6
    assert (m["env/stop/done"], m["env/stop/error"], m["env/stop/length"]) == (0.5, 0.5, 0.0)
    assert dataclasses.asdict(a)["segments"] == []
