"""What a resume may change. Each checkpoint remembers the config it was trained with (checkpoints/step-N/config.toml,
written with its weights); a resume compares the config it would train with against the newest one's, before
anything loads. A change to a key the checkpoint cannot carry (CARRIED: its weights would not load, or would be
another policy) is refused in one line naming the key, both values and where the change came from (an edited
config.toml or --set); every other change is the trainer's `config_changed` event.

A checkpoint written before checkpoints remembered their config (no config.toml in its manifest) is compared
against the run's config.toml as it stands: a --set is checked as above, an edit of config.toml is not seen (a
weights shape that does not fit is then refused as the checkpoint loads, engine/out/checkpoint.py). One whose
remembered config.toml is missing or damaged fails its manifest check as it loads: the trainer falls back to an
older good checkpoint, and refuses the resume in one line when none is left (checkpoint.NoUsableCheckpoint). A run
with no checkpoint at all restarts from the base weights, so it takes any change.

Pure python, no torch.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from . import config
from .errors import UserError, show
from .run_files import CONFIG, checkpoint_folders

# key -> what of the checkpoint it decides
CARRIED = {
    "model.name": "the base model its weights belong to",
    "model.dtype": "the precision its weights and optimizer state are kept in",
    "model.load_in_4bit": "the base its adapter was trained on (4-bit or not)",
    "model.double_quant": "the 4-bit base its adapter was trained on",
    "model.lora_rank": "its weights' shape (0: a full fine-tune, else a LoRA adapter of that rank)",
    "model.lora_target_modules": "the layers its adapter holds",
    "model.lora_alpha": "its adapter's scale (the same weights would be another policy)",
}
LORA_ONLY = ("model.lora_target_modules", "model.lora_alpha")  # carried by an adapter (lora_rank > 0) only


def reference(run_dir: Path) -> tuple[str | None, config.Config]:
    """(checkpoint folder name, the config it remembers) of the newest checkpoint that remembers one, else
    (None, the run's config.toml)."""
    for _, path in reversed(checkpoint_folders(run_dir)):
        if (path / CONFIG).is_file():
            try:
                return path.name, config.load(str(path / CONFIG))
            except UserError:  # damaged, or written by a version whose keys differ: not a reference
                continue
    return None, config.load(str(Path(run_dir) / CONFIG))


def uncarried(changed: dict[str, tuple], cfg: config.Config) -> list[str]:
    """The keys of `changed` ({key: (old, new)}, config.changes) a checkpoint cannot carry into `cfg`."""
    adapter = cfg.model.lora_rank > 0 and "model.lora_rank" not in changed
    return [
        key
        for key in changed
        if key in CARRIED
        and (adapter or key not in LORA_ONLY)
        and (cfg.model.load_in_4bit or key != "model.double_quant")
    ]


def check(run_dir: Path, cfg: config.Config, set_keys: Collection[str]) -> None:
    """Refuse, in one line, a resume of `run_dir` with `cfg` that changes a key its checkpoint cannot carry.
    `set_keys`: the keys given with --set (every other change was made by editing config.toml)."""
    folders = checkpoint_folders(run_dir)
    if not folders:
        return
    name, old = reference(run_dir)
    changed = config.changes(old, cfg)
    refused = uncarried(changed, cfg)
    if not refused:
        return

    def said(key: str) -> str:
        was, now = changed[key]
        via = "--set" if key in set_keys else f"edited in {CONFIG}"
        return f"{key} {show(was)} -> {show(now)} ({via})"

    first, rest = refused[0], refused[1:]
    back = f"{first} = {show(changed[first][0])}" if not rest else "the checkpoint's values"
    also = f"; also {', '.join(map(said, rest))}" if rest else ""
    raise UserError(
        f"checkpoint {name or folders[-1][1].name} cannot carry {said(first)}: it decides {CARRIED[first]}{also}; "
        f"resume with {back}, or start a new run",
        kind="resume",
    )
