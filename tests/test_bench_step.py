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
        if name == "trl":  # every row trained: the nominal FLOPs are TRL's work
            assert s["mfu"] == pytest.approx(s["flop_per_step"] / s["step_s"] / peak, rel=1e-2, abs=1e-4)
        else:  # ours skips zero-advantage micro-batches: its MFU is the trainer's, over the work it ran
            assert s["mfu"] == pytest.approx(s["run_mfu"], abs=1e-4)
            assert len(s["rows_trained"]) == STEPS
            assert all(0 <= t <= r <= B for t, r in zip(s["rows_trained"], s["rows_run"]))
        assert s["achieved_gflop_s"] == pytest.approx(s["flop_per_step"] / s["step_s"] / 1e9, rel=1e-2)
        m = s["memory"]  # the side's own process: imports ≤ built ≤ peak, and its weights inside the peak
        assert 0.1 < m["imports_gib"] <= m["built_gib"] <= m["peak_rss_gib"] == s["peak_rss_gib"]
        assert 0 < m["optimizer_gib"] < m["weights_gib"] < m["peak_rss_gib"] and m["sampler"] == "hf"
        assert 0 <= s["reward_last"] <= 2.0 and 0 <= s["reward_mean"] <= 2.0  # correctness (0/1) + format (≤ 1)
        t = m["trace"]  # where the peak goes: the live high-water mark and the slack add up to the peak
        assert t["mallinfo"] and 0 < t["train_gib"] and 0 <= t["rollout_gib"]
        assert (
            m["weights_gib"] < t["live_peak_gib"] <= m["peak_rss_gib"]
            # a sampled RSS (/proc statm) may pass ru_maxrss by a few MiB: Linux folds per-thread RSS counts into
            # the high-water mark only now and then (seen: 0.727 vs 0.726 GiB)
            and t["rss_sampled_peak_gib"] <= m["peak_rss_gib"] + 0.004
        )
        assert t["slack_gib"] == pytest.approx(m["peak_rss_gib"] - t["live_peak_gib"], abs=2e-3)
    # ours' hf sampler holds a copy of the base weights (the trained model's less its LoRA); TRL samples with its own
    assert report["sides"]["trl"]["memory"]["sampler_weights_gib"] == 0
    assert (
        0
        < report["sides"]["ours_hf"]["memory"]["sampler_weights_gib"]
        < report["sides"]["ours_hf"]["memory"]["weights_gib"]
    )
    trl, ours = report["sides"]["trl"], report["sides"]["ours_hf"]
    assert report["speedup_vs_trl"] == {"ours_hf": pytest.approx(trl["step_s"] / ours["step_s"], rel=1e-2)}
    assert "idle_s" not in trl and 0 <= ours["idle_s"] < ours["step_s"] and 0 < ours["sync_s"] < ours["step_s"]
    assert ours["run_mfu"] > 0  # the trainer's own perf/mfu (tests/test_flops.py checks its arithmetic)
    parity = report["parity"]  # TRL's compute_loss and our step on one shared rollout: the same gradient
    assert parity["ok"] and parity["grad_rel_l2"] < 1e-4 and parity["rows"] == B
    assert parity["loss_ours"] == pytest.approx(parity["loss_trl"], rel=1e-5, abs=1e-7)
    # LoRA r16 on every linear layer: r · (in + out) per layer, over 2 layers (the lm_head is not adapted)
    assert parity["weights"] == 2 * 16 * ((256 + 256) + 2 * (256 + 128) + (256 + 256) + 3 * (256 + 512))
    saved = report["prefix_tokens_saved"]  # --micro-batch-tokens sorts rows by length: no shared prefix in training
    assert saved == {
        "per_step": round(B * w["prompt_len_mean"]),
        "rollout": round(PROMPTS * (G - 1) * w["prompt_len_mean"]),
        "train": 0,
    }
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


def test_gsm8k_shaped_workload_is_the_real_model_through_its_chat_template_at_equal_gradients(tmp_path):
    """The real SmolLM2-135M-Instruct on the word-problems recipe (chat template, GSM8K system prompt and
    rewards), at its smallest: the parity line says both sides take the same gradient on a shared rollout."""
    proc = run_cli(
        "bench",
        "step",
        *("--workload", "gsm8k-shaped", "--json", "--prompts", "1", "--generations", "2"),
        *("--max-tokens", "8", "--steps", "1", "--warmup", "0"),
        cwd=tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    w = report["workload"]
    assert (w["recipe"], w["model"], w["lr"], w["micro_batch_size"]) == (
        "word-problems",
        "smollm2-135m-instruct",
        5e-4,
        16,
    )
    # system prompt + question under ChatML
    assert 60 < w["prompt_len_mean"] < 128
    parity = report["parity"]
    assert parity["ok"] and parity["grad_rel_l2"] < 1e-4 and parity["rows"] == 2, parity
    # SmolLM2-135M: 30 layers; LoRA r16 on q, k, v, o (576→576, 576→192 ×2, 576→576) and gate, up, down (576↔1536)
    assert parity["weights"] == 30 * 16 * (2 * (576 + 576) + 2 * (576 + 192) + 3 * (576 + 1536))
    assert report["prefix_tokens_saved"]["train"] == round(w["prompt_len_mean"])  # 2 rows, one prompt
    assert set(report["sides"]) == {"trl", "ours_hf"}


def test_shared_instruction_puts_the_160_character_system_prompt_before_every_question():
    """The workload's own --sets reach both sides' config: the char tokenizer's prompt is the instruction, a blank
    line, then the question (one token a character), under a prompt cap that keeps it whole."""
    from grpo_studio.benchmarks import step_bench, step_sides
    from grpo_studio.engine.model.policy_loader import load_tokenizer, resolve_model_path
    from grpo_studio.engine.prompts import prompt_render

    spec = step_bench.WORKLOADS["shared-instruction"]
    w = step_bench.Workload(
        model="tiny-arith", prompts=8, generations=8, max_tokens=64, mean_len=0, steps=1, warmup=0, lora_rank=16,
        lr=2e-3, seed=0, backends=("hf",), vs="trl", recipe=spec["recipe"], sets=spec["sets"],
    )  # fmt: skip
    cfg = step_sides.bench_config(w, resolve_model_path("tiny-arith"), "hf")
    assert len(step_bench.SYSTEM_PROMPT) == 160 and cfg.data.system_prompt == step_bench.SYSTEM_PROMPT
    assert (cfg.rollout.max_prompt_len, cfg.rollout.max_completion_len, cfg.train.micro_batch_size) == (256, 64, "auto")
    path = resolve_model_path("tiny-arith")
    text = step_sides.trl_rows(cfg, path)[0]["prompt"]  # the text both sides tokenise
    assert text.startswith(step_bench.SYSTEM_PROMPT + "\n\n") and "+" in text.removeprefix(step_bench.SYSTEM_PROMPT)
    [ids] = prompt_render.encode_prompts(load_tokenizer(path), [text], cfg.rollout.max_prompt_len)
    assert len(ids) == len(text)  # whole: one token a character, none cut
