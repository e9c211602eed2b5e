"""`grpo-studio bench step --vs trl --json` at its smallest: TRL's GRPOTrainer and ours on the bundled model,
one timed step each. Checks the report's fields and that its numbers are consistent with each other and
with a hand count of the model's matmul weights (not timings: those are benchmarks, reported)."""

from __future__ import annotations

import json
import statistics

import pytest
from cli_helpers import run_cli

PROMPTS, G, STEPS = 2, 2, 2
# tiny-arith: 2 layers of q, k, v, o (256×256, 256×128, 256×128, 256×256) and gate, up, down (256×512 each),
# plus the 64×256 lm_head (tied to the embedding, still a matmul)
TINY_MATMUL_PARAMS = 2 * (256 * (256 + 128 + 128 + 256) + 3 * 256 * 512) + 64 * 256


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("bench")
    proc = run_cli(
        "bench",
        "step",
        "--vs",
        "trl",
        "--json",
        "--prompts",
        str(PROMPTS),
        "--generations",
        str(G),
        "--max-tokens",
        "4",
        "--steps",
        str(STEPS),
        "--warmup",
        "0",
        "--profile",
        "3",
        "--micro-batch-tokens",
        "16",
        cwd=cwd,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_report_has_both_sides_with_consistent_numbers(report):
    w = report["workload"]
    assert (w["model"], w["prompts"], w["generations"], w["max_tokens"], w["lora_rank"]) == (
        "tiny-arith",
        PROMPTS,
        G,
        4,
        16,
    )
    assert w["mean_len"] == 0 and w["micro_batch_tokens"] == 16  # no EOS bias on a trained model
    peak = report["matmul_peak_gflop_s"] * 1e9
    assert peak > 0
    B = PROMPTS * G
    assert set(report["sides"]) == {"trl", "ours_hf"}
    for name, s in report["sides"].items():
        assert s["matmul_params"] == TINY_MATMUL_PARAMS, name
        assert len(s["steps_s"]) == STEPS and s["step_s"] == pytest.approx(statistics.median(s["steps_s"]), abs=1e-3)
        assert 0 < s["rollout_s"] < s["step_s"] and s["train_s"] == pytest.approx(
            s["step_s"] - s["rollout_s"], abs=2e-4
        )
        assert 1 <= s["completion_len_mean"] <= 4
        completion = s["completion_len_mean"] * B
        tokens = B * w["prompt_len_mean"] + completion
        # 2·N per token to generate, 4·N per token to train with LoRA
        assert s["flop_per_step"] == pytest.approx((2 + 4) * TINY_MATMUL_PARAMS * tokens, rel=1e-2)
        assert s["gen_tok_s"] == pytest.approx(completion / s["rollout_s"], rel=1e-2)
        assert s["train_tok_s"] == pytest.approx(tokens / s["train_s"], rel=1e-2)
        assert s["mfu"] == pytest.approx(s["flop_per_step"] / s["step_s"] / peak, rel=1e-2, abs=1e-4)
        assert s["achieved_gflop_s"] == pytest.approx(s["flop_per_step"] / s["step_s"] / 1e9, rel=1e-2)
        assert s["peak_rss_gib"] > 0.1 and 0 <= s["rss_growth_gib"] <= s["peak_rss_gib"]
        assert 0 <= s["reward_last"] <= 2.0 and 0 <= s["reward_mean"] <= 2.0  # correctness (0/1) + format (≤ 1)
    trl, ours = report["sides"]["trl"], report["sides"]["ours_hf"]
    assert report["speedup_vs_trl"] == {"ours_hf": pytest.approx(trl["step_s"] / ours["step_s"], rel=1e-2)}
    assert "idle_s" not in trl and 0 <= ours["idle_s"] < ours["step_s"] and 0 < ours["sync_s"] < ours["step_s"]
    assert ours["run_mfu"] > 0  # the trainer's own perf/mfu (tests/test_flops.py checks its arithmetic)
    top = ours["profile"]
    assert len(top) == 3 and "profile" not in trl
    assert all(0 < op["share"] <= 1 and op["calls"] >= 1 for op in top)
    assert [op["self_s"] for op in top] == sorted((op["self_s"] for op in top), reverse=True)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--backends", "hf,tpu"], "bench error: --backends = 'hf,tpu': a comma list from hf, vllm"),
        (["--generations", "1"], "bench error: --generations = 1: must be >= 2 (group-relative advantages)"),
        (["--micro-batch-tokens", "-1"], "bench error: --micro-batch-tokens = -1: must be >= 0"),
    ],
    ids=["backend", "generations", "budget"],
)
def test_bad_flags_are_one_line_with_exit_2(args, message, tmp_path):
    proc = run_cli("bench", "step", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [message]
