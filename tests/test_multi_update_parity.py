"""Several optimizer steps per rollout (train.num_iterations = 2, train.steps_per_generation = 2) against
TRL 1.16's own code.

Our Trainer takes four optimizer steps on one rollout of the bundled tiny-arith model. At each step, after
our backward and before our AdamW step (so on the very weights our loss saw), the oracle asks TRL for the
same step and computes it:
- the rows of the step come from `GRPOTrainer._prepare_inputs`, TRL's buffering of a generation batch:
  shuffled once (`shuffle_sequence_dict`, global RNG seeded with the seed our shuffle uses), split into
  steps_per_generation parts, the parts reused num_iterations times; its generation is stubbed to hand
  over our rollout (prompts, completions, loss mask, advantages, π_old, and for the IS cases the ratio of
  TRL's own IS block from π_old and the sampler's μ);
- the loss, its gradient w.r.t. every trained parameter and the clip metrics come from
  `GRPOTrainer._compute_loss` with `old_per_token_logps` present and TRL's dapo normaliser over
  steps_per_generation; its log-probs are the trainer's forward on TRL's rows.
Equal rows, loss, gradients and clip metrics at every step, to 1e-6. π_old is checked against a forward
of a copy of the starting weights: the weights that sampled the rollout.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from grpo_studio.contract import algorithms, config
from grpo_studio.engine.prompts import data
from grpo_studio.engine.rollout.batching import spans
from grpo_studio.engine.run.trainer import Trainer
from tests.test_losses_trl_parity import GRPOTrainer, trl_is_ratio, trl_trainer

TOL = 1e-6
STEPS = 4  # num_iterations × steps_per_generation: one rollout
SETTINGS = [
    "train.num_iterations=2",
    "train.steps_per_generation=2",
    "train.score_zero_advantage=true",  # every row run, so the entropy and clip metrics are over TRL's rows
    f"train.steps={STEPS}",
    "train.save_every=0",
    "train.eval_every=0",
    "train.prompts_per_step=2",
    "rollout.num_generations=4",
    "train.lr=0.01",
    "rollout.temperature=0.7",
    "train.seed=5",
]
CASES = {
    "grpo": [],  # TRL's defaults: dapo normaliser, token ratio, symmetric clip (no IS with the hf rollout)
    "dapo": ["algo.name=dapo"],
    "dr_grpo": ["algo.name=dr_grpo"],
    "gspo": ["algo.name=gspo"],
    "bnpo-delta": ["algo.loss_type=bnpo", "algo.delta=1.5"],
    "sequence_mask": ["algo.is_level=sequence"],  # TRL's default vLLM correction: sequence_mask, C = 3
    "token_truncate": ["algo.name=ppo_token_tis"],
}
prepare_inputs = inspect.unwrap(GRPOTrainer._prepare_inputs)  # without TRL's profiling wrapper


def oracle(cfg: config.Config, trainer: Trainer):
    a = cfg.algo
    level = algorithms.rollout_is_level(a.is_level, trainer.grpo.sampler.name)
    t = trl_trainer(
        loss_type=a.loss_type,
        epsilon=a.epsilon,
        epsilon_high=a.epsilon_high,
        delta=a.delta or None,
        beta=a.beta,
        use_bias_correction_kl=a.use_bias_correction_kl,
        importance_sampling_level=a.importance_sampling_level,
        vllm_is=level != "none",
        max_completion_length=cfg.rollout.max_completion_len,
        steps_per_generation=cfg.train.steps_per_generation,
        num_iterations=cfg.train.num_iterations,
    )

    def generation_batch(_):
        b = trainer.grpo.batch
        P = b.input_ids.shape[1] - b.inputs.mask.shape[1]
        out = {
            "prompt_ids": b.input_ids[:, :P],
            "prompt_mask": b.attention[:, :P],
            "completion_ids": b.input_ids[:, P:],
            "completion_mask": b.inputs.mask,
            "advantages": b.inputs.advantages,
            "num_items_in_batch": b.inputs.mask.sum(),
            "old_per_token_logps": b.inputs.old_logps,
            "row": torch.arange(len(b.input_ids)),
        }
        if level != "none":
            out["importance_sampling_ratio"] = trl_is_ratio(
                f"{level}_{a.is_mode}", a.is_cap, b.inputs.old_logps, b.inputs.rollout_logps, b.inputs.mask
            )
        return out

    def logps(model, input_ids, attention_mask, logits_to_keep, **_):
        rows = t.current_rows  # TRL's attention mask zeroes what follows EOS; the rows' own mask is ours
        assert torch.equal(input_ids, trainer.grpo.batch.input_ids[rows])
        lp, entropy = trainer.grpo._logps(
            model, input_ids, trainer.grpo.batch.attention[rows], logits_to_keep, with_entropy=True
        )
        return lp, entropy, None

    t._generate_and_score_completions = generation_batch
    t._get_per_token_logps_and_entropies = logps
    return t


@pytest.mark.parametrize("case", CASES)
def test_four_updates_on_one_rollout_equal_trl(tmp_path, monkeypatch, case):
    cfg = config.load("tiny-arith", [*SETTINGS, *CASES[case]])
    trainer = Trainer(cfg, tmp_path / "run")
    start = copy.deepcopy(trainer.policy)
    trl = oracle(cfg, trainer)
    plans, seen = [], []

    real_plan, real_optimize = trainer.grpo._update_plan, trainer.grpo._optimize

    def update_plan(n):
        plans.extend(real_plan(n))
        return list(plans)

    def optimize(loss):  # our gradients are in .grad, our weights not yet stepped
        ours = [p.grad.clone() for p in trainer.grpo.params]
        trainer.grpo.optimizer.zero_grad(set_to_none=True)
        if trl._buffered_inputs is None:  # TRL shuffles with the global RNG: the seed our shuffle used
            torch.manual_seed(data.mix_seed(cfg.train.seed, 0))
        inputs = prepare_inputs(trl, None)
        trl._step += 1  # GRPOTrainer.training_step
        trl.current_rows = inputs["row"]
        trl_loss = trl._compute_loss(trainer.policy, inputs)
        trl_loss.backward()
        theirs = [p.grad.clone() for p in trainer.grpo.params]
        for p, g in zip(trainer.grpo.params, ours):
            p.grad = g.clone()  # our optimizer clips .grad in place
        metrics = {k: v[-1] for k, v in trl._metrics["train"].items()}
        seen.append((loss, trl_loss.item(), ours, theirs, inputs["row"], metrics))
        return real_optimize(loss)

    monkeypatch.setattr(trainer.grpo, "_update_plan", update_plan)
    monkeypatch.setattr(trainer.grpo, "_optimize", optimize)
    trainer.rundir.acquire()
    try:
        rows = [trainer.step() for _ in range(STEPS)]
    finally:
        trainer.rundir.release()

    # π_old: the weights that sampled the rollout, computed once
    b = trainer.grpo.batch
    T = b.inputs.mask.shape[1]
    with torch.no_grad():
        sampled = trainer.grpo._logps(start, b.input_ids, b.attention, T, spans(b.rollout.mask))[0]
    torch.testing.assert_close(b.inputs.old_logps, sampled, atol=TOL, rtol=0)

    assert len(plans) == len(seen) == STEPS
    assert [r["policy/lag"] for r in rows] == [0.0, 1.0, 2.0, 3.0]
    clipped = 0.0
    for k, (row, plan, (loss, trl_loss, ours, theirs, trl_rows, m)) in enumerate(zip(rows, plans, seen)):
        assert torch.equal(plan, trl_rows), f"step {k + 1}: our rows {plan.tolist()}, TRL's {trl_rows.tolist()}"
        assert loss == pytest.approx(trl_loss, abs=TOL, rel=0), f"step {k + 1}"
        assert row["loss"] == loss
        for g, h in zip(ours, theirs):
            torch.testing.assert_close(g, h, atol=TOL, rtol=0)
        for key in ("low", "high", "region"):
            assert row[f"clip/{key}"] == pytest.approx(m[f"clip_ratio/{key}_mean"], abs=TOL), (k + 1, key)
        assert row["entropy"] == pytest.approx(m["entropy"], abs=TOL)
        clipped += row["clip/region"]
    assert plans[0].tolist() != sorted(plans[0].tolist())  # shuffled
    assert sorted(torch.cat(plans[:2]).tolist()) == list(range(len(b.input_ids)))  # two halves of the rollout
    assert all(torch.equal(plans[k], plans[k + 2]) for k in range(2))  # the second pass reuses the split
    assert rows[0]["policy/ratio_mean"] == pytest.approx(1.0, abs=TOL)  # first update: π = π_old
    assert abs(rows[-1]["policy/ratio_mean"] - 1.0) > 1e-3  # later updates are off-policy
    assert clipped > 0, "the clip must act in some step, or this test cannot tell the clip ranges apart"
