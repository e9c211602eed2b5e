"""The torch-free contract between the engine, the studio and the command line.

Everything here imports neither torch nor textual (tests/test_import_hygiene.py keeps it so), so
every process may read it: the studio, `grpo-studio runs`, the VRAM planner and the trainer.

  config      the typed run config: keys, defaults, validation, TOML
  algorithms  the named algorithm presets (algo.name)
  rundir      the run directory: file names, the writer, tolerant readers, the run lock, run state
  vram        the VRAM planner (documented and accurate modes)
  model_card  architecture facts the planner needs, read from config.json without loading weights
  bundled     where the bundled presets (recipes, models, model cards) live
"""
