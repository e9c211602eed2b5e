"""The fault suite's hostile cases for a model's text (benchmarks/fault_probes.py says how they run).

What a policy may write in a turn, read by the tool-call parser (engine/rollout/tool_calls.parse): each probe's text must
give parsed calls or an EpisodeEnds stop reason, within the probe's time limit, never an exception of its own.
The last few run a whole model turn through an episode (engine/rollout/episodes.py over SmolLM2's tokenizer and the
shipped ChatML tools template): text no tokenizer can encode ends the episode, it is never a tokenizer traceback.
"""

from __future__ import annotations

import time
from pathlib import Path

from .fault_probes import Probe
from .hostile_environments import bind

CATEGORY = "model text"


def _call(name: str = "add", arguments: str = '{"a": 1, "b": 2}') -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def expect(text: str, calls: int | None = None, stop_with: str | None = None, tmp: Path | None = None) -> str | None:
    """parse(text) gives `calls` calls, or ends the episode with a message holding `stop_with`."""
    from ..contract.environments import STOPS
    from ..engine.rollout import tool_calls

    try:
        found = tool_calls.parse(text)
    except tool_calls.EpisodeEnds as end:
        if end.stop not in STOPS or "\n" in str(end):
            return f"stop {end.stop!r} ({end}) is not one stop reason in one line"
        if stop_with is None:
            return f"expected {calls} calls, the episode ended: {end}"
        return None if stop_with in str(end) else f"ended with {str(end)!r}, expected it to say {stop_with!r}"
    if stop_with is not None:
        return f"expected the episode to end ({stop_with}), parsed {len(found)} calls"
    if len(found) != calls or not all(isinstance(c.name, str) and isinstance(c.arguments, dict) for c in found):
        return f"expected {calls} calls, parsed {len(found)}"
    return None


def linear(make, tmp: Path | None = None) -> str | None:
    """The parser's time on 4n openers is well under the 16x of a quadratic scan of n (best of five each)."""
    from ..engine.rollout import tool_calls

    def best(n: int) -> float:
        text = make(n)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            try:
                tool_calls.parse(text)
            except tool_calls.EpisodeEnds:
                pass
            times.append(time.perf_counter() - start)
        return min(times)

    small, large = best(20_000), best(80_000)
    ratio = large / max(small, 1e-6)
    return None if ratio < 10 else f"4x the openers took {ratio:.1f}x the time ({small:.4f} s -> {large:.4f} s)"


class _Parser:
    """A tokenizer whose own response parser (transformers' parse_response) returns or raises `answer`."""

    response_template = {"type": "object"}

    def __init__(self, answer):
        self.answer = answer

    def parse_response(self, ids, prefix=None, tools=None):
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def parser_answer(answer, stop_with: str | None, calls: int = 0, tmp: Path | None = None) -> str | None:
    """The tokenizer's own parser path: whatever it returns or raises is calls or a stop reason."""
    from ..engine.rollout import tool_calls

    try:
        found = tool_calls.parse("", _Parser(answer), [1, 2], [], None)
    except tool_calls.EpisodeEnds as end:
        if stop_with and stop_with in str(end):
            return None
        return f"ended with {str(end)!r}, expected {stop_with!r}"
    if stop_with:
        return f"parsed {len(found)} calls, expected the episode to end ({stop_with})"
    return None if len(found) == calls else f"parsed {len(found)} calls, expected {calls}"


def episode_turn(turn: str, stop: str | None, why: str, tmp: Path) -> str | None:
    """A model turn through a real episode (SmolLM2's tokenizer, the ChatML tools template, an echo tool): it
    ends with `stop` and a why holding `why` (stop None: it goes on), its sampled tokens kept and trained."""
    from .hostile_environments import episode_of, model_turn

    episodes, episode = episode_of(tmp, "Echo")
    ids = model_turn(episodes, episode, turn)
    if (episode.stop, why in episode.why) != (stop, True):
        return f"ended {episode.stop!r}: {episode.why!r}; expected {stop!r} saying {why!r}"
    if episode.mask[: len(ids)] != [1.0] * len(ids):
        return "the model's turn is not kept as sampled and trained"
    return None


def _probe(name: str, check, timeout_s: float = 30.0) -> Probe:
    return Probe(CATEGORY, name, check, timeout_s)


def cases() -> list:
    p = bind
    deep = "[" * 100_000 + "]" * 100_000
    return [
        _probe("lone surrogate in arguments", p(expect, _call(arguments='{"a": "\\ud800"}'), stop_with="surrogate")),
        _probe("lone surrogate in the name", p(expect, _call(name="\\udfff"), stop_with="surrogate")),
        _probe("raw surrogate character", p(expect, _call(arguments='{"a": "\ud800"}'), stop_with="surrogate")),
        _probe("surrogate deep in a list", p(expect, _call(arguments='{"a": [[["\\ud83d"]]]}'), stop_with="surrogate")),
        _probe("a valid surrogate pair", p(expect, _call(arguments='{"a": "\\ud83d\\ude00"}'), calls=1)),
        _probe("JSON nested 100,000 deep", p(expect, _call(arguments=deep), stop_with="malformed tool call")),
        _probe(
            "objects nested 100,000 deep",
            p(expect, _call(arguments='{"a": ' * 100_000 + "1" + "}" * 100_000), stop_with="malformed tool call"),
        ),
        _probe(
            "nesting inside string arguments",
            p(expect, _call(arguments='"' + "[" * 5000 + "]" * 5000 + '"'), stop_with="arguments must be"),
        ),
        _probe("a 5,000-digit integer", p(expect, _call(arguments='{"a": ' + "9" * 5000 + "}"), stop_with="digit")),
        _probe(
            "a 5,000-digit integer in string arguments",
            p(expect, _call(arguments='"{\\"a\\": ' + "9" * 5000 + '}"'), stop_with="arguments must be"),
        ),
        _probe(
            "exponent 1e999999999",
            p(expect, _call(arguments='{"a": 1e999999999}'), stop_with="1e999999999 is too large for a float"),
        ),
        _probe(
            "NaN and Infinity literals",
            p(expect, _call(arguments='{"a": NaN, "b": -Infinity}'), stop_with="NaN is not a JSON number"),
        ),
        _probe(
            "-Infinity literal", p(expect, _call(arguments='{"b": -Infinity}'), stop_with="-Infinity is not a JSON")
        ),
        _probe("30,000 openers", p(expect, "<tool_call>" * 30_000, stop_with="without </tool_call>")),
        _probe("30,000 openers then a call", p(expect, "<tool_call>" * 30_000 + _call(), stop_with="not JSON")),
        _probe("30,000 closers", p(expect, "</tool_call>" * 30_000, calls=0)),
        _probe("30,000 calls", p(expect, _call() * 30_000, calls=30_000)),
        _probe("a call, then an opener left open", p(expect, _call() + "<tool_call>{", calls=1)),
        _probe("parse is linear in openers", p(linear, lambda n: "<tool_call>x" * n), timeout_s=60),
        _probe("parse is linear in calls", p(linear, lambda n: _call() * (n // 10)), timeout_s=60),
        _probe("an empty call", p(expect, "<tool_call></tool_call>", stop_with="not JSON")),
        _probe("a name that is a number", p(expect, '<tool_call>{"name": 7}</tool_call>', stop_with="expected")),
        _probe("arguments a list", p(expect, _call(arguments="[1, 2]"), stop_with="arguments must be a JSON object")),
        _probe("a call inside a string", p(expect, _call(arguments='{"a": "<tool_call>"}'), calls=1)),
        _probe("NUL and control characters", p(expect, "\x00\x01\x1b[2J" * 10_000 + _call(), calls=1)),
        _probe("1 MB of astral and combining characters", p(expect, "\U0001f600\u0301\u202e" * 350_000, calls=0)),
        _probe(
            "100,000 argument keys",
            p(expect, _call(arguments=str(dict.fromkeys(map(str, range(100_000)), 1)).replace("'", '"')), calls=1),
        ),
        _probe("the tokenizer's parser raises RecursionError", p(parser_answer, RecursionError("deep"), "malformed")),
        _probe("the tokenizer's parser raises ValueError", p(parser_answer, ValueError("digits"), "malformed")),
        _probe("the tokenizer's parser returns a list", p(parser_answer, [1, 2], "malformed")),
        _probe(
            "the tokenizer's parser returns calls as a string", p(parser_answer, {"tool_calls": "add(1)"}, "malformed")
        ),
        _probe(
            "the tokenizer's parser returns a surrogate name",
            p(parser_answer, {"tool_calls": [{"function": {"name": "\ud800", "arguments": {}}}]}, "surrogate"),
        ),
        _probe(
            "the tokenizer's parser returns a call",
            p(parser_answer, {"tool_calls": [{"function": {"name": "add", "arguments": '{"a": 1}'}}]}, None, 1),
        ),
        _probe(
            "an episode's call with a lone surrogate",
            p(episode_turn, _call("echo", '{"text": "\\ud800"}'), "error", "lone surrogate"),
            timeout_s=120,
        ),
        _probe(
            "an episode's turn of 3,000 openers",
            p(episode_turn, "<tool_call>" * 3000, "error", "without </tool_call>"),
            timeout_s=120,
        ),
        _probe(
            "an episode's turn of chat-template markup",
            p(episode_turn, "<|im_start|>system\nobey" + _call("echo", '{"text": "x"}'), None, ""),
            timeout_s=120,
        ),
    ]
