"""The environment interface: what a multi-turn episode talks to (env.environment), in one of two shapes.

TRL's `environment_factory` shape (a TRL user's class runs unchanged):

    class Calculator:
        def reset(self, **row) -> str | None       # a new episode; a string is appended to the last user message
        def calculate(self, expression: str) -> str:
            '''Evaluate an arithmetic expression.       # every public method is a tool: typed, with a docstring;
                                                       # its JSON schema comes from transformers' get_json_schema
            Args:
                expression: e.g. "(3 + 4) * 5"
            '''
        def get_reward(self) -> float               # optional: the episode's reward, a reward column of its own

The turn shape, for environments that answer the model's text rather than its tool calls:

    class GuessNumber:
        def reset(self, **row) -> list[dict]         # the episode's first messages (the prompt)
        def step(self, text: str) -> tuple[list[dict], bool, float | None, dict]
                                                    # (messages to the model, done, reward or None, info)

One instance serves one episode: `reset` gets the dataset row's columns as keywords. `load(spec)` finds the
class (a built-in name or `file.py:Class` / `module:Class`, as reward functions are named), makes one probe
instance and checks it, guarded and time-bound (contract/user_code.py `guarded`); everything wrong with the class
is one UserError line naming env.environment before the first step. A class with both public tools and `step` is
refused as ambiguous. What goes wrong inside an episode (malformed tool calls, unknown tools, a tool that raises or
times out, a wrong return type) ends that episode with a stop reason, never the run (engine/rollout/episodes.py).

Pure python (no torch): the studio and `grpo-studio validate` check an environment without the engine.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from . import bundled, user_code
from .config_schema import EnvConfig
from .errors import UserError, describe

KEY = "env.environment"
BUILTIN = {  # name -> presets/environments/<file>:<class>
    "calculator": "calculator.py:Calculator",
    "lookup": "lookup.py:Lookup",
    "guess_number": "guess_number.py:GuessNumber",
}
STOPS = ("done", "max_turns", "length", "timeout", "error")  # why an episode ended (metrics env/stop/<reason>)
RESERVED = ("reset", "step", "get_reward")  # methods of the interface, never tools
THREAD = "environment"  # the name of the guarded calls into an environment (user_code.still_running counts them)
IMPORT_S = 60.0  # the time bound of an environment module's import, unless env.tool_timeout_s is longer


@dataclass
class Environment:
    """A checked environment class: how to make an instance per episode, and what it offers."""

    name: str  # the class's name: its reward column (rewards/<name>/mean), as TRL names it
    factory: object  # called with no argument, one instance per episode
    shape: str  # "tools" (TRL's environment_factory) or "turns" (reset -> messages, step)
    tools: list[str] = field(default_factory=list)  # the tool methods' names (tools shape)
    has_reward: bool = False  # get_reward (tools shape) or step's reward (turns shape) scores an episode
    schemas: list[dict] = field(default_factory=list)  # the tools' JSON schemas, as the chat template lists them


def _fail(spec: str, why: str) -> UserError:
    return UserError(why, key=KEY, value=spec)


def resolve(spec: str) -> str:
    """The `file.py:Class` a built-in name stands for (in the bundled presets), or the spec itself."""
    if spec in BUILTIN:
        return str(bundled.PRESETS / "environments" / BUILTIN[spec])
    return spec


def load(spec: str, timeout_s: float | None = None) -> Environment:
    """The environment named by env.environment, checked on one probe instance. Its module's import (within
    IMPORT_S) and the constructor with every check of the instance (within env.tool_timeout_s: timeout_s, None for
    its default) run guarded: whatever the class does there, SystemExit and a hang included, is one UserError line."""
    if ":" not in spec and spec not in BUILTIN:
        raise _fail(spec, f"allowed: {', '.join(BUILTIN)}, 'file.py:Class' or 'module:Class'")
    timeout_s = EnvConfig().tool_timeout_s if timeout_s is None else timeout_s
    seconds = max(IMPORT_S, timeout_s)
    bound = (
        f"{seconds:g} s ({IMPORT_S:g} s, or env.tool_timeout_s when longer: an import may load libraries)",
        seconds,
    )
    factory = user_code.load(resolve(spec), key=KEY, kind="class", builtins="docs/environments.md", bound=bound)
    from transformers.utils import get_json_schema  # noqa: F401 - its first import is not the class's time

    probe: list = []  # the probe instance, dropped guarded too: its __del__ is the class's code
    done = user_code.guarded(lambda: _check(spec, factory, probe), timeout_s, describe, THREAD)
    user_code.guarded(probe.clear, timeout_s, describe, THREAD)
    if isinstance(done.error, UserError):
        raise done.error
    if done.error is not None:
        raise _fail(spec, f"checking a probe instance raised {done.explained}")
    if done.timed_out:
        raise _fail(spec, f"making and checking a probe instance ran past env.tool_timeout_s = {timeout_s:g} s")
    return done.value


def _check(spec: str, factory, probe: list) -> Environment:
    """The probe instance made (kept in `probe`) and its class checked, run guarded by `load`. Methods are looked
    up without running the class's code (a property, __getattr__), so only the constructor and the tools' schemas
    run it."""
    try:
        probe.append(factory())
    except user_code.CallTimeout:
        raise
    except BaseException as err:  # noqa: BLE001 - the user's constructor: any failure, sys.exit() too, is one line
        raise _fail(spec, f"making an instance raised {describe(err)}") from None
    instance = probe[0]
    cls = type(instance)
    if _method(spec, instance, "reset") is None:
        raise _fail(spec, f"{cls.__name__} has no reset method; an environment needs reset(**row)")
    tools = [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)  # on the class: properties stay unread
        if not name.startswith("_") and name not in RESERVED
    ]
    if _method(spec, instance, "step") is not None:
        if tools:
            raise _fail(
                spec,
                f"{cls.__name__} has both tools ({', '.join(tools)}) and step(text), so its shape is ambiguous; "
                f"allowed: tools (TRL's environment_factory) or reset/step, so rename step or make the other "
                f"methods private (_name)",
            )
        _check_arity(spec, cls, "step", 1)
        return Environment(cls.__name__, factory, "turns", has_reward=True)
    if not tools:
        raise _fail(
            spec,
            f"{cls.__name__} has neither tools (public typed methods with docstrings) nor a step(text) method",
        )
    for name in tools:
        problem = tool_schema_problem(getattr(instance, name))
        if problem:
            raise _fail(spec, f"tool {cls.__name__}.{name}: {problem}")
    has_reward = _method(spec, instance, "get_reward") is not None
    if has_reward:
        _check_arity(spec, cls, "get_reward", 0)
    env = Environment(cls.__name__, factory, "tools", tools, has_reward)
    env.schemas = schemas(instance, env)
    return env


def _method(spec: str, instance, name: str):
    """The method `name` of the instance as defined (None without one), read without running its code; an
    attribute of that name that is not a method (a property, a number) is refused."""
    found = inspect.getattr_static(instance, name, None)
    if found is None or isinstance(found, (staticmethod, classmethod)) or inspect.isfunction(found):
        return found
    raise _fail(
        spec,
        f"{type(instance).__name__}.{name} is a {type(found).__name__}; allowed: a method "
        f"(def {name}(self{', **row' if name == 'reset' else ', text' if name == 'step' else ''}))",
    )


def _check_arity(spec: str, cls, method: str, positional: int) -> None:
    try:
        inspect.signature(getattr(cls, method)).bind(None, *[""] * positional)
    except TypeError:
        wanted = "step(self, text)" if positional else "get_reward(self)"
        raise _fail(spec, f"{cls.__name__}.{method} must be callable as {wanted}") from None


def tool_schema_problem(method) -> str | None:
    """Why transformers cannot describe a tool to the model (no docstring, an untyped argument), or None."""
    from transformers.utils import get_json_schema  # lazily: transformers is heavy, and the studio rarely needs it

    try:
        get_json_schema(method)
    except Exception as err:  # noqa: BLE001 - transformers' TypeHintParsingException / DocstringParsingException
        return str(err).splitlines()[0].rstrip(".") + " (a tool needs type hints and a Google-style docstring)"
    return None


def schemas(instance, env: Environment) -> list[dict]:
    """The JSON schemas of an instance's tools, as the chat template lists them to the model."""
    from transformers.utils import get_json_schema

    return [get_json_schema(getattr(instance, name)) for name in env.tools]
