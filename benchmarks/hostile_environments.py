"""The fault suite's hostile cases for environments (benchmarks/fault_probes.py says how they run).

A user's environment class (env.environment), written to a file and run the way a user runs it: a short real
`grpo-studio train tiny-arith` in a process of its own (the bundled 1.2M-parameter model, two steps of two prompts
x two episodes, a chat template its character vocabulary can carry). Whatever the class does, the run either
finishes, with the failure recorded where the user looks (a sample's stop reason, a reward_error event), or stops
in one line on stderr naming env.environment, exit code 2, never a traceback, a hang or the user's exit code.
Classes refused while loading are fast cases; the runs that train are slow (`grpo-studio bench faults` only: the
issue's cases run in-process in tests/test_environments_hostile.py).

The tiny model writes no tool calls (its vocabulary has no braces), so what a tool returns is probed in-process on a
real episode instead (`episode_of`: SmolLM2's tokenizer, the shipped ChatML tools template, a scripted model turn).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

from .fault_probes import Probe

CATEGORY = "environments"
TRAIN_TIMEOUT_S = 180

# The tiny model's chat template: each message's text as it is, an assistant turn ending in its <eos>.
TEMPLATE = """{%- for m in messages -%}
{%- if m['role'] == 'assistant' -%}
{{- m['content'] or '' -}}
{%- for c in m['tool_calls'] or [] -%}{%- if c['function'] is defined -%}{%- set c = c['function'] -%}{%- endif -%}
{{- c['name'] + (c['arguments'] | tojson) -}}
{%- endfor -%}
{{- '<eos>' -}}
{%- else -%}{{- m['content'] -}}{%- endif -%}
{%- endfor -%}
"""

# Every case's file starts with these: a well-behaved class of each shape, which the cases' classes spoil.
BASE = '''
import os, sys, threading, time

class Tools:
    def reset(self, **row):
        return None

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first
            b: the second
        """
        return a + b

    def get_reward(self) -> float:
        return 1.0


class Turns:
    def reset(self, **row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        return [{"role": "user", "content": "again="}], False, 0.5, {}


class Echo(Tools):
    def echo(self, text: str) -> str:
        """Say the text back.

        Args:
            text: anything
        """
        return text
'''
SMALL = [
    "train.steps=2",
    "train.prompts_per_step=2",
    "rollout.num_generations=2",
    "train.eval_every=0",
    "train.save_every=0",
    "train.max_bad_steps=2",
    "env.tool_timeout_s=1",
    "env.max_turns=2",
]


def train(tmp: Path, body: str, sets: tuple[str, ...]) -> tuple[int | None, list[str], list[dict], list[dict]]:
    """`grpo-studio train tiny-arith` with the class E of BASE + body: (exit code or None when it hung, stderr's
    lines, events, samples)."""
    (tmp / "env.py").write_text(BASE + body)
    (tmp / "tiny.jinja").write_text(TEMPLATE)
    argv = ["train", "tiny-arith", "--run-dir", str(tmp / "run")]
    for key in [f"env.environment={tmp}/env.py:E", f"data.chat_template={tmp}/tiny.jinja", *SMALL, *sets]:
        argv += ["--set", key]
    from .faults_bench import run_process

    done = run_process(argv, tmp, TRAIN_TIMEOUT_S)
    if done.code is None:
        return None, [], [], []
    lines = [line for line in done.stderr.splitlines() if line.strip()]

    def rows(name: str) -> list[dict]:
        path = tmp / "run" / name
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    return done.code, lines, rows("events.jsonl"), rows("samples.jsonl")


def _verdict(code, lines: list[str]) -> str | None:
    if code is None:
        return f"still running after {TRAIN_TIMEOUT_S} s"
    if any("Traceback" in line for line in lines):
        return "a traceback:\n" + "\n".join(lines[-12:])
    return None


def refused(body: str, says: str, *sets: str, tmp: Path) -> str | None:
    """Refused while loading: exit 2, one line naming env.environment and saying `says`, no run directory."""
    code, lines, _, _ = train(tmp, body, sets)
    wrong = _verdict(code, lines)
    if wrong:
        return wrong
    if code != 2 or len(lines) != 1 or "env.environment" not in lines[0] or says not in lines[0]:
        return f"exit {code}, stderr {lines[-3:]}; expected exit 2 and one line naming env.environment: {says!r}"
    if (tmp / "run").exists():
        return "the refused run left its run directory"
    return None


def refused_folder(tmp: Path) -> str | None:
    """env.environment naming a folder called like a .py file: refused as a folder, not as a missing file."""
    (tmp / "envdir.py").mkdir()
    return refused("", "envdir.py' is a folder", f"env.environment={tmp}/envdir.py:E", tmp=tmp)


def stops(body: str, says: str, *sets: str, tmp: Path) -> str | None:
    """Every episode failed: skipped steps, then the run stops in one line (environment_failed), exit 2."""
    code, lines, events, _ = train(tmp, body, sets)
    wrong = _verdict(code, lines)
    if wrong:
        return wrong
    if code != 2 or len(lines) != 1 or "environment_failed" not in lines[0] or says not in lines[0]:
        return f"exit {code}, stderr {lines[-3:]}; expected exit 2 and one environment_failed line saying {says!r}"
    skipped = [e for e in events if e["event"] == "skipped_step"]
    if len(skipped) != 2 or not any(e["event"] == "environment_failed" for e in events):
        return f"events: {[e['event'] for e in events]}; expected 2 skipped_step and environment_failed"
    return None


def crashes(body: str, *sets: str, tmp: Path) -> str | None:
    """os._exit() ends the process, which no guard can stop: one line, a non-zero exit and a `crashed` event."""
    code, lines, events, _ = train(tmp, body, sets)
    wrong = _verdict(code, lines)
    if wrong:
        return wrong
    if code in (0, 2) or len(lines) != 1 or not any(e["event"] == "crashed" for e in events):
        return f"exit {code}, stderr {lines[-3:]}; expected a crash in one line with a crashed event"
    return None


def finishes(body: str, check, *sets: str, tmp: Path) -> str | None:
    """The run finishes (exit 0) and check(events, samples) holds: the failure is recorded where it belongs."""
    code, lines, events, samples = train(tmp, body, sets)
    wrong = _verdict(code, lines)
    if wrong:
        return wrong
    if code != 0 or not any(e["event"] == "finished" for e in events):
        return f"exit {code}, stderr {lines[-3:]}; expected the run to finish"
    return check(events, samples)


def reward_error(says: str, events: list[dict], samples: list[dict]) -> str | None:
    """get_reward's failure is a reward_error naming the class and a sample, and the column is None."""
    errors = [e for e in events if e["event"] == "reward_error" and e.get("function") == "E"]
    if not errors or says not in errors[0]["message"] or not isinstance(errors[0].get("sample"), int):
        return f"reward_error events: {errors[:1]}; expected one for E saying {says!r} with its sample"
    if any(s["rewards"].get("E") is not None for s in samples):
        return "a failed get_reward left a reward in its column"
    return None


def columns(names: set[str], events: list[dict], samples: list[dict]) -> str | None:
    """The samples' reward columns include `names`."""
    have = set(samples[0]["rewards"]) if samples else set()
    return None if names <= have else f"reward columns {sorted(have)}; expected {sorted(names)} among them"


def only_step_metric(body: str, tmp: Path) -> str | None:
    """Of step()'s info["metrics"], only a finite number under a word name is logged (env/step/ok = 2 every
    step); the rest is ignored, as the rest of info is, and the run finishes."""
    wrong = finishes(body, lambda events, samples: None, tmp=tmp)
    if wrong:
        return wrong
    rows = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    seen = [{k: v for k, v in row.items() if k.startswith("env/step/")} for row in rows]
    return None if rows and all(s == {"env/step/ok": 2.0} for s in seen) else f"env/step/* by step: {seen}"


def episode_stops(stop: str, says: str, events: list[dict], samples: list[dict]) -> str | None:
    """Some episode of the samples ended with `stop`, its why saying `says`."""
    ended = [s["episode"] for s in samples if s["episode"]["stop"] == stop and says in s["episode"]["why"]]
    if not ended:
        return f"no sample's episode ended {stop!r} saying {says!r}: {[s['episode'] for s in samples[:2]]}"
    return None


def bind(fn, *args, **keywords):
    """A probe's check(tmp): fn(*args, tmp=tmp, **keywords)."""
    return functools.partial(_with_tmp, fn, args, keywords)


def _with_tmp(fn, args: tuple, keywords: dict, tmp: Path):
    return fn(*args, tmp=tmp, **keywords)


# ---- in-process: what a tool returns, on a real episode ------------------------------------------------


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from ..engine.model.policy_loader import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path("smollm2-135m-instruct"))


def episode_of(tmp: Path, cls: str, body: str = "", **env_keys):
    """(Episodes, a started episode) of class `cls` of BASE + body, on SmolLM2's tokenizer and the shipped ChatML
    tools template, env.tool_timeout_s = 1 unless given."""
    from ..contract import environments
    from ..contract.config import EnvConfig
    from ..engine.rollout import tool_template
    from ..engine.rollout.episodes import Episodes

    path = tmp / f"env_{cls.lower()}.py"
    path.write_text(BASE + body)
    cfg = EnvConfig(environment=f"{path}:{cls}", **{"tool_timeout_s": 1.0, **env_keys})
    env = environments.load(cfg.environment, cfg.tool_timeout_s)
    episodes = Episodes(env, _tokenizer(), tool_template.CHATML_TOOLS.read_text(), cfg, 400)
    return episodes, episodes.start({"prompt": "hi"}, "prompt")


def model_turn(episodes, episode, text: str) -> list[int]:
    """The model's turn `text` (and its end-of-turn token), as the sampler hands it over; its ids."""
    ids = episodes.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
    episodes._model_turn(episode, ids, [-0.5] * len(ids), ended=True)
    return ids


def tool_result(body: str, stop: str | None, says: str, tmp: Path, calls: int = 1, **env_keys) -> str | None:
    """The model calls E.hostile(x=1) `calls` times in one turn: the episode ends `stop` saying `says`, or goes
    on (stop None) with the result's text, as the next tool message, saying `says`."""
    episodes, episode = episode_of(tmp, "E", body, **env_keys)
    call = '<tool_call>{"name": "hostile", "arguments": {"x": 1}}</tool_call>'
    start = time.monotonic()
    model_turn(episodes, episode, call * calls)
    took = time.monotonic() - start
    if took > 30:
        return f"the turn took {took:.0f} s"
    if episode.stop != stop:
        return f"ended {episode.stop!r} ({episode.why}), expected {stop!r}"
    shown = episode.why if stop else (episode.messages[-1]["content"] if episode.messages else "")
    if says not in shown:
        return f"{'why' if stop else 'the tool message'} {shown[:300]!r} does not say {says!r}"
    return None


HOSTILE_TOOL = '''
class E(Tools):
    def hostile(self, x: int) -> str:
        """A tool that misbehaves.

        Args:
            x: anything
        """
        return make(x)

'''


def _tool(returns: str, stop: str | None, says: str, calls: int = 1, **env_keys):
    """A tool case: `returns` defines make(x), what the tool returns."""
    return bind(tool_result, HOSTILE_TOOL + returns, stop, says, calls=calls, **env_keys)


def _cls(source: str) -> str:
    return "\n" + source.strip("\n") + "\n"


def cases() -> list:
    p = bind

    def train_probe(name: str, check, slow: bool | None = None) -> Probe:
        """A real `train` process: refused ones stop while loading (as the rewards category's), the others train
        for longer than the fast suite's few seconds."""
        slow = check.args[0] is not refused if slow is None else slow
        return Probe(CATEGORY, name, check, timeout_s=TRAIN_TIMEOUT_S + 30, slow=slow)

    def tool_probe(name: str, check) -> Probe:
        return Probe(CATEGORY, name, check, timeout_s=120)

    ok = lambda events, samples: None  # noqa: E731 - finishing is the whole check
    return [
        # ---- refused while loading: one line naming env.environment, exit 2, no run directory
        train_probe(
            "constructor raises", p(refused, _cls("class E(Tools):\n def __init__(self): 1/0"), "ZeroDivision")
        ),
        train_probe(
            "constructor sys.exit(3)",
            p(refused, _cls("class E(Tools):\n def __init__(self): sys.exit(3)"), "SystemExit"),
        ),
        train_probe(
            "constructor KeyboardInterrupt",
            p(refused, _cls("class E(Tools):\n def __init__(self): raise KeyboardInterrupt"), "KeyboardInterrupt"),
        ),
        train_probe(
            "constructor spins forever",
            p(refused, _cls("class E(Tools):\n def __init__(self):\n  while True: pass"), "env.tool_timeout_s = 1"),
        ),
        train_probe(
            "constructor sleeps in C",
            p(refused, _cls("class E(Tools):\n def __init__(self): time.sleep(10**6)"), "env.tool_timeout_s = 1"),
        ),
        train_probe("import sys.exit(4)", p(refused, "sys.exit(4)\nclass E(Tools): pass\n", "SystemExit")),
        train_probe("import KeyboardInterrupt", p(refused, "raise KeyboardInterrupt\n", "KeyboardInterrupt")),
        train_probe("import spins forever", p(refused, "while True: pass\n", "ran past 60 s"), slow=True),
        train_probe(
            "tools and step together",
            p(refused, _cls("class E(Tools):\n def step(self, text): return [], True, 1.0, {}"), "ambiguous"),
        ),
        train_probe(
            "get_reward a raising property",
            p(refused, _cls("class E(Tools):\n @property\n def get_reward(self): raise RuntimeError('x')"), "property"),
        ),
        train_probe(
            "__getattribute__ raises on everything",
            p(
                refused,
                _cls("class E(Tools):\n def __getattribute__(self, name): raise SystemExit(9)"),
                "SystemExit",
            ),
        ),
        train_probe(
            "a metaclass whose dir() hangs",
            p(
                refused,
                _cls("class M(type):\n def __dir__(cls):\n  while True: pass\nclass E(Tools, metaclass=M): pass"),
                "env.tool_timeout_s = 1",
            ),
        ),
        train_probe("E is a number", p(refused, "E = 5\n", "is not callable")),
        # ---- every episode fails: skipped steps, then one environment_failed line
        train_probe(
            "constructor raises on its second instance",
            p(
                stops,
                _cls("made = []\nclass E(Tools):\n def __init__(self):\n  made.append(1)\n  if len(made) > 1: 1/0"),
                "making an instance raised ZeroDivisionError",
            ),
        ),
        train_probe(
            "reset raises", p(stops, _cls("class E(Tools):\n def reset(self, **row): 1/0"), "reset raised ZeroDivision")
        ),
        train_probe(
            "reset sys.exit(5)", p(stops, _cls("class E(Tools):\n def reset(self, **row): sys.exit(5)"), "SystemExit")
        ),
        train_probe(
            "reset KeyboardInterrupt (turn shape)",
            p(
                stops,
                _cls("class E(Turns):\n def reset(self, **row): raise KeyboardInterrupt"),
                "KeyboardInterrupt",
            ),
        ),
        train_probe(
            "reset spins forever",
            p(stops, _cls("class E(Tools):\n def reset(self, **row):\n  while True: pass"), "reset ran past"),
        ),
        train_probe(
            "reset returns a surrogate",
            p(
                stops,
                _cls("class E(Turns):\n def reset(self, **row): return [{'role': 'user', 'content': '\\ud800'}]"),
                "lone surrogate",
            ),
        ),
        train_probe(
            "step returns the reward 10**400",
            p(
                stops,
                _cls("class E(Turns):\n def step(self, text): return [], True, 10**400, {}"),
                "too large for a float",
            ),
        ),
        train_probe(
            "step returns done whose bool raises",
            p(
                stops,
                _cls(
                    "class D:\n def __bool__(self): raise SystemExit(6)\nclass E(Turns):\n def step(self, text): return [], D(), None, {}"
                ),
                "step raised SystemExit",
            ),
        ),
        train_probe(
            "step returns a 1,000-character role",
            p(
                stops,
                _cls(
                    "class E(Turns):\n def step(self, text): return [{'role': 'x' * 1000, 'content': ''}], False, None, {}"
                ),
                "role",
            ),
        ),
        # ---- the run finishes, the failure recorded where the user looks
        train_probe(
            "get_reward always raises",
            p(
                finishes,
                _cls("class E(Tools):\n def get_reward(self): raise ValueError('no score')"),
                functools.partial(reward_error, "no score"),
            ),
        ),
        train_probe(
            "get_reward returns 10**400",
            p(
                finishes,
                _cls("class E(Tools):\n def get_reward(self): return 10**400"),
                functools.partial(reward_error, "too large"),
            ),
        ),
        train_probe(
            "env.environment names a folder",
            refused_folder,
            slow=False,
        ),
        train_probe(
            "get_reward sys.exit(7)",
            p(
                finishes,
                _cls("class E(Tools):\n def get_reward(self): sys.exit(7)"),
                functools.partial(reward_error, "SystemExit"),
            ),
        ),
        train_probe(
            "get_reward returns None, the only reward",
            p(
                finishes,
                _cls("class E(Tools):\n def get_reward(self): return None"),
                functools.partial(reward_error, "get_reward returned NoneType (None, not a number)"),
                "rewards.funcs=[]",
            ),
        ),
        train_probe(
            "step reports metrics of every wrong kind",
            p(
                only_step_metric,
                _cls(
                    "class E(Turns):\n def step(self, text):\n  return [], True, 1.0, {'metrics': {'ok': 2, 'nan': "
                    "float('nan'), 'big': 10**400, 'obj': object(), 'bad name!': 1, 'x' * 65: 1, 7: 1, 'txt': '3'}}"
                ),
            ),
        ),
        train_probe(
            "reset sets the recursion limit to 60",
            p(finishes, _cls("class E(Tools):\n def reset(self, **row): sys.setrecursionlimit(60)"), ok),
        ),
        train_probe(
            "reset makes float64 torch's default dtype",
            p(
                finishes,
                _cls("import torch\nclass E(Tools):\n def reset(self, **row): torch.set_default_dtype(torch.float64)"),
                ok,
            ),
        ),
        train_probe(
            "reset ignores SIGTERM",
            p(
                stops,
                _cls("import signal\nclass E(Tools):\n def reset(self, **row): signal.signal(signal.SIGTERM, 1)"),
                "reset raised ValueError: signal only works in main thread",
            ),
        ),
        train_probe(
            "get_reward swallows the timeout and spins on",
            p(
                stops,
                _cls(
                    "class E(Tools):\n def get_reward(self):\n  while True:\n   try:\n    while True: pass\n"
                    "   except BaseException: pass"
                ),
                "8 calls into the environment are still running past env.tool_timeout_s = 1 s",
                "train.steps=5",
            ),
        ),
        train_probe(
            "get_reward's float hangs",
            p(
                finishes,
                _cls(
                    "class F:\n def __float__(self):\n  while True: pass\nclass E(Tools):\n def get_reward(self): return F()"
                ),
                functools.partial(reward_error, "env.tool_timeout_s"),
            ),
        ),
        train_probe(
            "reset fails on every other call",
            p(
                finishes,
                _cls("n = []\nclass E(Tools):\n def reset(self, **row):\n  n.append(1)\n  if len(n) % 2: 1/0"),
                functools.partial(episode_stops, "error", "reset raised ZeroDivisionError"),
            ),
        ),
        train_probe(
            "reset returns a str subclass whose methods raise",
            p(
                finishes,
                _cls(
                    "class S(str):\n def __str__(self): 1/0\n def __len__(self): 1/0\nclass E(Tools):\n def reset(self, **row): return S('=')"
                ),
                ok,
                "rollout.max_prompt_len=32",
            ),
        ),
        train_probe(
            "reset returns 10 MB",
            p(
                finishes,
                _cls("class E(Tools):\n def reset(self, **row): return '=' * 10_000_000"),
                ok,
                "env.max_result_chars=20",
                "rollout.max_prompt_len=128",
            ),
        ),
        train_probe(
            "step returns 1,000,000 messages",
            p(
                finishes,
                _cls(
                    "class E(Turns):\n def step(self, text): return [{'role': 'user', 'content': 'ab'}] * 10**6, False, 1.0, {}"
                ),
                ok,
            ),
        ),
        train_probe(
            "reset calls os._exit(7)", p(crashes, _cls("class E(Tools):\n def reset(self, **row): os._exit(7)"))
        ),
        train_probe(  # exit status 0 without the run's end is a crash too
            "reset calls os._exit(0)", p(crashes, _cls("class E(Tools):\n def reset(self, **row): os._exit(0)"))
        ),
        train_probe(
            "a module thread os._exit(0)s mid-run",
            p(
                crashes,
                # the module's thread ends the process once an episode has begun (not after a wall-clock delay,
                # which a fast run can outlive)
                "begun = threading.Event()\n"
                "def _later():\n begun.wait()\n os._exit(0)\n"
                "threading.Thread(target=_later, daemon=True).start()\n"
                "class E(Tools):\n def reset(self, **row):\n  begun.set()\n  time.sleep(1)\n",
            ),
        ),
        train_probe(  # the trainer's exit is bounded (cli/train_cmd.py bound_exit)
            "an atexit handler sleeps forever",
            p(finishes, "import atexit\natexit.register(lambda: time.sleep(10**6))\nclass E(Tools): pass\n", ok),
        ),
        train_probe(
            "a non-daemon thread sleeps forever",
            p(finishes, "threading.Thread(target=lambda: time.sleep(10**6)).start()\nclass E(Tools): pass\n", ok),
        ),
        train_probe(
            "a class named like a reward function",
            p(
                finishes,
                _cls("class correctness(Tools): pass\nE = correctness"),
                functools.partial(columns, {"correctness", "correctness_2"}),
            ),
        ),
        train_probe(
            "async methods that spin",
            p(
                finishes,
                _cls("class E(Tools):\n async def get_reward(self):\n  while True: pass"),
                functools.partial(reward_error, "get_reward ran past env.tool_timeout_s = 1 s"),
            ),
        ),
        train_probe(
            "__del__ spins forever", p(finishes, _cls("class E(Tools):\n def __del__(self):\n  while True: pass"), ok)
        ),
        train_probe(
            "step spins on every other call",
            p(
                finishes,
                _cls(
                    "n = []\nclass E(Turns):\n def step(self, text):\n  n.append(1)\n  while len(n) % 2: pass\n  return [], True, 1.0, {}"
                ),
                functools.partial(episode_stops, "timeout", "step ran past env.tool_timeout_s = 1"),
            ),
        ),
        # ---- what a tool returns, in-process on a real episode
        tool_probe(
            "tool result's __str__ raises",
            _tool(
                "class R:\n def __str__(self): 1/0\ndef make(x): return R()",
                "error",
                "tool hostile raised ZeroDivisionError",
            ),
        ),
        tool_probe(
            "tool result's __str__ spins",
            _tool(
                "class R:\n def __str__(self):\n  while True: pass\ndef make(x): return R()",
                "timeout",
                "tool hostile ran past env.tool_timeout_s = 1",
            ),
        ),
        tool_probe("tool sleeps in C", _tool("def make(x): time.sleep(10**6)", "timeout", "ran past")),
        tool_probe("tool sys.exit(8)", _tool("def make(x): sys.exit(8)", "error", "SystemExit")),
        tool_probe(
            "tool KeyboardInterrupt", _tool("def make(x): raise KeyboardInterrupt", "error", "KeyboardInterrupt")
        ),
        tool_probe("tool returns a lone surrogate", _tool("def make(x): return '\\ud800'", "error", "lone surrogate")),
        tool_probe(
            "tool returns 10 MB",
            _tool(
                "def make(x): return 'ab' * 5_000_000", None, "cut to env.max_result_chars = 60", max_result_chars=60
            ),
        ),
        tool_probe(
            "tool returns 10 MB, default cut",
            _tool("def make(x): return 'ab' * 5_000_000", "length", "would pass rollout.max_completion_len"),
        ),
        tool_probe("tool recurses without end", _tool("def make(x): return make(x)", "error", "RecursionError")),
        tool_probe(
            "300 calls of a slow tool in one turn",
            _tool("def make(x):\n time.sleep(0.05)\n return 'ok'", "timeout", "env.tool_timeout_s = 1", calls=300),
        ),
        tool_probe(
            "tool returns a str subclass whose methods raise",
            _tool(
                "class S(str):\n def __str__(self): 1/0\n def __len__(self): 1/0\ndef make(x): return S('fine')",
                None,
                "fine",
            ),
        ),
    ]
