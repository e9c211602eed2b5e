"""Import rules of the layout (docs/design.md): the contract room and the front door import neither
torch nor textual, the studio never imports torch/transformers/vllm, the engine never imports
textual, and the wheel claims one top-level import name."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

from grpo_studio import contract

HEAVY = {"torch", "transformers", "vllm"}
UI = {"textual", "textual_plotext"}


def loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_contract_room_imports_neither_torch_nor_textual():
    names = [m.name for m in pkgutil.walk_packages(contract.__path__, "grpo_studio.contract.")]
    assert {"grpo_studio.contract.config", "grpo_studio.contract.rundir", "grpo_studio.contract.planner.vram"} <= set(
        names
    ), names  # the probe really covers the room
    mods = loaded_after("\n".join(f"import {n}" for n in names))
    assert not mods & (HEAVY | UI), mods & (HEAVY | UI)


def test_front_door_and_runs_listing_import_no_textual_or_torch(tmp_path):
    mods = loaded_after(
        f"import grpo_studio.cli.main, grpo_studio.cli.runs_cmd\ngrpo_studio.cli.main.main(['runs', {str(tmp_path)!r}])"
    )
    assert "grpo_studio" in mods
    assert not mods & (HEAVY | UI), mods & (HEAVY | UI)


def test_studio_imports_no_torch_transformers_or_vllm():
    mods = loaded_after(
        "import grpo_studio.studio.app, grpo_studio.studio.screens.setup_screen, "
        "grpo_studio.studio.screens.dashboard_screen, grpo_studio.studio.screens.runs_list_screen, "
        "grpo_studio.studio.screens.compare_screen, grpo_studio.studio.screens.modals, grpo_studio.studio.report, "
        "grpo_studio.studio.widgets.metric_chart, grpo_studio.studio.widgets.vram_panel, "
        "grpo_studio.studio.widgets.perf_tables, grpo_studio.studio.widgets.reward_list, grpo_studio.studio.messages, "
        "grpo_studio.studio.launcher, grpo_studio.studio.vram_adapter\n"
        "from grpo_studio.studio.app import StudioApp\nStudioApp()"
    )
    assert "textual" in mods  # the probe really loaded the app
    assert not mods & HEAVY, mods & HEAVY


def test_engine_imports_no_textual():
    mods = loaded_after("import grpo_studio.engine.run.trainer, grpo_studio.cli.train_cmd")
    assert "torch" in mods
    assert not mods & UI


def test_wheel_claims_one_import_name_and_carries_the_bundled_data(tmp_path):
    """Build the real wheel: its only top-level import name is grpo_studio, and the presets, model
    and studio stylesheet travel with it."""
    import shutil
    import zipfile
    from pathlib import Path

    root, src = Path(__file__).resolve().parents[1], tmp_path / "src"  # a copy: the build leaves build/ behind
    for name in ("api", "contract", "rewards", "engine", "studio", "cli", "benchmarks", "presets"):
        shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("grpo_studio-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"grpo_studio", wheel.name.split("-py")[0] + ".dist-info"}
    for path in (
        "grpo_studio/presets/recipes/tiny-arith.toml",
        "grpo_studio/presets/models/tiny-arith/model.safetensors",
        "grpo_studio/studio/studio.tcss",
        "grpo_studio/contract/config.py",
        "grpo_studio/cli/main.py",
    ):
        assert path in names, path
