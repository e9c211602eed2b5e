"""The metric schema (contract/metrics.py) against the trainer that writes through it."""

from __future__ import annotations

import json

import pytest

from grpo_studio.contract import config, metrics
from grpo_studio.contract.rundir import METRICS, RunWriter


def test_a_real_trainer_row_names_exactly_the_schema(tmp_path):
    """Every optional family switched on (fp16 scaler, KL to the reference, rollout correction,
    eval with pass@k and maj@k): the row the trainer wrote through RunWriter holds every schema name, and no other."""
    from grpo_studio.engine.run.trainer import Trainer

    cfg = config.load(
        "tiny-arith",
        [
            "train.steps=1",
            "train.prompts_per_step=2",
            "rollout.num_generations=2",
            "train.save_every=0",
            "train.eval_every=1",
            "train.eval_k=2",
            "model.dtype=fp16",
            "algo.beta=0.04",
            "algo.is_level=token",
            "algo.dynamic_sampling=true",
        ],
    )
    assert Trainer(cfg, tmp_path).run() == "finished"
    (row,) = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    # the one family a synchronous run cannot have: the mismatch of lagged tokens (rollout.async_mode one_step /
    # in_flight; tests/test_rollout_server.py::test_token_lags_in_metrics_and_histograms checks those rows)
    lagged = {"mismatch/lagged/k3", "mismatch/lagged/abs_dlogp_mean"}
    # and the families of multi-turn episodes (env.environment; tests/test_episodes_train.py writes those)
    episodes = {n for n in metrics.SCHEMA if n.startswith("env/")} | {"perf/env_s", "perf/model_s"}
    # and a mixture-of-experts model's router disagreement (tests/test_moe.py writes those)
    routers = {metrics.ROUTER_DISAGREE, metrics.ROUTER_DISAGREE_LAG0, metrics.ROUTER_DISAGREE_LAGGED}
    assert set(row) == set(metrics.names(["correctness", "format"])) - lagged - episodes - routers


def test_a_name_missing_from_the_schema_is_refused_before_it_is_written(tmp_path):
    writer = RunWriter(tmp_path)
    writer.metrics({"step": 1, "reward/mean": 0.5, "rewards/my_fn/std": 0.1})
    with pytest.raises(metrics.UnknownMetric) as err:
        writer.metrics({"step": 2, "reward/mean": 0.5, "reward/meen": 0.5})
    writer.release()
    assert str(err.value) == ("metrics row names reward/meen: not in the metric schema; add it to contract/metrics.py")
    assert (tmp_path / METRICS).read_text() == '{"step":1,"reward/mean":0.5,"rewards/my_fn/std":0.1}\n'


def test_reward_patterns_and_lookups():
    assert metrics.lookup("rewards/my_fn/std").name == "rewards/<fn>/std"
    assert metrics.lookup("reward/meen") is None and metrics.lookup("rewards/my_fn/max") is None
    assert metrics.reward_key("my_fn") == "rewards/my_fn/mean"
    assert metrics.reward_fn("rewards/my_fn/mean") == "my_fn" and metrics.reward_fn("reward/mean") is None
    names = metrics.names(["a", "b"])
    assert names[:3] == ["step", "time", "epoch"]
    assert names[6:10] == ["rewards/a/mean", "rewards/b/mean", "rewards/a/std", "rewards/b/std"]
    # env/tool_calls/<tool>, env/step/<name> and mismatch/router_disagree/layer<n>: the environment's tools and
    # step metrics, the model's MoE layers
    # and rewards/<fn>/mean|std, eval/rewards/<fn>/mean and eval/general/rewards/<fn>/mean: one name per function
    assert len(names) == len(metrics.SCHEMA) + 4 - 3
    assert metrics.lookup("eval/rewards/a/mean").name == "eval/rewards/<fn>/mean"
    assert metrics.lookup("eval/general/rewards/a/mean").name == "eval/general/rewards/<fn>/mean"
    assert metrics.lookup("eval/rewards/a/std") is None and metrics.reward_fn("eval/rewards/a/mean") is None
    assert metrics.lookup("env/tool_calls/add").name == "env/tool_calls/<tool>"
    assert metrics.lookup("env/step/range_halving").name == "env/step/<name>"
    assert metrics.lookup("mismatch/router_disagree/layer12").name == "mismatch/router_disagree/layer<n>"
    assert metrics.lookup("mismatch/router_disagree/layer") is None
    assert metrics.lookup("env/stop/done").name == "env/stop/done" and metrics.lookup("env/stop/other") is None


def test_every_entry_says_how_ranks_combine_it():
    assert {m.combine for m in metrics.SCHEMA.values()} == set(metrics.COMBINE)
    assert metrics.SCHEMA["mismatch/tokens"].combine == "sum" and metrics.SCHEMA["mismatch/is_min"].combine == "min"


def test_histogram_edges_four_per_decade_from_1e_8_to_10():
    edges = metrics.HIST_EDGES
    assert len(edges) == 37 and edges[0] == 1e-8 and edges[-1] == 10.0
    assert edges[4] == pytest.approx(1e-7) and edges[2] == pytest.approx(10**-7.5)
