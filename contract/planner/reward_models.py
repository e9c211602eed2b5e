"""The VRAM planner's rows for reward models (rewards.funcs "rm:PATH", rewards/reward_model.py): each is
loaded on the trainer's device, in the dtype it was saved in, and kept for the run. Pure python."""

from __future__ import annotations

import json
from pathlib import Path

from .. import model_card
from ..errors import UserError

PREFIX = "rm:"  # rewards/reward_model.py PREFIX
SAVED_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def reward_model_rows(funcs: list[str]) -> list[tuple[str, float, str]]:
    """(name, bytes, formula) per reward model: its weights, as a sequence classifier has them (the input
    embedding, the decoder layers and a num_labels × hidden score head in place of the LM head)."""
    rows = []
    for entry in funcs:
        if not entry.startswith(PREFIX):
            continue
        folder = Path(entry[len(PREFIX) :]).expanduser()
        name = f"reward model {folder.name}"
        try:
            config = json.loads((folder / "config.json").read_text())
            card = model_card.from_config_json(config, str(folder))
        except (OSError, ValueError, UserError) as err:
            rows.append((name, 0.0, f"not counted: {str(err).splitlines()[0][:80]}"))
            continue
        labels = len(config.get("id2label") or {}) or config.get("num_labels", 1)
        params = card.total_params() - card.embedding_params() + card.vocab * card.hidden + labels * card.hidden
        saved = config.get("torch_dtype") or config.get("dtype") or "float32"
        size = SAVED_BYTES.get(saved, 4)
        rows.append(
            (
                name,
                params * size,
                f"{params:,} params (a {labels}-label score head, no LM head) · {size} B "
                f"({saved}, as saved): loaded on the trainer's device for the run",
            )
        )
    return rows
