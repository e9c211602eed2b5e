"""What `grpo-studio bench NAME` measures: one module per benchmark, plain functions taking the parsed
values (the command line is cli/bench_cmd.py).

Benchmarks report ratios against a baseline measured in the same process, never absolute
wall-clock targets in tests (these machines are shared and noisy).
"""
