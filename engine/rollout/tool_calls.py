"""Tool calls in a model turn: found in its text, run guarded with a time bound, every failure a stop reason.

A turn's calls are read with the tokenizer's own response parser where its chat template has one
(transformers' `parse_response`, e.g. Qwen's), else from `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
tags (the format of presets/templates/chatml_tools.jinja, and Hermes/Qwen's). Nothing a model writes or a tool
does stops the run: a malformed call, an unknown tool, a tool that raises (SystemExit too) and one that outlives
env.tool_timeout_s each end the episode with a stop reason (contract/environments.py STOPS).

The parser is total and linear in the text: JSON nested past Python's recursion limit, an integer past its digit
limit, a lone surrogate (\\ud800) and thousands of openers all end in calls or EpisodeEnds, never an exception
of their own. What the environment hands back (a tool's result, reset's and step's messages) becomes plain text
here, inside the guard: its `__str__` is the user's code, cut to env.max_result_chars before anything tokenises
it, and text a tokenizer cannot take (a lone surrogate) ends the episode.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from dataclasses import dataclass

from ...contract import environments, user_code
from ...contract.errors import describe

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_ROLE_CHARS = 64  # a message's role is a word the chat template knows


@dataclass
class Call:
    name: str
    arguments: dict


class EpisodeEnds(Exception):
    """A model turn or an environment ended its episode: `stop` is the reason (error, timeout), the message
    what happened, as the episode's sample records it."""

    def __init__(self, stop: str, message: str):
        super().__init__(message)
        self.stop = stop


def parse(
    text: str, tokenizer=None, ids: list[int] | None = None, prefix: list[int] | None = None, tools=None
) -> list[Call]:
    """The tool calls of one model turn (its text without the end-of-turn token); [] when it makes none.
    A tokenizer's own parser reads the turn's ids after `prefix`, the ids before them, with the tools' schemas
    typing the arguments (as TRL's parse_response). A call that cannot be read raises EpisodeEnds("error")."""
    if tokenizer is not None and ids is not None and _has_parser(tokenizer):
        try:
            if getattr(tokenizer, "response_template", None) is not None:  # transformers >= 5.13: needs the prefix
                message = tokenizer.parse_response(ids, prefix=prefix or [], tools=tools)
            else:  # the legacy response_schema
                message = tokenizer.parse_response(ids)
            calls = [c.get("function", c) for c in (message or {}).get("tool_calls") or []]
        except Exception as err:  # noqa: BLE001 - transformers' parser on model-written text: any failure
            raise EpisodeEnds("error", f"malformed tool call ({describe(err)})") from None
        return [_checked(c) for c in calls]
    return [_checked(_json(body)) for body in _tagged(text)]


def _tagged(text: str) -> list[str]:
    """The bodies of the <tool_call>…</tool_call> tags, each from an opener to the first closer after it: one
    pass over the text (a lazy regex would rescan the rest of the text from every opener)."""
    bodies, at = [], 0
    while (start := text.find(OPEN, at)) >= 0:
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:  # an opener without a closer after it: no further call can close either
            break
        bodies.append(text[start + len(OPEN) : end])
        at = end + len(CLOSE)
    if not bodies and OPEN in text:
        raise EpisodeEnds("error", "malformed tool call: <tool_call> without </tool_call>")
    return bodies


def _constant(name: str):
    raise EpisodeEnds("error", f"malformed tool call: {name} is not a JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise EpisodeEnds("error", f"malformed tool call: {text[:40]} is too large for a float")
    return number


def _json(body: str):
    """The JSON of a call; NaN, Infinity and a number that overflows a float (1e999), which Python's json would
    hand the tool as nan/inf, are malformed."""
    try:
        return json.loads(body, parse_constant=_constant, parse_float=_finite)
    except json.JSONDecodeError as err:
        raise EpisodeEnds("error", f"malformed tool call: not JSON ({err.msg} at char {err.pos})") from None
    except (ValueError, RecursionError) as err:  # an integer past Python's digit limit; nesting past recursion's
        raise EpisodeEnds("error", f"malformed tool call: JSON Python cannot read ({describe(err)})") from None


def _has_parser(tokenizer) -> bool:
    return bool(getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None))


def _checked(call) -> Call:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise EpisodeEnds("error", 'malformed tool call: expected {"name": <tool name>, "arguments": {...}}')
    name = call["name"]
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some templates carry the arguments as a JSON string
        try:
            arguments = _json(arguments)
        except EpisodeEnds:
            arguments = None
    if not isinstance(arguments, dict):
        raise EpisodeEnds("error", f"malformed tool call to {name[:80]!r}: arguments must be a JSON object")
    surrogate = _lone_surrogate([name, arguments])
    if surrogate:
        raise EpisodeEnds("error", f"malformed tool call to {name[:80]!r}: {surrogate}")
    return Call(name, arguments)


def _lone_surrogate(value) -> str | None:
    """Where a string inside JSON data holds a lone surrogate (JSON's "\\ud800" escape), which no tokenizer can
    encode; None when every string is text. Iterative: the data may be nested as deep as JSON allows."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            problem = unencodable(item)
            if problem:
                return problem
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def unencodable(text: str) -> str | None:
    """Why `text` cannot be encoded (a lone surrogate, and where), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"a lone surrogate (\\u{ord(text[err.start]):04x}) at character {err.start}, which no tokenizer encodes"
    return None


def bounded(fn, timeout_s: float, what):
    """fn() guarded (contract/user_code.py) within timeout_s seconds: what it raises, SystemExit and
    KeyboardInterrupt included, or running past the bound is EpisodeEnds "error" or "timeout". Converting what it
    returns belongs in fn, so that is bounded too. `what` names the call in the message (or says it, once fn ran)."""
    explain = lambda err: err.args[0] if isinstance(err, EpisodeEnds) else describe(err)  # noqa: E731
    done = user_code.guarded(fn, timeout_s, explain, environments.THREAD)
    what = what() if callable(what) else what
    if done.timed_out:
        raise EpisodeEnds("timeout", f"{what} ran past env.tool_timeout_s = {timeout_s:g} s")
    if isinstance(done.error, EpisodeEnds):  # fn's own verdict on what the environment returned
        raise EpisodeEnds(done.error.stop, done.explained)
    if done.error is not None:
        raise EpisodeEnds("error", f"{what} raised {done.explained}")
    return done.value


def awaited(value):
    """value, or what it comes to when it is awaitable (an `async def` method), run to its end in this thread: the
    guard's worker, so the bound holds."""
    if not inspect.isawaitable(value):
        return value

    async def wait():
        return await value

    return asyncio.run(wait())


def _plain(value, what: str) -> str:
    """A string the environment returned, as a plain str (a subclass's overrides are the user's code)."""
    if not isinstance(value, str):
        raise EpisodeEnds("error", f"{what} returned {type(value).__name__}, not a string")
    return str.__str__(value)


def _fit(text: str, what: str, limit: int) -> str:
    """text cut to `limit` characters (env.max_result_chars), saying so; text a tokenizer cannot encode ends the
    episode."""
    if len(text) > limit:
        text = f"{text[:limit]}... [{len(text)} characters, cut to env.max_result_chars = {limit}]"
    problem = unencodable(text)
    if problem:
        raise EpisodeEnds("error", f"{what} returned text with {problem}")
    return text


def plain_text(value, what: str, limit: int) -> str:
    """What the environment returned as text (reset's observation), plain and cut to `limit` characters. Runs
    inside the guard."""
    return _fit(_plain(value, what), what, limit)


def plain_messages(value, what: str, limit: int) -> list[dict]:
    """The environment's messages as plain {"role", "content"} dicts (and a tool message's "name"), holding
    `limit` characters in all: the text that passes it is cut there and the messages after it are dropped unread.
    Runs inside the guard (dict and str subclasses are the user's code)."""
    if not isinstance(value, list):
        raise EpisodeEnds("error", f"{what} returned {type(value).__name__}, not a list of messages")
    messages, left = [], limit
    for m in value:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise EpisodeEnds("error", f'{what} returned a list holding {type(m).__name__}, not {{"role", "content"}}')
        message = {"role": _plain(m["role"], what), "content": _plain(m["content"], what)}
        if isinstance(m.get("name"), str):
            message["name"] = _plain(m["name"], what)
        for key in [k for k in ("role", "name") if k in message]:
            if len(message[key]) > MAX_ROLE_CHARS:
                raise EpisodeEnds("error", f"{what} returned a message whose {key} is over {MAX_ROLE_CHARS} characters")
            _fit(message[key], what, MAX_ROLE_CHARS)  # a role a tokenizer can encode
        left -= len(message["role"])
        full = len(message["content"])
        message["content"] = _fit(message["content"], what, max(left, 0))
        messages.append(message)
        if full >= left:  # the budget is spent: the messages after this one are dropped
            break
        left -= full
    return messages


def run_calls(instance, tools: list[str], calls: list[Call], timeout_s: float, limit: int, counts: dict) -> list[dict]:
    """The tool messages answering `calls`, all of them run guarded within timeout_s together (a turn of many
    calls cannot multiply the bound), each result made plain text and cut so that they hold `limit` characters
    together; counts[name] += 1 per call begun."""
    for call in calls:
        if call.name not in tools:
            raise EpisodeEnds("error", f"unknown tool {call.name[:80]!r}; tools: {', '.join(tools)}")
    started: list[str] = []  # the calls begun, in order: the last one is the one that failed

    def run() -> list[dict]:
        messages, left = [], limit
        for call in calls:
            started.append(call.name)
            result = awaited(getattr(instance, call.name)(**call.arguments))
            text = _plain(result if isinstance(result, str) else str(result), f"tool {call.name}")
            messages.append({"role": "tool", "name": call.name, "content": _fit(text, f"tool {call.name}", left)})
            left = max(0, left - len(text))
        return messages

    try:
        return bounded(run, timeout_s, lambda: f"tool {started[-1]}" if started else "a tool")
    finally:
        for name in started:
            counts[name] = counts.get(name, 0) + 1
