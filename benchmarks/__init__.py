"""What `grpo-studio bench NAME` measures: one module per benchmark, plain functions taking the parsed
values (the command line is cli/bench_cmd.py, whose BENCHMARKS registry names them).

Benchmarks report ratios against a baseline measured in the same process, never absolute
wall-clock targets in tests (these machines are shared and noisy).

  logprobs_bench       per-token log-probs of a big-vocabulary lm_head: materialised vs chunked vs TRL's kernels
  mismatch_bench       the rollout/train mismatch of each precision, end to end
  rollout_bench        rollout tokens/s, hf vs vllm
  scaling_bench        data-parallel scaling, 1 process against N
  step_bench           whole optimizer steps, TRL's GRPOTrainer against ours
  ui_bench             studio responsiveness, and the Samples tab's index of a 100 MB samples.jsonl
  vram_accuracy_bench  the planner's accurate mode against measured training steps
  faults_bench         the fault suite as real processes: one line and exit 2 for mistakes, no tracebacks
  fault_cases          the fault suite's generated cases (also run by tests/test_fault_suite.py)
  fault_trials         the fault suite's slow trials: kill -9, a full disk, divergence, two trainers
  fault_probes         the fault suite's probes (hostile cases that are not a command line) and how they run
  hostile_environments, hostile_model_text, hostile_rollout_server, hostile_readers, hostile_resume,
  hostile_data, hostile_signals, hostile_cache, hostile_api, hostile_samples, hostile_evals, hostile_algorithms,
  hostile_support, hostile_moe, hostile_micro_batch, hostile_studio
                       each feature's hostile cases, one category each (fault_probes.HOSTILE)
  synthetic_run        run directories written without training (studio tests, screenshots, damaged runs)
  step_sides           one side of step_bench (TRL's, ours per backend) in a process of its own
  step_parity          step_bench's parity line: both sides' gradients on one shared rollout
  step_measure         step_bench's model preparation, memory readings and per-side summary
  vram_cases           vram_accuracy_bench's configurations and the tiny models they build
  tiny_moe             the tiny Qwen3-MoE (8 experts, top-2) tests and benches train
  tensor_bytes         counting tensor bytes (live peaks, persistent state) for vram_accuracy_bench
"""
