"""The fault suite's cases, generated: what a hostile or careless user gives `grpo-studio`, and what must follow.

Each case is a command line plus the files it needs, and an expectation:

  refused   exit code 2, exactly one line on stderr, no traceback, and no run directory left behind
  read      a reader meets an odd file: exit code 0 showing what it can (warnings on stderr), or one line and
            exit code 2 when nothing is left to show; never a traceback
  crashed   a non-zero exit code with one line on stderr (the process was killed, or killed itself)

The config cases come from the schema itself (contract/config_keys.py key_info()): for every key, values its type,
bounds or choices forbid. So a key added tomorrow is fuzzed tomorrow. tests/test_fault_suite.py runs the fast
categories on every commit; `grpo-studio bench faults` runs them as real processes, with the slow ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..contract import config

REFUSED, READ, CRASHED = "refused", "read", "crashed"


@dataclass
class Case:
    category: str
    name: str
    argv: list[str]  # {tmp} in an argument is the case's own folder
    expect: str = REFUSED
    files: dict[str, bytes | str] = field(default_factory=dict)  # relative path -> content, written before
    prepare: Callable[[Path], None] | None = None  # anything files cannot say (a directory, a mode)
    slow: bool = False  # trains for long or starts vLLM: `bench faults` only, not tests/test_fault_suite.py

    def materialise(self, tmp: Path) -> list[str]:
        for rel, content in self.files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
        if self.prepare:
            self.prepare(tmp)
        return [arg.replace("{tmp}", str(tmp)) for arg in self.argv]


def train(*args: str) -> list[str]:
    """A `train` into a new run directory of the case's folder, which a refusal must not create."""
    return ["train", *args, "--run-dir", "{tmp}/run"]


def bad_values(info: config.KeyInfo) -> list[str]:
    """Values the key's declared type, bounds or choices forbid, as --set text."""
    if info.type == "bool":
        return ["maybe", "2", ""]
    if info.choices is not None:
        return ["nope", info.choices[-1].upper() + "x", "1e308"]
    if info.type in ("int", "float"):
        out = ["abc", "nan", "inf", "-inf", "1e400"]
        if info.type == "int":
            out += ["1.5", "9" * 40]
        else:
            out += ["1e308", "-1e308"]
        if info.lo is not None:
            out.append(str(info.lo if info.lo_open else info.lo - 1))
        if info.hi is not None:
            out.append(str(info.hi * 10 + 1))
        return list(dict.fromkeys(out))
    return []


# Free-text keys whose bad values are known: the rest take any text.
TEXT_CASES = {
    "model.name": ["x" * 300, "no-such-model-anywhere", "/nonexistent/folder", "{tmp}/notjson"],
    "alerts.webhook": ["http://[::1", "ftp://example.com/hook", "not a url", "http://"],
    "data.source": ["{tmp}/missing.jsonl", "builtin:nope", "{tmp}/empty_prompt.jsonl"],
    "rewards.funcs": ["[]", "['nope']", "['{tmp}/rewards.txt:score']", "['{tmp}/missing.py:score']"],
    "rewards.weights": ["[1e308, 1e308]", "['a', 'b']", "[1, 2, 3]"],
}
TEXT_FILES = {
    "notjson/config.json": "{ not json",
    "rewards.txt": "def score(prompts, completions, **kw):\n    return [1.0] * len(completions)\n",
    "empty_prompt.jsonl": '{"prompt": "1+1?", "answer": "2"}\n{"prompt": "", "answer": "3"}\n',
}
TYPOS = ["model.nme", "train.lr_", "nosection.key", "model", "model.name.extra", "trian.steps", "=1", "model.dtype"]


def config_cases() -> list[Case]:
    out = []
    for info in config.key_info():
        for value in bad_values(info):
            out.append(Case("config", f"{info.key}={value[:24]}", train("--set", f"{info.key}={value}")))
        for value in TEXT_CASES.get(info.key, []):
            out.append(
                Case("config", f"{info.key}={value[:24]}", train("--set", f"{info.key}={value}"), files=TEXT_FILES)
            )
    for key in TYPOS:  # an unknown key, or one without a value
        out.append(
            Case("config", f"typo {key}", train("--set", key if "=" in key or key == "model.dtype" else f"{key}=1"))
        )
    return out


DEEP = "[a]\n" + "x = " + "[" * 3000 + "]" * 3000 + "\n"
RECIPES: dict[str, bytes | str] = {
    "syntax": "[train\nsteps = 3\n",
    "deep nesting": DEEP,
    "not utf-8": b"[train]\nsteps = 3\n# \xff\xfe\n",
    "section is a number": "train = 5\n",
    "unknown section": "[trian]\nsteps = 3\n",
    "unknown key": "[train]\nstpes = 3\n",
    "wrong type": '[train]\nsteps = "three"\n',
    "huge int": "[train]\nsteps = 1" + "0" * 400 + "\n",
    "nan float": "[train]\nlr = nan\n",
    "inf float": "[algo]\nepsilon = inf\n",
    "table in a key": "[train]\nsteps = { a = 1 }\n",
    "list for a number": "[train]\nlr = [1, 2]\n",
    "bool for a number": "[rollout]\nnum_generations = true\n",
    "empty name": '[model]\nname = ""\n',
}


def recipe_cases() -> list[Case]:
    out = [
        Case("recipe", what, train("{tmp}/recipe.toml"), files={"recipe.toml": text}) for what, text in RECIPES.items()
    ]
    out += [
        Case("recipe", "missing file", train("{tmp}/nope.toml")),
        Case("recipe", "a directory", train("{tmp}/folder.toml"), prepare=lambda t: (t / "folder.toml").mkdir()),
        Case("recipe", "unknown preset", train("tiny-arth")),
        Case("recipe", "not a toml name", train("{tmp}/recipe.yaml"), files={"recipe.yaml": "train: 1\n"}),
    ]
    return out


def flag_cases() -> list[Case]:
    out = [
        Case("flags", f"--nproc {n}", ["train", "--nproc", n, "--run-dir", "{tmp}/run"])
        for n in ("0", "-1", "abc", "1.5", "2")
    ]
    out += [
        Case("flags", f"--devices {d!r}", ["train", "--devices", d, "--run-dir", "{tmp}/run"])
        for d in ("a,b", ",", "-1")
    ]
    out += [
        Case("flags", "--run-dir ''", ["train", "--run-dir", ""]),
        Case("flags", "--run-dir a file", ["train", "--run-dir", "{tmp}/file"], files={"file": "x"}),
        Case("flags", "--run-dir non-empty", ["train", "--run-dir", "{tmp}/full"], files={"full/config.toml": ""}),
        Case("flags", "--resume missing", ["train", "--resume", "{tmp}/nope"]),
        Case("flags", "--resume a file", ["train", "--resume", "{tmp}/file"], files={"file": "x"}),
        Case("flags", "--resume no config", ["train", "--resume", "{tmp}/dir"], prepare=lambda t: (t / "dir").mkdir()),
        Case("flags", "--resume empty config", ["train", "--resume", "{tmp}/r"], files={"r/config.toml": ""}),
        Case("flags", "unknown flag", ["train", "--nope"]),
        Case("flags", "unknown command", ["trian"]),
        Case("flags", "--set without =", ["train", "--set", "train.steps", "--run-dir", "{tmp}/run"]),
        Case("flags", "vram --gpu-mem junk", ["vram", "--gpu-mem", "lots"]),
        Case("flags", "vram --mode junk", ["vram", "--mode", "guess"]),
        Case("flags", "vram --solve junk", ["vram", "--solve", "everything"]),
        Case("flags", "runs missing folder", ["runs", "{tmp}/nope"]),
        Case("flags", "report missing run", ["report", "{tmp}/nope"]),
        Case("flags", "export missing run", ["export", "{tmp}/nope"]),
    ]
    return out


SCORE = "def score(prompts, completions, **kwargs):\n    return [1.0] * len(completions)\n"
REWARD_MODULES = {  # a user's reward file, broken at import or by its name: the trainer refuses it while loading
    "syntax error": ("def score(:\n", REFUSED),
    "raises at import": ("raise ValueError('no config for the scorer')\n" + SCORE, REFUSED),
    "KeyboardInterrupt at import": ("raise KeyboardInterrupt\n" + SCORE, REFUSED),
    "SystemExit at import": ("import sys\nsys.exit(3)\n" + SCORE, REFUSED),
    "imports a missing package": ("import no_such_package_here\n" + SCORE, REFUSED),
    "os._exit at import": ("import os\nos._exit(7)\n" + SCORE, CRASHED),
    "not callable": ("score = 3\n", REFUSED),
}


def reward_cases() -> list[Case]:
    """User reward files that fail as they load. These start the trainer (torch), a few seconds each."""
    out = [
        Case(
            "rewards",
            what,
            train("--set", "rewards.funcs=['{tmp}/my_rewards.py:score']"),
            expect=expect,
            files={"my_rewards.py": body},
        )
        for what, (body, expect) in REWARD_MODULES.items()
    ]
    out.append(
        Case(
            "rewards",
            "missing function",
            train("--set", "rewards.funcs=['{tmp}/my_rewards.py:scor']"),
            files={"my_rewards.py": SCORE},
        )
    )
    return out


def _write(name: str, content: bytes) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        (run / name).write_bytes(content)

    return damage


def _append(name: str, content: bytes) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        with open(run / name, "ab") as fh:
            fh.write(content)

    return damage


def _replace_with_folder(name: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = run / name
        if path.is_dir():
            path.rename(run / f"{name}.moved")
            path.write_text("not a folder\n")
        else:
            path.unlink(missing_ok=True)
            path.mkdir()

    return damage


def _unreadable(name: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        (run / name).chmod(0)

    return damage


JSONL = ["metrics.jsonl", "events.jsonl", "samples.jsonl", "histograms.jsonl"]
LINES = {  # a line appended to a JSONL file
    "junk line": b"this is not json\n",
    "torn line": b'{"step": 7, "loss": 0.',
    "NaN literal": b'{"step": 7, "time": 1.0, "loss": NaN, "reward/mean": Infinity}\n',
    "huge integer": b'{"step": 7, "time": 1.0, "loss": 1' + b"0" * 400 + b"}\n",
    "a list": b"[1, 2, 3]\n",
    "wrong types": b'{"step": "seven", "time": "noon", "event": 5, "loss": "low"}\n',
    "200 KB line": b'{"step": 7, "x": "' + b"y" * 200_000 + b'"}\n',
    "binary": bytes(range(256)) + b"\n",
}
WHOLE = {  # a whole file replaced
    "empty": b"",
    "not UTF-8": b"\xff\xfe\x00garbage\n",
    "NUL bytes": b"\x00" * 4096,
}
CONFIG_TEXT = {
    "train = 5": b"train = 5\n",
    "not TOML": b"[[[\n",
    "wrong type": b'[train]\nsteps = "six"\n',
    "unknown key": b"[train]\nstpes = 6\n",
}


def damages() -> list[tuple[str, Callable[[Path], None]]]:
    out = [(f"{name}: {what}", _append(name, line)) for name in JSONL for what, line in LINES.items()]
    out += [
        (f"{name}: {what}", _write(name, content))
        for name in [*JSONL, "config.toml", "trainer.pid"]
        for what, content in WHOLE.items()
    ]
    out += [(f"config.toml: {what}", _write("config.toml", text)) for what, text in CONFIG_TEXT.items()]
    out += [(f"{name}: a folder", _replace_with_folder(name)) for name in [*JSONL, "config.toml", "trainer.pid"]]
    out += [
        ("checkpoints: a file", _replace_with_folder("checkpoints")),
        ("trainer.pid: 10**400", _write("trainer.pid", b"1" + b"0" * 400)),
        (
            "events.jsonl: 60,000 events",
            _append("events.jsonl", b'{"time": 1.0, "event": "info", "message": "x"}\n' * 60_000),
        ),
    ]
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):  # root reads a chmod 000 file anyway
        out += [(f"{name}: unreadable", _unreadable(name)) for name in [*JSONL, "config.toml"]]
    return out


def rundir_cases() -> list[Case]:
    """A finished 6-step run (written without training), damaged one way, read by `runs`, `report`, `doctor`."""
    from .synthetic_run import write_run

    out = []
    for what, damage in damages():

        def prepare(tmp: Path, damage=damage) -> None:
            damage(write_run(tmp / "runs" / "r", 6))

        for argv in (
            ["runs", "{tmp}/runs"],
            ["report", "{tmp}/runs/r", "--out", "{tmp}/report"],
            ["doctor", "{tmp}/runs/r"],
        ):
            out.append(Case("rundir", f"{argv[0]} {what}", argv, expect=READ, prepare=prepare))
    return out


def fast_cases() -> list[Case]:
    """The categories that need no training: run on every commit."""
    return config_cases() + recipe_cases() + flag_cases() + reward_cases() + rundir_cases()
