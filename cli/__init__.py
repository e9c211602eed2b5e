"""The front door: every `grpo-studio …` command. Importing it loads neither torch nor textual;
each command imports what it needs when it runs. `grpo-studio NAME` is cli/NAME_cmd.py.

  main              the argparse tree of every command, and the one error boundary
  parser            what every command's parser shares (one-line usage errors, --recipe, runs dir)
  output            --json keeps stdout for JSON only
  studio_cmd        the studio (the bare `grpo-studio`)
  train_cmd         headless training into a run directory
  attach_cmd        the studio's dashboard on an existing run
  runs_cmd          the runs under a folder and their state
  report_cmd        a run's charts as PNG and a one-page HTML summary
  doctor_cmd        what looks wrong in a run (no signal, NaN, collapse, mismatch...) and a --set to try
  export_cmd        a checkpoint as merged safetensors, GGUF, or a Hub push
  vram_cmd          the VRAM planner's table, and --solve
  config_cmd        every config key: type, default, allowed values
  rewards_cmd       the built-in reward functions
  bench_cmd         the benchmarks (benchmarks/), from its BENCHMARKS registry
  bench_workloads   the heavier benchmarks' flags, checked and run (logprobs, mismatch, scaling, step)
  rollout_serve_cmd a vLLM rollout server in its own process
"""
