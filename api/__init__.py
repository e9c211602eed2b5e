"""grpo-studio's Python API: a TRL 1.16 GRPO script runs here unchanged but for its import.

    from grpo_studio import GRPOTrainer, GRPOConfig

  grpo_config     GRPOConfig: TRL's 189 fields and defaults, its batch arithmetic and its one-line errors;
                  `studio_keys` turns one into the studio's config keys
  field_fates     the one table of what becomes of every GRPOConfig field: mapped to a key, accepted with no
                  effect (and why), or refused in one line; docs/python-api.md's table is generated from it
  grpo_trainer    GRPOTrainer: TRL's constructor; train() runs the CLI's engine in this process, into
                  args.output_dir as the run directory
  callback_bridge TRL's TrainerCallback events (on_train_begin, on_log, on_step_end, on_save, on_train_end)
                  with TRL's TrainerState fields, fed from the engine's metrics rows

This folder is the `grpo_studio` package itself (pyproject.toml maps it), so every `import grpo_studio.X`
runs this file: it imports nothing (PEP 562 `__getattr__` loads a name when a script first asks for it),
and `grpo_studio.contract` stays torch-free.

May import: contract, rewards, engine (the engine only when a run starts).
"""

from __future__ import annotations

_PUBLIC = {"GRPOConfig": "grpo_config", "GRPOTrainer": "grpo_trainer"}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'grpo_studio' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
