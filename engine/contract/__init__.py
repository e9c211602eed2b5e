"""The torch-free contract between the engine, the studio and the command line.

Everything here imports neither torch nor textual (tests/test_import_hygiene.py keeps it so), so
every process may read it: the studio, `grpo-studio runs`, the VRAM planner and the trainer.

  config      the typed run config: keys, defaults, validation, TOML
  algorithms  the named algorithm presets (algo.name)
  dtypes      the dtype table: bytes, torch/vLLM dtype, mantissa, loss scaling, A/B partner, hint
  precision   the precision decision, once per run: resolve(cfg) -> PrecisionPlan
  backend     which rollout backend a config gets (rollout.backend auto → vllm or hf)
  rundir      the run directory: file names, the writer, tolerant readers, the run lock, run state
  vram        the VRAM planner (documented and accurate modes): rows with a phase, typed solve results
  errors      UserError, the one user-error type (key, value, why, allowed), and the one "did you mean"
  model_card  architecture facts the planner needs, read from config.json without loading weights
  bundled     where the bundled presets (recipes, models, model cards) live, and the default recipe
"""
