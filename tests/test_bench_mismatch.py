"""`grpo-studio bench mismatch`: the measured orderings of the precision flows, and the fp8 full
fine-tune trainer being the same model as its rollout copy (Jet-RL's unified flow).

Oracle: arXiv 2510.26788 (bf16's 7 mantissa bits vs fp16's 10: ~8x the |Δlogp|, so ~64x the
k3 ≈ ½Δ²; fp32 on both sides is exact up to kernel summation order) and Jet-RL (one FP8 flow on
both sides vs BF16-train + FP8-rollout), measured in-process on the same prompts and seed.
"""

from __future__ import annotations

import json

import pytest
import torch

from grpo_studio.benchmarks import mismatch_bench as bench
from grpo_studio.cli.main import main
from grpo_studio.contract import bundled, precision_plan


@pytest.fixture(scope="module")
def model_path() -> str:
    return str(bundled.bundled_model("tiny-arith"))


@pytest.mark.slow
def test_bench_orders_precisions_bf16_fp16_fp32_and_fp8_unified_below_rollout_only(model_path, capsys):
    rc = main(
        [
            "bench",
            "mismatch",
            "--json",
            "--backend",
            "hf",
            "--model",
            model_path,
            "--prompts",
            "12",
            "--generations",
            "4",
            "--max-tokens",
            "8",
            "--seed",
            "0",
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    res = report["results"]
    assert list(res) == ["fp32", "bf16", "fp16", "fp8-unified", "fp8-rollout"]
    tokens = {n: r["mismatch/tokens"] for n, r in res.items()}
    assert all(t > 100 for t in tokens.values()), tokens
    assert [(r["trainer"], r["rollout"]) for r in res.values()] == [
        ("fp32", "fp32"),
        ("bf16", "bf16"),
        ("fp16", "fp16"),
        ("fp8", "fp8"),
        ("bf16", "fp8"),
    ]
    k3 = {n: r["mismatch/k3"] for n, r in res.items()}
    print(f"\nmismatch/k3 per precision: {k3}")
    assert k3["bf16"] > k3["fp16"] > k3["fp32"] >= 0.0
    assert k3["bf16"] >= 10 * k3["fp16"] and k3["fp16"] >= 10 * k3["fp32"]
    assert k3["fp8-unified"] < k3["fp8-rollout"]
    # the report's derived fields agree with the raw numbers
    for name in res:
        assert res[name]["k3_vs_fp16"] == pytest.approx(k3[name] / k3["fp16"]), name
    assert report["checks"] == {"bf16 >= 10x fp16": True, "fp16 >= 10x fp32": True, "fp8-unified < fp8-rollout": True}
    assert report["workload"] == {"prompts": 12, "generations": 4, "max_tokens": 8, "seed": 0}


def test_bad_precision_name_is_one_line_and_exit_2(capsys):
    assert main(["bench", "mismatch", "--dtypes", "fp32,fp61"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "bench error: --dtypes: 'fp61' is not a precision; allowed: fp32, bf16, fp16, fp8-unified, "
        "fp8-rollout (did you mean 'fp16'?)"
    )


def test_fp8_full_finetune_trainer_is_the_rollout_model(model_path):
    """model.dtype = fp8, lora_rank = 0: bf16 master weights (not fp32), FP8 GEMMs, and the
    trainer's forward gives bit-identical logits to the hf rollout's fp8 copy on the same input."""
    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.model import policy_loader
    from grpo_studio.engine.sampler.hf import HFBackend

    cfg = bench.precision_config("fp8-unified", model=model_path, lora_rank=0)
    plan = resolve(cfg)
    tok = policy_loader.load_tokenizer(model_path)
    policy = policy_loader.load_policy(cfg, model_path, plan)
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    rollout = HFBackend(model_path, tok, plan).model
    ids = torch.tensor([tok.encode("12+30=", add_special_tokens=False)])
    with torch.no_grad(), policy_loader.autocast(precision_plan.resolve(cfg)):
        trainer_logits = policy(input_ids=ids).logits
    with torch.no_grad():
        rollout_logits = rollout(input_ids=ids).logits
    assert torch.equal(trainer_logits, rollout_logits)
