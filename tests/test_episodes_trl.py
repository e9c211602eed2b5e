"""Episodes' token bookkeeping against TRL's own multi-turn loop (the oracle), on the same scripted conversation.

TRL's GRPOTrainer runs tool calls in `_tool_call_loop` and builds the environment's tokens with
`_get_tool_suffix_ids` (trl/trainer/grpo_trainer.py). Those two methods run here unchanged, unbound, on a minimal
`self` holding only the attributes they read: the SmolLM2 tokenizer with the shipped ChatML tools template, the
per-sample tool dicts TRL builds from an environment instance's public methods, the budget, and
`_generate_single_turn` replaced by the scripted model (tests/test_episodes.py's ScriptedSampler: the same turn
texts as ids with the same float32 log-probs that our Episodes get). The first turn is handed to the loop as TRL's
`_generate` hands it: the prompt rendered with the tools, the turn's ids up to its end-of-turn token, and its
message from `trl.chat_template_utils.parse_response` with `tokenizer.response_template = qwen3_template`, whose
ChatML anchor ("<|im_start|>assistant\\n") and `<tool_call>` + JSON + `</tool_call>` fields read our template's
format as is (no newlines needed around the JSON).

TRL's completion_ids, tool_mask and logprobs after the loop must equal our episode's ids, mask and logprobs. Where
the two semantics differ by design (a failing tool, the turn limit, the last token of the budget), a separate test
says what TRL does, asserts what we do, and why.
"""

from __future__ import annotations

import copy
import inspect
import types

import pytest
from trl import GRPOTrainer
from trl.chat_template_utils import parse_response, qwen3_template

from grpo_studio.engine.rollout import tool_template
from grpo_studio.engine.sampler.base import Sampling
from tests import episode_envs
from tests.test_episodes import CALL, ScriptedSampler, _episodes, _turns, tok  # noqa: F401

TEMPLATE = tool_template.CHATML_TOOLS.read_text()
CALL2 = '<tool_call>{"name": "add", "arguments": {"a": 5, "b": 4}}</tool_call>'
SCRIPTS = {  # the model's turns, in order; each ends in <|im_end|>
    "no_call": ["It is 5."],
    "one_call": [CALL, "It is 5."],
    "two_calls_in_two_turns": [CALL, CALL2, "It is 9."],
    "two_calls_in_one_turn": [CALL + CALL2, "5 and 9."],
    "text_then_call": ["Let me add. " + CALL, "It is 5."],
}
QUESTION = "What is 2 + 3?"


@pytest.fixture(scope="module")
def trl_tok(tok):  # noqa: F811
    """TRL's tokenizer: SmolLM2's, with the shipped template and a response parser (TRL parses turns with it)."""
    out = copy.deepcopy(tok)
    out.chat_template = TEMPLATE
    out.response_template = qwen3_template  # its ChatML anchor and <tool_call>{json}</tool_call> fit our template
    return out


def _script(turns: list[str]):
    return lambda context: turns[min(_turns(context), len(turns)) - 1] + "<|im_end|>"


def trl_episode(trl_tok, env, turns, max_completion_length, max_tool_calling_iterations):
    """TRL's _generate for one conversational prompt with tools, on the scripted model: the first turn, then
    GRPOTrainer._tool_call_loop itself. Returns (prompt_ids, completion_ids, tool_mask, logprobs, tool calls run)."""
    model = ScriptedSampler(trl_tok, _script(turns))

    def generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = model.generate(prompt_ids, Sampling(n=num_generations, max_tokens=max_completion_length))
        lengths = out.mask.sum(1).int().tolist()
        ids = [out.completion_ids[i, :k].tolist() for i, k in enumerate(lengths)]
        return ids, [out.logprobs[i, :k].tolist() for i, k in enumerate(lengths)]

    # TRL's per-sample tool dict: the environment's public methods but reset and get_reward (_generate)
    methods = [
        getattr(env, name)
        for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]
    fake = types.SimpleNamespace(
        processing_class=trl_tok,
        _tokenizer=trl_tok,
        chat_template=TEMPLATE,
        chat_template_kwargs={},
        _is_vlm=False,
        tools=methods,
        _sync_tool_dicts=[{m.__name__: m for m in methods}],
        _async_tool_dicts=[{}],
        environment_factories=None,
        max_tool_calling_iterations=max_tool_calling_iterations,
        max_completion_length=max_completion_length,
        use_vllm=False,
        model=types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=8192)),
        _generate_single_turn=generate_single_turn,
    )
    fake._get_tool_suffix_ids = types.MethodType(GRPOTrainer._get_tool_suffix_ids, fake)

    env.reset(prompt=QUESTION)
    prompts = [[{"role": "user", "content": QUESTION}]]
    prompt_ids = [
        trl_tok.apply_chat_template(
            prompts[0], tools=methods, chat_template=TEMPLATE, add_generation_prompt=True, return_dict=False
        )
    ]
    completion_ids, logprobs = generate_single_turn(prompt_ids, None, {}, 1)
    completions = [[parse_response(trl_tok, completion_ids[0], prefix=prompt_ids[0], tools=methods)]]
    tool_mask, _, completion_ids, logprobs, tool_call_count, _, _ = GRPOTrainer._tool_call_loop(
        fake, copy.deepcopy(prompts), prompt_ids, completion_ids, completions, logprobs, None, {}
    )
    return prompt_ids[0], completion_ids[0], tool_mask[0], logprobs[0], tool_call_count


def our_episode(tokenizer, cls, turns, max_tokens, max_turns=10):
    episodes = _episodes(tokenizer, cls, max_tokens=max_tokens, max_turns=max_turns)
    sampler = ScriptedSampler(tokenizer, _script(turns))
    _, (episode,) = episodes.run(sampler, [{"prompt": QUESTION}], 1, Sampling(1, max_tokens))
    return episode


def _trl_env(cls):
    return getattr(episode_envs, cls)()


def assert_same(trl, episode, tokenizer):
    prompt_ids, ids, tool_mask, logprobs, _ = trl
    assert episode.prompt_ids == prompt_ids
    assert episode.ids == ids, (tokenizer.decode(ids), tokenizer.decode(episode.ids))
    assert [int(m) for m in episode.mask] == tool_mask
    assert episode.logprobs == logprobs


@pytest.mark.parametrize("parser", ["tags", "response_template"])
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_episode_ids_mask_and_logprobs_are_trls(tok, trl_tok, name, parser):  # noqa: F811
    """Each scripted conversation, with room to spare: TRL's loop and our Episodes give the same ids, mask and μ,
    and run the same tool calls. `parser`: our turns read by our <tool_call> tags, or by the tokenizer's own
    response parser (the one TRL uses)."""
    turns = SCRIPTS[name]
    env = _trl_env("Adder")
    trl = trl_episode(trl_tok, env, turns, max_completion_length=300, max_tool_calling_iterations=9)
    episode = our_episode(tok if parser == "tags" else trl_tok, "Adder", turns, max_tokens=300)
    assert_same(trl, episode, tok)
    assert episode.stop == "done" and episode.turns == len(turns)
    assert episode.instance.calls == env.calls == [(2, 3), (5, 4)][: trl[4]]
    assert sum(episode.calls.values()) == trl[4] == sum(t.count("<tool_call>") for t in turns)


def test_a_tool_result_past_the_budget_is_rolled_back_as_trl_does(tok, trl_tok):  # noqa: F811
    """A budget one token short of holding a tool result: TRL drops it (completion + suffix past
    max_completion_length), we roll it back; room for the result and one model token: both show it and cut the
    next turn to that token."""
    turns = SCRIPTS["two_calls_in_two_turns"]
    full = our_episode(tok, "Adder", turns, max_tokens=300)
    starts = [i for i in range(1, len(full.mask)) if full.mask[i] == 0 and full.mask[i - 1] == 1]
    ends = [i for i in range(1, len(full.mask)) if full.mask[i] == 1 and full.mask[i - 1] == 0]
    assert len(starts) == len(ends) == 2
    for start, end in zip(starts, ends):
        for budget in (end - 1, end + 1):  # end: the result fits exactly, no model token after it (next test)
            trl = trl_episode(trl_tok, _trl_env("Adder"), turns, budget, 9)
            episode = our_episode(tok, "Adder", turns, max_tokens=budget)
            assert_same(trl, episode, tok)
            assert episode.stop == "length"
            assert len(episode.ids) == (start if budget < end else budget)


def test_the_budgets_last_token_differs_from_trl_by_design(tok, trl_tok):  # noqa: F811
    """Every budget from 1 token to past the whole conversation: ids, mask and μ are TRL's, but for two documented
    differences.

    1. A tool result that fills the budget exactly (completion + result == max_completion_length): TRL keeps it (its
       check is `>`) and the completion ends on the environment's tokens, its next turn truncated to nothing; we
       roll it back (`>=`), as for a result past the budget: an episode ends on a model token, so the answer the
       reward functions score is the model's last turn, not a tool result nobody read.
    2. A turn cut by the budget before its `<|im_end|>` once its call's JSON is complete, with or without the
       `</tool_call>` after it: TRL's streaming parser still reads the call and runs the tool (its result is then
       rolled back, the budget being spent), so the environment's state (get_reward) holds a call the model never
       finished (a cut inside `</tool_call>` reads as text, nothing runs); we never run the calls of a turn without
       its end-of-turn token. The ids agree; only the environment's side effects differ.
    """
    turns = SCRIPTS["two_calls_in_two_turns"]
    full = our_episode(tok, "Adder", turns, max_tokens=300)
    exact = [i for i in range(1, len(full.mask)) if full.mask[i] == 1 and full.mask[i - 1] == 0]
    cut_calls = []  # budgets that cut a call turn right after its JSON, or right after its </tool_call>
    for offset, call in ((0, CALL), (exact[0], CALL2)):
        json_end = len(tok.encode(call.removesuffix("</tool_call>"), add_special_tokens=False))
        cut_calls += [offset + json_end, offset + len(tok.encode(call, add_special_tokens=False))]
    surplus = []
    for budget in range(1, len(full.ids) + 3):
        env = _trl_env("Adder")
        trl = trl_episode(trl_tok, env, turns, budget, 9)
        episode = our_episode(tok, "Adder", turns, max_tokens=budget)
        if budget in exact:
            _, ids, tool_mask, logprobs, _ = trl
            assert len(ids) == budget and tool_mask[-1] == 0  # TRL: the completion ends on the next header
            assert ids[: len(episode.ids)] == episode.ids and set(tool_mask[len(episode.ids) :]) == {0}
            assert episode.stop == "length" and episode.mask[-1] == 1.0  # ours: rolled back to the call
            continue
        assert_same(trl, episode, tok)
        assert episode.stop == ("done" if budget >= len(full.ids) else "length")
        if len(env.calls) != len(episode.instance.calls):  # TRL ran the cut turn's call, we did not
            assert len(env.calls) == len(episode.instance.calls) + 1 and episode.ids[-1] != tok.eos_token_id
            surplus.append(budget)
    assert surplus == cut_calls


def test_a_failing_tool_ends_our_episode_where_trl_feeds_the_error_back(tok, trl_tok):  # noqa: F811
    """A tool that raises, and a tool that does not exist: TRL renders {"error": ...} as the tool's result and lets
    the model go on; we end the episode with stop "error" (tests/test_episodes.py), its turn kept and trained, so
    nothing the environment failed at becomes context the model is trained to recover from, and the failure is
    counted (env/tool_failure_frac, env/stop/error) rather than hidden in a tool message."""
    for call in ('<tool_call>{"name": "boom", "arguments": {"x": 1}}</tool_call>', CALL.replace('"add"', '"mul"')):
        turns = [call, "Sorry."]
        trl = trl_episode(trl_tok, _trl_env("Faulty"), turns, 300, 9)
        episode = our_episode(tok, "Faulty", turns, max_tokens=300)
        first = tok.encode(call + "<|im_end|>", add_special_tokens=False)
        _, ids, tool_mask, _, _ = trl
        assert (
            "<|im_start|>tool\n{'error': " in tok.decode(ids)
            and ids[-2:] == tok.encode(".<|im_end|>", add_special_tokens=False)[-2:]
        )
        assert tool_mask[: len(first)] == [1] * len(first) and 0 in tool_mask
        assert (episode.stop, episode.ids, episode.mask) == ("error", first, [1.0] * len(first))


def test_max_turns_counts_model_turns_where_trl_counts_tool_rounds(tok, trl_tok):  # noqa: F811
    """TRL's max_tool_calling_iterations = K allows K rounds of tool results: K + 1 model turns, the last turn's
    calls never run. Our env.max_turns = K + 1 gives the same K + 1 turns and ids, and runs the last turn's calls
    too, unshown (the Nth action is taken: get_reward sees it), so max_turns means turns, as for step environments."""
    turns = [CALL, CALL2, CALL, CALL2]  # the model calls a tool every turn
    for k in (1, 2):
        env = _trl_env("Adder")
        trl = trl_episode(trl_tok, env, turns, 400, k)
        episode = our_episode(tok, "Adder", turns, max_tokens=400, max_turns=k + 1)
        assert_same(trl, episode, tok)
        assert (episode.stop, episode.turns) == ("max_turns", k + 1)
        assert len(env.calls) == trl[4] == k and len(episode.instance.calls) == k + 1
