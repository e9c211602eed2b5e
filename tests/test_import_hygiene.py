"""The studio never imports torch/transformers/vllm; the engine never imports textual."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["torch", "transformers", "vllm"]


def loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_studio_imports_no_torch_transformers_or_vllm():
    mods = loaded_after(
        "import studio.cli, studio.app, studio.setup_screen, studio.dashboard, studio.runs_screen, "
        "studio.compare, studio.report, studio.runs_cli, studio.launcher, studio.vram_adapter\n"
        "from studio.app import StudioApp\nStudioApp()")
    assert "textual" in mods  # the probe really loaded the app
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_engine_imports_no_textual():
    mods = loaded_after("import engine.trainer, engine.train_cli, engine.config, engine.runlog, engine.vram")
    assert "torch" in mods
    assert "textual" not in mods and "textual_plotext" not in mods
