"""Room-to-room import rules (docs/design.md, "Layers"), read from the source: every import statement, lazy ones
inside functions included, relative ones resolved, and module names written into strings (a subprocess's
`-m grpo_studio.X`, importlib) count as arrows too.

- Top-level rooms: RULES below, the table in docs/design.md.
- engine/'s rooms by phase: each room's `__init__` docstring ends with "May import: ..."; a room may import
  itself, the engine's root modules (engine/faults.py, __version__) and what its line names, and the declared
  arrows form no cycle. (A room may start another as a process by name: the rollout server's client starts
  `python -m grpo_studio.engine.rollout_server`.)

test_import_hygiene.py checks the heavy libraries (torch, textual) at import time; this file checks our own rooms.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("contract", "rewards", "engine", "studio", "cli", "benchmarks", "api")
RULES = {
    "contract": {"contract"},
    "rewards": {"contract", "rewards"},
    "engine": {"contract", "rewards", "engine"},
    "studio": {"contract", "rewards", "studio"},
    "cli": set(CODE),  # the front door: each command loads its room when it runs
    "benchmarks": {"contract", "rewards", "engine", "studio", "benchmarks"},
    "api": {"contract", "rewards", "engine", "api"},  # the Python API: contract/launch.py's checks, the engine
}
# A room that starts the front door as a user would, in a subprocess (`python -m grpo_studio.cli.main ...`),
# names it in a string without importing it: the command lines (contract/launch.py), the studio's launcher and
# the benchmarks' command-line cases. The engine never does.
MAY_START_CLI = {"contract", "studio", "benchmarks"}
NAMED = re.compile(r"\bgrpo_studio\.(\w+(?:\.\w+)*)")


def module_of(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def arrows(source: str, module: list[str], is_package: bool) -> list[tuple[int, str, str]]:
    """(line, target dotted name under grpo_studio, how) for every import and every module named in a string."""
    package = module if is_package else module[:-1]
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name[len("grpo_studio.") :], "import") for a in node.names if NAMED.match(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("grpo_studio"):
                target = node.module[len("grpo_studio.") :]
            else:
                continue
            names = [a.name for a in node.names]
            found += [(node.lineno, f"{target}.{n}" if target else n, "import") for n in names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [(node.lineno, m, "string") for m in NAMED.findall(node.value)]
    return found


def engine_room_rules() -> dict[str, set[str]]:
    rules = {}
    for init in sorted((ROOT / "engine").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        line = re.search(r"^May import: (.+)\.$", doc, re.M)
        assert line, f"{init.relative_to(ROOT)}: its docstring has no 'May import: ...' line"
        rules[init.parent.name] = {name.strip() for name in line.group(1).split(",")}
    return rules


def violations(path: Path, source: str | None = None) -> list[str]:
    module = module_of(path)
    room = module[0]
    engine_rules = engine_room_rules()
    out = []
    for line, target, how in arrows(source or path.read_text(), module, path.name == "__init__.py"):
        parts = target.split(".")
        if parts[0] == "api" and len(parts) > 1 and parts[1] in CODE:  # api/ is grpo_studio: `.engine` is a room
            parts = parts[1:]
        elif parts[0] == "api":
            parts = ["api"]
        if parts[0] not in CODE:
            continue  # grpo_studio.presets (data) or a name like __version__ on the namespace
        where = f"{path.relative_to(ROOT)}:{line}: {room} -> {target} ({how})"
        if how == "string" and parts[0] == "cli" and room in MAY_START_CLI:
            continue
        if parts[0] not in RULES[room]:
            out.append(where)
        elif how == "import" and room == "engine" == parts[0] and len(module) > 2 and module[1] in engine_rules:
            own, other = module[1], parts[1] if len(parts) > 1 else ""
            is_room = other in engine_rules
            if is_room and other != own and f"engine.{other}" not in engine_rules[own]:
                out.append(where)
    return out


def test_every_import_follows_the_room_rules():
    files = [p for room in CODE for p in (ROOT / room).rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) > 150  # the walk really saw the tree
    assert [v for p in files for v in violations(p)] == []


def test_the_engine_rooms_form_no_cycle():
    rules = engine_room_rules()
    assert {"prompts", "precision", "model", "sampler", "rollout_server", "rollout", "train", "out", "run"} == set(
        rules
    )
    arrows_of = {room: {n.split(".")[1] for n in names if n.startswith("engine.")} for room, names in rules.items()}
    done: set[str] = set()

    def visit(room: str, path: tuple[str, ...]) -> None:
        assert room not in path, f"a cycle: {' -> '.join((*path, room))}"
        for nxt in arrows_of[room]:
            if nxt not in done:
                visit(nxt, (*path, room))
        done.add(room)

    for room in rules:
        visit(room, ())


def test_the_checker_sees_lazy_relative_and_string_arrows():
    """The rules would catch each way an arrow can hide: an import inside a function, a relative import, a
    module started by name in a subprocess, and an engine room importing a room above it."""
    engine_file = ROOT / "engine" / "prompts" / "data.py"
    hidden = {
        "def f():\n    from ...cli.main import main\n": "engine -> cli.main.main (import)",
        "def f():\n    import grpo_studio.studio.app as app\n": "engine -> studio.app (import)",
        "CMD = ['-m', 'grpo_studio.cli.main']\n": "engine -> cli.main (string)",
        "def f():\n    from ..train import grpo_step\n": "engine -> engine.train.grpo_step (import)",
    }
    for source, arrow in hidden.items():
        assert [v.split(": ", 1)[1] for v in violations(engine_file, source)] == [arrow], source
    bench = ROOT / "benchmarks" / "faults_bench.py"
    assert violations(bench, "def f():\n    from ..cli.main import main\n") == [
        "benchmarks/faults_bench.py:2: benchmarks -> cli.main.main (import)"
    ]
    assert violations(bench, "CMD = ['-m', 'grpo_studio.cli.main']\n") == []  # a user's command line, in a process
    api = ROOT / "api" / "grpo_trainer.py"  # api/ is grpo_studio itself: `.studio` is the studio room
    assert violations(api, "def f():\n    from .studio import app\n") == [
        "api/grpo_trainer.py:2: api -> api.studio.app (import)"
    ]
    assert violations(api, "from .engine.run import trainer\nfrom .field_fates import FATES\n") == []
    assert violations(api, "def f():\n    from .cli import train_cmd\n") == [  # the front end's checks: launch.py
        "api/grpo_trainer.py:2: api -> api.cli.train_cmd (import)"
    ]
