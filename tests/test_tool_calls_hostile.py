"""A model's text and an environment's results are hostile input (issue 40): the tool-call parser is total and
linear, and what the environment hands back becomes plain text within env.max_result_chars, or a stop reason.
Every expectation is an exact message or a count; "must not hang" is a ratio between n and 4n inputs.
The same inputs run in the fault suite (benchmarks/hostile_model_text.py)."""

from __future__ import annotations

import time

import pytest

from grpo_studio.engine.rollout import tool_calls
from grpo_studio.engine.rollout.tool_calls import Call, EpisodeEnds, parse, plain_messages, plain_text, run_calls


def _call(name: str = "add", arguments: str = '{"a": 1, "b": 2}') -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def _ends(text: str) -> str:
    with pytest.raises(EpisodeEnds) as end:
        parse(text)
    assert end.value.stop == "error"
    return str(end.value)


def test_a_lone_surrogate_in_a_call_is_a_stop_reason_not_a_tokenizer_traceback():
    assert _ends(_call(arguments='{"a": "\\ud800"}')) == (
        "malformed tool call to 'add': a lone surrogate (\\ud800) at character 0, which no tokenizer encodes"
    )
    assert "a lone surrogate (\\udfff)" in _ends(_call(name="\\udfff"))
    assert "a lone surrogate (\\ud83d)" in _ends(_call(arguments='{"a": [[{"b": "x\\ud83d"}]]}'))
    assert parse(_call(arguments='{"a": "\\ud83d\\ude00"}')) == [Call("add", {"a": "\U0001f600"})]  # a pair is text


def test_nan_infinity_and_floats_past_the_float_range_are_malformed_not_handed_to_the_tool():
    assert _ends(_call(arguments='{"a": NaN}')) == "malformed tool call: NaN is not a JSON number"
    assert _ends(_call(arguments='{"a": -Infinity}')) == "malformed tool call: -Infinity is not a JSON number"
    assert _ends(_call(arguments='{"a": [1e999]}')) == "malformed tool call: 1e999 is too large for a float"
    assert parse(_call(arguments='{"a": 1e308, "b": -2.5e-400}')) == [Call("add", {"a": 1e308, "b": -0.0})]


def test_json_nested_past_the_recursion_limit_and_huge_integers_are_stop_reasons():
    deep = "[" * 100_000 + "]" * 100_000
    assert _ends(_call(arguments=deep)).startswith("malformed tool call: JSON Python cannot read (RecursionError")
    huge = _ends(_call(arguments='{"a": ' + "9" * 5000 + "}"))
    assert huge.startswith("malformed tool call: JSON Python cannot read (ValueError: Exceeds the limit (4300 digits)")
    # inside arguments carried as a JSON string: the same failures, said as bad arguments
    quoted = _call(arguments='"{\\"a\\": ' + "9" * 5000 + '}"')
    assert _ends(quoted) == "malformed tool call to 'add': arguments must be a JSON object"


def test_thousands_of_openers_are_read_in_one_pass():
    assert _ends("<tool_call>" * 30_000) == "malformed tool call: <tool_call> without </tool_call>"
    assert parse("</tool_call>" * 30_000) == []
    assert len(parse(_call() * 30_000)) == 30_000
    assert parse(_call() + "<tool_call>{") == [Call("add", {"a": 1, "b": 2})]  # a trailing opener is not a call

    # linear: 4x the openers take about 4x the time, never the 16x of a lazy regex rescanning the rest of the text
    def best(n: int) -> float:
        text = "<tool_call>x" * n + _call()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            with pytest.raises(EpisodeEnds):
                parse(text)
            times.append(time.perf_counter() - start)
        return min(times)

    assert best(200_000) / best(50_000) < 10


def test_the_tokenizers_own_parser_gives_calls_or_a_stop_reason():
    class Parser:
        response_template = {"type": "object"}

        def __init__(self, answer):
            self.answer = answer

        def parse_response(self, ids, prefix=None, tools=None):
            if isinstance(self.answer, BaseException):
                raise self.answer
            return self.answer

    def ends(answer) -> str:
        with pytest.raises(EpisodeEnds) as end:
            parse("", Parser(answer), [1], [], None)
        return str(end.value)

    assert ends(RecursionError("deep")) == "malformed tool call (RecursionError: deep)"
    assert ends([1, 2]) == "malformed tool call (AttributeError: 'list' object has no attribute 'get')"
    assert ends({"tool_calls": [{"function": {"name": "\ud800", "arguments": {}}}]}) == (
        "malformed tool call to '\\ud800': a lone surrogate (\\ud800) at character 0, which no tokenizer encodes"
    )
    call = {"tool_calls": [{"function": {"name": "add", "arguments": '{"a": 1}'}}]}
    assert parse("", Parser(call), [1], [], None) == [Call("add", {"a": 1})]


def test_results_become_plain_text_cut_to_the_limit_saying_so():
    class Hostile(str):
        def __str__(self):
            raise RuntimeError("no")

        def __len__(self):
            raise RuntimeError("no")

    assert type(plain_text(Hostile("abc"), "reset", 10)) is str and plain_text(Hostile("abc"), "reset", 10) == "abc"
    assert plain_text("x" * 25, "reset", 10) == "xxxxxxxxxx... [25 characters, cut to env.max_result_chars = 10]"
    with pytest.raises(EpisodeEnds, match=r"^reset returned int, not a string$"):
        plain_text(5, "reset", 10)
    with pytest.raises(EpisodeEnds, match="reset returned text with a lone surrogate"):
        plain_text("ok\ud800", "reset", 10)


def test_messages_share_the_limit_the_one_that_passes_it_is_cut_and_the_rest_dropped():
    messages = [{"role": "user", "content": "abcdef"}, {"role": "user", "content": "0123456789"}] + [
        {"role": "user", "content": "never read"}
    ] * 1_000_000
    # 20 characters: "user" + "abcdef" = 10, then "user" leaves 6 of "0123456789"
    assert plain_messages(messages, "step", 20) == [
        {"role": "user", "content": "abcdef"},
        {"role": "user", "content": "012345... [10 characters, cut to env.max_result_chars = 6]"},
    ]
    with pytest.raises(EpisodeEnds, match="^step returned a message whose role is over 64 characters$"):
        plain_messages([{"role": "r" * 65, "content": ""}], "step", 100)
    with pytest.raises(EpisodeEnds, match=r"^step returned str, not a list of messages$"):
        plain_messages("hello", "step", 100)


class Tools:
    def __init__(self):
        self.made = 0

    def slow(self, x: int) -> str:
        time.sleep(0.05)
        self.made += 1
        return "ok"

    def exits(self, x: int) -> str:
        raise SystemExit(3)

    def huge(self, x: int) -> str:
        return "ab" * 5_000_000


def test_one_turns_calls_share_one_bound_and_one_limit():
    instance, counts = Tools(), {}
    start = time.monotonic()
    with pytest.raises(EpisodeEnds) as end:
        run_calls(instance, ["slow"], [Call("slow", {"x": 1})] * 300, 0.5, 100, counts)
    assert (end.value.stop, str(end.value)) == ("timeout", "tool slow ran past env.tool_timeout_s = 0.5 s")
    assert time.monotonic() - start < 15  # 300 calls of 0.05 s would be 15 s: the bound is the turn's
    assert counts["slow"] < 300 and instance.made < 300
    with pytest.raises(EpisodeEnds, match=r"^tool exits raised SystemExit: 3$"):
        run_calls(instance, ["exits"], [Call("exits", {"x": 1})], 5, 100, {})
    (first, second) = run_calls(instance, ["huge"], [Call("huge", {"x": 1})] * 2, 5, 30, {})
    assert first["content"] == "ab" * 15 + "... [10000000 characters, cut to env.max_result_chars = 30]"
    assert second["content"] == "... [10000000 characters, cut to env.max_result_chars = 0]"


def test_a_guarded_call_past_its_bound_in_a_pure_python_loop_is_stopped():
    def spin():
        while True:
            pass

    with pytest.raises(EpisodeEnds, match=r"^reset ran past env.tool_timeout_s = 0.2 s$"):
        tool_calls.bounded(spin, 0.2, "reset")
