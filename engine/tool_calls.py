"""Tool calls in a model turn: found in its text, run with a time bound, every failure a stop reason.

A turn's calls are read with the tokenizer's own response parser where its chat template has one
(transformers' `parse_response`, e.g. Qwen's), else from `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
tags (the format of presets/templates/chatml_tools.jinja, and Hermes/Qwen's). Nothing a model writes or a tool
does stops the run: a malformed call, an unknown tool, a tool that raises and one that outlives
env.tool_timeout_s each end the episode with a stop reason (contract/environments.py STOPS).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass

from grpo_studio.contract.errors import describe

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPEN = "<tool_call>"


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
        except Exception as err:  # noqa: BLE001 - transformers' parser on model-written text: any failure
            raise EpisodeEnds("error", f"malformed tool call ({describe(err)})") from None
        calls = [c.get("function", c) for c in (message or {}).get("tool_calls") or []]
        return [_checked(c) for c in calls]
    found = CALL.findall(text)
    if not found and OPEN in text:
        raise EpisodeEnds("error", "malformed tool call: <tool_call> without </tool_call>")
    calls = []
    for body in found:
        try:
            calls.append(_checked(json.loads(body)))
        except json.JSONDecodeError as err:
            raise EpisodeEnds("error", f"malformed tool call: not JSON ({err.msg} at char {err.pos})") from None
    return calls


def _has_parser(tokenizer) -> bool:
    return bool(getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None))


def _checked(call) -> Call:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise EpisodeEnds("error", 'malformed tool call: expected {"name": <tool name>, "arguments": {...}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some templates carry the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    if not isinstance(arguments, dict):
        raise EpisodeEnds("error", f"malformed tool call to {call['name']!r}: arguments must be a JSON object")
    return Call(call["name"], arguments)


def bounded(fn, timeout_s: float, what: str):
    """fn() within timeout_s seconds (0 = no bound). Its exception, or running past the bound, is
    EpisodeEnds: "error" or "timeout". A call past its bound is left to finish on a daemon thread (Python cannot
    stop a thread); its result is never read."""
    if not timeout_s:
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - user code
            raise EpisodeEnds("error", f"{what} raised {describe(err)}") from None
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - carried to the caller's thread
            box["error"] = err

    worker = threading.Thread(target=run, daemon=True, name=f"grpo-studio {what}")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise EpisodeEnds("timeout", f"{what} ran past env.tool_timeout_s = {timeout_s:g} s")
    if "error" in box:
        raise EpisodeEnds("error", f"{what} raised {describe(box['error'])}")
    return box["value"]


def run_calls(instance, tools: list[str], calls: list[Call], timeout_s: float, counts: dict) -> list[dict]:
    """The tool messages answering `calls`, each run within timeout_s; counts[name] += 1 per call made."""
    messages = []
    for call in calls:
        if call.name not in tools:
            raise EpisodeEnds("error", f"unknown tool {call.name!r}; tools: {', '.join(tools)}")
        counts[call.name] = counts.get(call.name, 0) + 1
        method = getattr(instance, call.name)
        result = bounded(lambda: method(**call.arguments), timeout_s, f"tool {call.name}")  # noqa: B023 - run now
        messages.append({"role": "tool", "name": call.name, "content": str(result)})
    return messages
