"""`bench step`'s start-up line (benchmarks/step_bench.py startup_process): `grpo-studio train` launched as a
user launches it, one step on the bundled model; its numbers read from the run's own files agree with each
other (no timing thresholds: those are benchmarks)."""

from __future__ import annotations

from grpo_studio.benchmarks import step_bench
from grpo_studio.benchmarks.step_measure import model_path_of


def test_start_up_is_read_from_the_run_it_launched():
    w = step_bench.Workload(
        model="tiny-arith", prompts=2, generations=2, max_tokens=4, mean_len=0, steps=1, warmup=0, lora_rank=16,
        lr=1e-3, seed=0, backends=("hf",), vs="none",
    )  # fmt: skip
    t = step_bench.startup_process(w, model_path_of(w), "hf")
    assert set(t) == {"to_started_s", "to_first_step_s", "first_step_s"}
    assert 0 < t["to_started_s"] < t["to_first_step_s"]
    # the step runs after `started`: its own seconds fit between the two (to the report's rounding)
    assert 0 < t["first_step_s"] <= t["to_first_step_s"] - t["to_started_s"] + 0.002
