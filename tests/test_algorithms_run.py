"""Issue 3 acceptance: every named algorithm trains the bundled tiny model for a short headless
run without NaN and logs the metrics its loss defines.

Which metrics each preset must log follows from contract/algorithms.py + engine/train/losses.py:
  clip/low, clip/high, clip/region, entropy     every preset (0.0 for the unclipped pg_* objective)
  kl_ref                                        only when algo.beta > 0 (no preset sets it; one extra
                                                case runs grpo with beta = 0.04)
  mismatch/is_min|is_mean|is_max, mismatch/ess  every step (mismatch telemetry from μ and π)
  mismatch/masked_frac                          only with rollout correction (algo.is_level resolves to
                                                token or sequence; 'auto' does on a vLLM rollout only)
"""

from __future__ import annotations

import json
import math

import pytest

from grpo_studio.contract import algorithms, config
from grpo_studio.engine.run.trainer import Trainer

STEPS = 2
CASES = [(name, 0.0) for name in config.ALGOS] + [("grpo", 0.04)]


def test_algo_name_accepts_exactly_the_presets():
    """config derives algo.name's choices from algorithms.PRESETS: all twelve, in preset order."""
    (info,) = [k for k in config.key_info() if k.key == "algo.name"]
    assert info.choices == (
        "grpo",
        "dapo",
        "dr_grpo",
        "gspo",
        "ppo",
        "ppo_token_tis",
        "ppo_seq_tis",
        "ppo_seq_mis",
        "pg_seq_is",
        "pg_seq_tis",
        "pg_seq_mis",
        "icepop",
    )


@pytest.mark.slow
@pytest.mark.parametrize("algo,beta", CASES, ids=[f"{a}-beta{b:g}" for a, b in CASES])
def test_algorithm_trains_without_nan_and_logs_its_metrics(tmp_path, model_name, algo, beta):
    run = tmp_path / "run"
    cfg = config.load(
        "tiny-arith",
        [
            f"model.name={model_name}",
            f"algo.name={algo}",
            f"algo.beta={beta}",
            f"train.steps={STEPS}",
            "train.prompts_per_step=2",
            "rollout.num_generations=4",
            "train.save_every=0",
        ],
    )
    assert cfg.algo.is_level == algorithms.PRESETS[algo]["algo.is_level"]
    trainer = Trainer(cfg, run)
    assert trainer.run() == "finished"
    corrected = algorithms.rollout_is_level(cfg.algo.is_level, trainer.grpo.sampler.name) != "none"  # 'auto': vLLM only
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))

    required = [
        "loss",
        "grad_norm",
        "reward/mean",
        "entropy",
        "clip/low",
        "clip/high",
        "clip/region",
        "mismatch/is_min",
        "mismatch/is_mean",
        "mismatch/is_max",
        "mismatch/ess",
        "mismatch/k3",
    ]
    if beta > 0:
        required.append("kl_ref")
    if corrected:
        required.append("mismatch/masked_frac")
    for row in rows:
        missing = [k for k in required if k not in row]
        assert not missing, f"{algo} step {row['step']}: missing {missing}"
        # the run log writes NaN/inf as null: no metric may be either
        bad = {k: v for k, v in row.items() if v is None or (isinstance(v, float) and not math.isfinite(v))}
        assert not bad, f"{algo} step {row['step']}: non-finite {bad}"
        assert ("kl_ref" in row) == (beta > 0)
        assert ("mismatch/masked_frac" in row) == corrected
        for k in ("clip/low", "clip/high", "clip/region"):
            assert 0.0 <= row[k] <= 1.0, (k, row[k])
        # ESS = (Σw)²/(nΣw²) ≤ 1 by Cauchy-Schwarz; the loss computes it in fp32, so allow rounding
        assert 0.0 < row["mismatch/ess"] <= 1.0 + 1e-5, row["mismatch/ess"]
        assert row["clip/region"] == pytest.approx(row["clip/low"] + row["clip/high"])  # disjoint: A<0 vs A>0
        assert row["mismatch/is_min"] <= row["mismatch/is_mean"] <= row["mismatch/is_max"]
        assert row["entropy"] > 0.0
        if algorithms.is_policy_gradient(algo):
            assert row["clip/region"] == 0.0  # the pg objective never clips
        if beta > 0:
            assert row["kl_ref"] >= 0.0  # k3 ≥ 0
