"""The layout's rules (docs/design.md, "The map"), checked on the files themselves:

- no two modules share a name, so a name says which file it is;
- every package's __init__ docstring lists what is really in its folder, and nothing that is not;
- the largest source files are reported (a report, not a rule: modules are cut along seams, not at a count).
"""

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("contract", "rewards", "engine", "studio", "cli", "benchmarks", "presets", "scripts", "api")
LARGEST = 10


def sources() -> list[Path]:
    return sorted(p for room in ROOMS for p in (ROOT / room).rglob("*.py") if "__pycache__" not in p.parts)


def packages() -> list[Path]:
    return sorted(p.parent for p in sources() if p.name == "__init__.py")


def members(package: Path) -> set[str]:
    """The modules and sub-packages directly inside a package folder."""
    names = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    return names | {d.name for d in package.iterdir() if (d / "__init__.py").is_file()}


def test_no_two_modules_share_a_name():
    where = defaultdict(list)
    for path in sources():
        if path.name != "__init__.py":
            where[path.name].append(str(path.relative_to(ROOT)))
    assert len(where) > 100  # the walk really saw the tree
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_every_package_docstring_lists_its_folder():
    """Each member's name appears in its package's docstring as a word; a `name.py` or `name/` the
    docstring mentions exists. (Data folders under presets/ are packages for the wheel only: skipped.)"""
    checked = 0
    for package in packages():
        if package.relative_to(ROOT).parts[0] == "presets" and package != ROOT / "presets":
            continue
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        here = members(package)
        missing = sorted(n for n in here if not re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", doc))
        assert missing == [], f"{package.relative_to(ROOT)}/__init__.py does not list {missing}"
        named = set(re.findall(r"(?<![\w/.])([a-z_][a-z0-9_]*)(?:\.py\b|/(?=[\s),]|$))", doc))
        gone = sorted(
            n
            for n in named
            if n not in here
            and not (ROOT / n).exists()
            and not any((ROOT / room / n).exists() or (ROOT / room / f"{n}.py").exists() for room in ROOMS)
        )
        assert gone == [], f"{package.relative_to(ROOT)}/__init__.py names files that are not there: {gone}"
        checked += 1
    assert checked >= 8


def largest_files() -> list[tuple[int, str]]:
    """(lines, path) of the LARGEST largest source files, largest first: printed by `make test` (conftest.py)."""
    sizes = [(len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in sources()]
    return sorted(sizes, reverse=True)[:LARGEST]


def test_the_largest_files_report_reads_the_tree():
    top = largest_files()
    assert len(top) == LARGEST and top == sorted(top, reverse=True)
    assert top[-1][0] > 0 and all((ROOT / path).is_file() for _, path in top)
