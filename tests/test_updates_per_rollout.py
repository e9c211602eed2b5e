"""Several optimizer steps per rollout in the real trainer on the bundled tiny-arith model:
train.num_iterations, train.steps_per_generation, π_old, policy lag, weight sync, and what a
truncated sampling distribution (rollout.top_k) does to the mismatch.

Oracles: the schedule TRL documents (a rollout every steps_per_generation × num_iterations optimizer
steps, the LR schedule per optimizer step), counts of what the sampler was asked, a forward of a copy of
the weights that sampled, and by hand the top-k renormalisation of that forward.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from grpo_studio.contract import config
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.run.trainer import Trainer

SMALL = [
    "train.prompts_per_step=4",
    "rollout.num_generations=4",
    "rollout.max_completion_len=6",
    "train.save_every=0",
    "train.eval_every=0",
    "train.seed=3",  # its rollout: rows of a reward spread with different lengths (grpo and dapo then differ)
]


def run(tmp_path, steps: int, *overrides: str, spy=None) -> tuple[Trainer, list[dict]]:
    trainer = Trainer(config.load("tiny-arith", [*SMALL, f"train.steps={steps}", *overrides]), tmp_path)
    if spy:
        spy(trainer)
    trainer.rundir.acquire()
    try:
        rows = [trainer.step() for _ in range(steps)]
    finally:
        trainer.rundir.release()
    return trainer, rows


def test_four_passes_clip_and_grpo_gspo_dapo_update_differently(tmp_path):
    """num_iterations = 4 at the recipe's learning rate: the first pass is on-policy (ratio 1, nothing
    clipped), later passes clip, and the three presets move the adapters differently from the same rollout.
    grpo (TRL's defaults: token-level loss, clip 0.2) and dapo (clip-higher 0.28, truncated rows masked) differ
    only where a ratio lands in (1.2, 1.28] or a row is cut: seed 5's rollout has such ratios (seeds 1 and 4 do
    not, and there the two updates are bitwise equal)."""
    deltas = {}
    for name in ("grpo", "gspo", "dapo"):
        trainer = Trainer(
            config.load(
                "tiny-arith", [*SMALL, "train.seed=5", "train.steps=4", "train.num_iterations=4", f"algo.name={name}"]
            ),
            tmp_path / name,
        )
        before = [p.detach().clone() for p in trainer.grpo.params]
        trainer.rundir.acquire()
        rows = [trainer.step() for _ in range(4)]
        trainer.rundir.release()
        deltas[name] = torch.cat([(p.detach() - b).flatten() for p, b in zip(trainer.grpo.params, before)])
        print(
            f"\n{name}: clip/low, high, region by step:",
            [(round(r["clip/low"], 3), round(r["clip/high"], 3), round(r["clip/region"], 3)) for r in rows],
        )

        assert [r["policy/lag"] for r in rows] == [0.0, 1.0, 2.0, 3.0]
        assert rows[0]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        assert rows[0]["policy/ratio_max"] == pytest.approx(1.0, abs=1e-6) and rows[0]["clip/region"] == 0.0
        assert all(r["clip/region"] > 0 for r in rows[1:]), name
        assert rows[-1]["policy/ratio_max"] > 1 + trainer.cfg.algo.epsilon_high  # π left the trust region
        assert len({r["reward/mean"] for r in rows}) == 1  # one rollout: its metrics on each of its rows
    for a, b in (("grpo", "gspo"), ("grpo", "dapo"), ("gspo", "dapo")):
        assert (deltas[a] - deltas[b]).abs().max() > 0.1 * deltas[a].abs().max(), (a, b)


def test_a_rollout_every_cycle_sync_after_its_last_step_lr_per_optimizer_step(tmp_path):
    """steps_per_generation = 2, num_iterations = 2, 8 steps: rollouts at steps 1 and 5 of 2 × 4 prompts,
    each step trains on 4 × 4 sequences, the sampler takes the weights after steps 4 and 8, and the linear
    LR schedule moves every optimizer step."""
    calls = {"generate": [], "load_weights": [], "rows": []}

    def spy(trainer):
        sampler = trainer.grpo.sampler
        generate, load, accumulate = sampler.generate, sampler.load_weights, trainer.grpo._accumulate
        sampler.generate = lambda ids, s: calls["generate"].append((trainer.step_no, len(ids))) or generate(ids, s)
        sampler.load_weights = lambda w: calls["load_weights"].append(trainer.step_no) or load(w)
        trainer.grpo._accumulate = lambda ids, *a: calls["rows"].append(len(ids)) or accumulate(ids, *a)

    lr = 0.002
    trainer, rows = run(
        tmp_path,
        8,
        "train.steps_per_generation=2",
        "train.num_iterations=2",
        "train.lr_schedule=linear",
        f"train.lr={lr}",
        spy=spy,
    )
    assert calls["generate"] == [(0, 8), (4, 8)]  # step_no before steps 1 and 5; prompts_per_step × 2
    assert calls["load_weights"] == [3, 7]  # during steps 4 and 8, after their optimizer step
    assert calls["rows"] == [16] * 8
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert [r["policy/lag"] for r in rows] == [0.0, 1.0, 2.0, 3.0] * 2
    assert [r["lr"] for r in rows] == pytest.approx([lr * (1 - k / 8) for k in range(1, 9)], rel=1e-12)
    assert [r["perf/rollout_s"] > 0 for r in rows] == [True, False, False, False] * 2
    assert len({r["mismatch/k3"] for r in rows[:4]}) == 1 and rows[0]["mismatch/k3"] != rows[4]["mismatch/k3"]
    steps = lambda name: sorted({json.loads(line)["step"] for line in (tmp_path / name).read_text().splitlines()})  # noqa: E731
    assert steps("samples.jsonl") == [1, 5] and steps("histograms.jsonl") == [1, 5]  # once per rollout


def test_pi_old_is_the_sampling_weights_and_only_computed_when_it_can_differ(tmp_path, monkeypatch):
    starts, computed = [], []

    def spy(trainer):
        real = trainer.grpo._old_logps
        starts.append(copy.deepcopy(trainer.policy))
        monkeypatch.setattr(trainer.grpo, "_old_logps", lambda batch: computed.append(batch) or real(batch))

    trainer, rows = run(tmp_path / "one", 1, spy=spy)  # one update per rollout: π_old is π.detach()
    assert computed == [] and trainer.grpo.batch.inputs.old_logps is None
    assert rows[0]["policy/ratio_max"] == 1.0 and rows[0]["clip/region"] == 0.0

    trainer, rows = run(tmp_path / "two", 2, "train.steps_per_generation=2", spy=spy)
    (batch,) = computed
    with torch.no_grad():
        sampled = trainer.grpo._logps(starts[-1], batch.input_ids, batch.attention, batch.inputs.mask.shape[1])[0]
    scored = batch.inputs.mask.bool()  # the shared-prefix pass leaves the padding after a completion out (reads 0)
    torch.testing.assert_close(batch.inputs.old_logps[scored], sampled[scored], atol=1e-6, rtol=0)
    assert rows[1]["policy/ratio_max"] > 1.0  # the second half trains on weights one step newer


def test_a_run_resumed_between_rollouts_is_the_uninterrupted_run(tmp_path):
    """CPU fp32, num_iterations = 2, save_every = 2 (the cycle): stopped after step 2's checkpoint and
    resumed to step 4, the metrics and the adapters are those of one run of 4 steps."""
    sets = [*SMALL, "train.num_iterations=2", "train.save_every=2"]
    whole = Trainer(config.load("tiny-arith", [*sets, "train.steps=4"]), tmp_path / "whole")
    whole.run()
    Trainer(config.load("tiny-arith", [*sets, "train.steps=2"]), tmp_path / "cut").run()
    resumed = Trainer(config.load("tiny-arith", [*sets, "train.steps=4"]), tmp_path / "cut", resume=True)
    assert resumed.run() == "finished"
    keys = ("reward/mean", "loss", "grad_norm", "mismatch/k3", "clip/region", "policy/ratio_max", "policy/lag")
    rows = {
        name: [
            {k: json.loads(line)[k] for k in keys}
            for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]
        for name in ("whole", "cut")
    }
    assert [r["policy/lag"] for r in rows["whole"]] == [0.0, 1.0, 0.0, 1.0] and rows["cut"] == rows["whole"]
    assert all(torch.equal(a, b) for a, b in zip(whole.grpo.params, resumed.grpo.params))


def test_save_every_inside_a_rollout_is_refused():
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", ["train.num_iterations=3", "train.save_every=20"])
    assert str(err.value) == (
        "config error: train.save_every = 20: must be a multiple of train.steps_per_generation "
        "× train.num_iterations (3), so a checkpoint never falls between the updates of one "
        "rollout; or 0 = only at the end"
    )
    assert config.load("tiny-arith", ["train.num_iterations=3", "train.save_every=21"]).train.save_every == 21


def test_top_k_with_rollout_correction_is_refused_in_one_line():
    """Refused where pi is the full distribution (algo.logprob_support = full); with pi on the sampler's
    support (the default) the correction is allowed."""
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", ["rollout.top_k=8", "algo.is_level=token", "algo.logprob_support=full"])
    assert str(err.value) == (
        "config error: rollout.top_k = 8: algo.is_level = 'token' corrects towards the sampler's "
        "mu, which this truncates while pi does not with algo.logprob_support = 'full'; set "
        "algo.logprob_support = 'sampler' or algo.is_level = 'none', or sample the "
        "full distribution (rollout.top_k = 0, rollout.top_p = 1)"
    )
    assert config.load("tiny-arith", ["rollout.top_k=8", "algo.is_level=token"]).algo.is_level == "token"
    # TRL's default correction ('auto') is on for a vLLM rollout only: refused there, accepted with hf
    with pytest.raises(UserError, match=r"rollout.top_p = 0.9: algo.is_level = 'auto' \(sequence for the vllm"):
        config.validate(
            _with(config.Config(), rollout__backend="vllm", rollout__top_p=0.9, algo__logprob_support="full")
        )
    config.validate(_with(config.Config(), rollout__backend="hf", rollout__top_p=0.9, algo__logprob_support="full"))


def _with(cfg: config.Config, **keys) -> config.Config:
    for name, value in keys.items():
        section, key = name.split("__")
        setattr(getattr(cfg, section), key, value)
    return cfg


def test_top_k_mu_is_the_renormalised_pi_and_the_run_says_so(tmp_path):
    """With top_k = 8 the sampler's μ of each sampled token is π renormalised over the 8 most likely tokens:
    log μ − log π = −log Z_t, Z_t the top-8 mass of π at that position (by hand from a forward of the
    sampling weights), so with π on the whole vocabulary (algo.logprob_support = full) mismatch/k1 =
    mean(−log Z_t) > 0. The run writes one warning event saying so."""
    starts = []
    trainer, rows = run(
        tmp_path,
        1,
        "rollout.top_k=8",
        "rollout.temperature=0.7",
        "algo.logprob_support=full",
        "train.score_zero_advantage=true",  # π on every row, so the mean below is over the whole rollout
        spy=lambda t: starts.append(copy.deepcopy(t.policy)),
    )
    b, T = trainer.grpo.batch, trainer.grpo.batch.inputs.mask.shape[1]
    with torch.no_grad():
        logits = (
            starts[0](
                input_ids=b.input_ids,
                attention_mask=b.attention,
                position_ids=(b.attention.cumsum(-1) - 1).clamp(min=0),
            )
            .logits[:, -T - 1 : -1]
            .float()
        )
    logp = torch.log_softmax(logits / 0.7, -1)
    pi = logp.gather(-1, b.input_ids[:, -T:, None]).squeeze(-1)
    log_z = torch.logsumexp(logp.topk(8, dim=-1).values, dim=-1)
    live = b.rollout.mask.bool()
    torch.testing.assert_close(b.rollout.logprobs[live] - pi[live], -log_z[live], atol=1e-4, rtol=0)
    assert rows[0]["mismatch/k1"] == pytest.approx(float(-log_z[live].mean()), rel=1e-3)
    warnings = [
        e
        for e in map(json.loads, (tmp_path / "events.jsonl").read_text().splitlines())
        if e["event"] == "warning" and "rollout.top_k = 8" in e["message"]
    ]
    assert len(warnings) == 1
