"""A wheel that works: build the real wheel from a copy of the checkout, install it (not editable) into a
fresh venv that borrows only the dependencies from this one, and run the installed `grpo-studio` from
there: --help of every command, two training steps of the default recipe, the studio's first frame."""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR = PYPROJECT["tool"]["setuptools"]["package-dir"]  # "grpo_studio.engine" -> "engine", ...
WARNING = re.compile(r"\b\w*Warning: |would be ignored")  # Python warnings (BuildBackendWarning: ...), not
# distutils' lowercase "warning: build_py: byte-compiling is disabled" notes


def command_tree(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of an argparse tree: ("train",), ("bench",), ("bench", "ui"), ..."""
    paths = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += [(*prefix, name), *command_tree(sub, (*prefix, name))]
    return paths


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel, built the way `pip wheel .` builds it (verbose, so setuptools' warnings show), from a copy
    of the mapped folders: the build leaves build/ and an egg-info behind, and this keeps them out of the
    checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for folder in PACKAGE_DIR.values():
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", PYPROJECT["project"]["readme"]):
        shutil.copy(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "PYTHONPATH")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    (wheel,) = (tmp / "dist").glob("grpo_studio-*.whl")
    return wheel, log


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed in it. The dependencies come from this venv's site-packages
    through a .pth line; that adds the folder to sys.path without running the .pth files in it, so the
    editable install's finder (which maps grpo_studio onto the checkout) stays off there."""
    wheel, _ = built
    env_dir = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(env_dir), "platbase": str(env_dir)}))
    deps = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "deps.pth").write_text("".join(f"{path}\n" for path in deps))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(env_dir / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return env_dir


def run_in(env_dir: Path, cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a command from the venv's bin/, outside the checkout (no '' on sys.path that could find it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200", HF_HUB_OFFLINE="1")
    argv = (str(env_dir / "bin" / argv[0]), *argv[1:])
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def python_in(env_dir: Path, cwd: Path, code: str, timeout: float = 120) -> dict:
    """Run code with the venv's python; its last line of stdout is JSON."""
    proc = run_in(env_dir, cwd, "python", "-c", code, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_build_prints_no_setuptools_warnings(built):
    _, log = built
    warned = [line.strip() for line in log.splitlines() if WARNING.search(line)]
    assert not warned, "\n".join(warned)


def test_wheel_carries_every_package_and_every_file_of_the_mapped_folders(built):
    """Every tracked file under engine/, studio/, cli/, benchmarks/ and presets/ (code, recipes, model, cards,
    the stylesheet) is in the wheel at its grpo_studio.* path, so no subpackage can be left out again."""
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", *PACKAGE_DIR.values()], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    to_package = {folder: package.replace(".", "/") for package, folder in PACKAGE_DIR.items()}
    expected = set()
    for path in filter(None, tracked):
        folder, _, rest = path.partition("/")
        if (ROOT / path).is_file():  # tracked and still there (not deleted in the working tree)
            expected.add(f"{to_package[folder]}/{rest}")
    assert expected, "git ls-files listed nothing"
    assert not expected - names, sorted(expected - names)
    packages = {
        str(p.parent.relative_to(ROOT)) for folder in PACKAGE_DIR.values() for p in (ROOT / folder).rglob("__init__.py")
    }
    assert "engine/rollout_server" in packages  # the one the hand-written list had left out
    for package in packages:
        folder, _, rest = package.partition("/")
        assert f"{to_package[folder]}/{rest + '/' if rest else ''}__init__.py" in names, package
    assert {name.split("/")[0] for name in names} == {"grpo_studio", wheel.name.split("-py")[0] + ".dist-info"}


def test_the_installed_wheel_is_what_runs(venv, tmp_path):
    """grpo_studio, its bundled data and the rollout server (whose package the old wheel lacked) import
    from the new venv, and the distribution there is the wheel, not an editable install."""
    found = python_in(
        venv,
        tmp_path,
        "\n".join(
            [
                "import importlib.metadata as md, importlib.util, json, sys",
                "import grpo_studio, grpo_studio.engine, grpo_studio.cli.main",
                "import grpo_studio.engine.rollout_server.http_api as app, grpo_studio.engine.sampler.transport",
                "from grpo_studio.contract import bundled",
                "dist = md.distribution('grpo-studio')",
                "print(json.dumps({'path': list(grpo_studio.__path__), 'engine': grpo_studio.engine.__file__,",
                "  'app': app.__file__, 'recipe': str(bundled.recipe('tiny-arith')),",
                "  'model': str(bundled.bundled_model('tiny-arith')), 'dist': str(dist.locate_file('')),",
                "  'direct_url': json.loads(dist.read_text('direct_url.json') or '{}'),",
                "  'top_level_engine': importlib.util.find_spec('engine') is not None}))",
            ]
        ),
        timeout=180,
    )
    inside = lambda path: Path(path).resolve().is_relative_to(venv.resolve())
    assert found["path"] and all(inside(p) for p in found["path"]), found["path"]
    for key in ("engine", "app", "recipe", "model", "dist"):
        assert inside(found[key]), (key, found[key])
    assert found["app"].endswith("grpo_studio/engine/rollout_server/http_api.py")
    assert found["direct_url"]["url"].endswith(".whl"), found["direct_url"]
    assert not found["direct_url"].get("dir_info", {}).get("editable"), found["direct_url"]
    assert not found["top_level_engine"]  # the wheel claims no generic top-level names


def test_every_command_answers_help(venv, tmp_path):
    """`grpo-studio --help` lists every command; each command (and each `bench` benchmark) answers --help
    with its usage line. The command list is read from the installed parser and must equal the checkout's."""
    from grpo_studio.cli.main import COMMANDS, STUDIO, build_parser

    tree = python_in(
        venv,
        tmp_path,
        "\n".join(
            [
                "import argparse, json",
                "from grpo_studio.cli.main import build_parser",
                inspect.getsource(command_tree),
                "print(json.dumps(command_tree(build_parser())))",
            ]
        ),
    )
    tree = [tuple(path) for path in tree]
    assert tree == command_tree(build_parser())
    assert {path[0] for path in tree} == {STUDIO, *COMMANDS}
    assert ("rollout-serve",) in tree and ("bench", "ui") in tree

    top = run_in(venv, tmp_path, "grpo-studio", "--help")
    assert top.returncode == 0, top.stderr
    assert top.stdout.startswith("usage: grpo-studio"), top.stdout[:200]
    listed = " ".join(top.stdout.split())
    for name, line in COMMANDS.items():
        assert f"{name} {line}" in listed, name

    for path in tree:
        argv = ("tiny-arith", "--help") if path == (STUDIO,) else (*path, "--help")  # the bare form
        proc = run_in(venv, tmp_path, "grpo-studio", *argv)
        assert proc.returncode == 0, (path, proc.stderr[-2000:])
        usage = "usage: grpo-studio" if path == (STUDIO,) else f"usage: grpo-studio {' '.join(path)}"
        assert proc.stdout.startswith(usage), (path, proc.stdout[:200])
        assert not proc.stderr.strip(), (path, proc.stderr[-2000:])

    serve = run_in(venv, tmp_path, "grpo-studio", "rollout-serve", "--help")
    for flag in ("--host", "--port", "--tensor-parallel-size", "--set"):
        assert flag in serve.stdout, flag


def test_two_training_steps_of_the_default_recipe(venv, tmp_path):
    from grpo_studio.contract import metrics, rundir

    run_dir = tmp_path / "run"
    proc = run_in(
        venv,
        tmp_path,
        "grpo-studio",
        "train",
        "tiny-arith",
        "--set",
        "train.steps=2",
        "--set",
        "train.eval_every=0",
        "--set",
        "train.save_every=0",
        "--run-dir",
        str(run_dir),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"finished at step 2: {run_dir}" in proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (run_dir / rundir.METRICS).read_text().splitlines()]
    assert [row[metrics.STEP] for row in rows] == [1, 2]
    assert all(math.isfinite(row["reward/mean"]) for row in rows), rows
    assert (run_dir / rundir.CONFIG).is_file()


FIRST_FRAME = r"""
import asyncio, json, sys
from grpo_studio.studio.app import StudioApp
from textual.geometry import Region

def text(widget):
    strips = widget.render_lines(Region(0, 0, widget.size.width, widget.size.height))
    return "\n".join(strip.text.rstrip() for strip in strips)

async def main():
    app = StudioApp(runs_root=sys.argv[1], live_hardware=False)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.setup_screen is None or not app.setup_screen.is_mounted:
            await asyncio.sleep(0.01)
        await pilot.pause()
        screen = app.screen
        shown = [text(w) for w in screen.query("*") if not w.children and w.region.area]  # what is on screen
        print(json.dumps({"screen": type(screen).__name__, "app": sys.modules[StudioApp.__module__].__file__,
                          "sheets": [str(key[0]) for key in app.stylesheet.source], "shown": shown}))

asyncio.run(main())
"""


def test_the_studio_draws_its_first_frame(venv, tmp_path):
    """The installed studio starts headless (textual's run_test) on the setup screen of the default recipe,
    with the bundled model found in the installed presets and the studio.tcss that travelled in the wheel."""
    proc = run_in(venv, tmp_path, "python", "-c", FIRST_FRAME, str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    frame = json.loads(proc.stdout.strip().splitlines()[-1])
    assert frame["screen"] == "SetupScreen"
    assert Path(frame["app"]).resolve().is_relative_to(venv.resolve()), frame["app"]
    sheets = [Path(s) for s in frame["sheets"] if s.endswith(".tcss")]
    assert [s.name for s in sheets] == ["studio.tcss"] and sheets[0].resolve().is_relative_to(venv.resolve())
    shown = [" ".join(text.split()) for text in frame["shown"]]
    for expected in ("grpo-studio — setup · tiny-arith", "tiny-arith · bundled", "^r Launch"):
        assert expected in shown, (expected, shown)
    assert any(text.startswith("VRAM") and "total" in text for text in shown), shown
