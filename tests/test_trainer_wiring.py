"""What `Trainer.step()` hands to the loss and to the mismatch metrics, checked against an
independent computation from the same rollout.

Each test runs real trainer steps on the bundled tiny-arith model at a sampling temperature
T = 0.7 (every temperature bug is invisible at T = 1) and spies on the names engine/train/grpo_step.py
imported (`policy_loss`, `mismatch_metrics`, `dlogp_histogram`) and on the sampler, so it sees
exactly what each one received. The oracles:

  μ  the rollout's own log-probs, and a plain forward of the pre-step policy, one row at a time
     without padding: log_softmax(logits / T) gathered at the sampled tokens;
  π  the same plain forward (TRL issue 4159: π must use the sampler's T, not 1);
  π_ref  a freshly loaded copy of the base weights, same forward, same T (algo.beta > 0);
  mask   the rollout's completion mask, times (not truncated) when mask_truncated_completions;
  advantages  the group z-score (or centring / batch std) of the weighted reward table, by hand.
"""

from __future__ import annotations

import copy
import inspect
import re

import pytest
import torch

from grpo_studio.contract import algorithms, config
from grpo_studio.contract.planner import micro_batch
from grpo_studio.engine.precision import mismatch
from grpo_studio.engine.run.trainer import Trainer
from grpo_studio.engine.train import grpo_step, losses

TEMP = 0.7
G = 4
# max_completion_len = 4 cuts the tiny model's usual "<answer>NN</answer><eos>" (5 tokens) while its
# short answers ("NN<eos>") end in time, so a step holds truncated and complete rows.
BASE = [
    "train.prompts_per_step=4",
    f"rollout.num_generations={G}",
    f"rollout.temperature={TEMP}",
    "rollout.max_completion_len=4",
    "data.general_size=0",  # one eval set: the evaluate test counts one sampling call
    "train.steps=3",
    "train.seed=3",  # a step with truncated and complete rows, and a group with a reward spread
    "train.score_zero_advantage=true",  # every row run, the micro-batches in rollout order
]
ATOL = 2e-5  # fp32 forward of different batch shapes (padding, row count) on one CPU


def load(*overrides: str) -> config.Config:
    return config.load("tiny-arith", [*BASE, *overrides])


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """One trainer for the wiring tests; each test installs the config it needs (the step reads
    self.cfg at call time, so this is the same code path as a fresh trainer with that config)."""
    t = Trainer(load(), tmp_path_factory.mktemp("wiring") / "run")
    t.rundir.acquire()
    yield t
    t.rundir.release()
    t.close()


# ---- spies and oracles ------------------------------------------------------------------------


class Spy:
    """Records every call of the functions the trainer uses, with arguments bound by name."""

    def __init__(self, monkeypatch, trainer: Trainer):
        self.loss, self.mismatch, self.hist, self.rollouts, self.tables = [], [], [], [], []
        self.optimizer_lrs = []
        self._wrap(monkeypatch, "policy_loss", losses.policy_loss, self.loss)
        self._wrap(monkeypatch, "mismatch_metrics", mismatch.mismatch_metrics, self.mismatch)
        self._wrap(monkeypatch, "dlogp_histogram", mismatch.dlogp_histogram, self.hist)
        generate, score = trainer.grpo.sampler.generate, trainer.grpo.rollouts.score

        def generate_spy(prompt_ids, sampling):
            out = generate(prompt_ids, sampling)
            self.rollouts.append((prompt_ids, sampling, out))
            return out

        def score_spy(*args, **kwargs):
            table = score(*args, **kwargs)
            self.tables.append(table)
            return table

        monkeypatch.setattr(trainer.grpo.sampler, "generate", generate_spy)
        monkeypatch.setattr(trainer.grpo.rollouts, "score", score_spy)

    @staticmethod
    def _wrap(monkeypatch, name, real, calls):
        signature = inspect.signature(real)

        def spy(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            result = real(*args, **kwargs)
            calls.append({**{k: _snapshot(v) for k, v in bound.arguments.items()}, "result": _snapshot(result)})
            return result

        monkeypatch.setattr(grpo_step, name, spy)


def _snapshot(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, losses.LossInputs):
        return losses.LossInputs(**{k: _snapshot(v) for k, v in vars(value).items()})
    if isinstance(value, tuple):
        return tuple(_snapshot(v) for v in value)
    return value


@torch.no_grad()
def plain_logps(model, prompt_ids: list[list[int]], completions: torch.Tensor, temperature: float):
    """(log-probs, entropy) [B, T] of the completion tokens: one unpadded row at a time through the
    model's own forward (default positions), logits / temperature, log_softmax, gather."""
    model = copy.deepcopy(model).eval()
    n = completions.shape[0] // len(prompt_ids)
    logps, entropy = [], []
    for b, row in enumerate(completions.tolist()):
        prompt = prompt_ids[b // n]
        logits = model(input_ids=torch.tensor([prompt + row])).logits[0].float()
        logsm = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(row)] / temperature, dim=-1)
        logps.append(logsm.gather(-1, torch.tensor(row)[:, None]).squeeze(-1))
        entropy.append(-(logsm.exp() * logsm).sum(-1))
    return torch.stack(logps), torch.stack(entropy)


def hand_advantages(table, weights, group: int, scale: str) -> torch.Tensor:
    r = torch.tensor(table, dtype=torch.float64)
    assert not torch.isnan(r).any()  # tiny-arith's rewards score every completion
    total = (r * torch.tensor(weights, dtype=torch.float64)).sum(1)
    g = total.view(-1, group)
    centred = g - g.mean(1, keepdim=True)  # always centred on the group mean (TRL 1.16)
    if scale == "none":
        return centred.flatten()
    if scale == "batch":  # divided by the std of the whole batch
        return centred.flatten() / (total.std() + 1e-4)
    return (centred / (g.std(1, keepdim=True) + 1e-4)).flatten()  # unbiased std, as TRL


def one_step(trainer: Trainer, cfg: config.Config, monkeypatch):
    """Install cfg, snapshot the policy, run one step under the spies."""
    if cfg.train.micro_batch_size == micro_batch.AUTO:  # Trainer resolves auto for its step: here the whole step
        cfg.train.micro_batch_size = 0
    trainer.cfg = trainer.grpo.cfg = trainer.grpo.rollouts.cfg = cfg
    before = copy.deepcopy(trainer.policy)
    spy = Spy(monkeypatch, trainer)
    row = trainer.step()
    return spy, before, row


def expected_mask(out, mask_truncated: bool) -> torch.Tensor:
    return out.mask * (~out.truncated).float().unsqueeze(1) if mask_truncated else out.mask


# ---- the loss and the mismatch metrics get (μ, π, mask) at the sampler's temperature --------------


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_loss_and_mismatch_get_mu_pi_and_mask_at_the_sampler_temperature(trainer, monkeypatch, mask_truncated):
    cfg = load(f"algo.mask_truncated_completions={str(mask_truncated).lower()}")
    spy, before, row = one_step(trainer, cfg, monkeypatch)

    # the sampler was asked for the run's sampling settings
    ((prompt_ids, sampling, out),) = spy.rollouts
    assert (sampling.n, sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.top_k) == (
        G,
        4,
        TEMP,
        1.0,
        0,
    )
    assert out.truncated.any() and not out.truncated.all(), "the step must hold truncated and complete rows"
    live = out.mask.bool()

    # μ: the sampler's log-probs are the plain forward at T (not at 1)
    pi_oracle, entropy_oracle = plain_logps(before, prompt_ids, out.completion_ids, TEMP)
    torch.testing.assert_close(out.logprobs[live], pi_oracle[live], atol=ATOL, rtol=0)
    pi_at_1, _ = plain_logps(before, prompt_ids, out.completion_ids, 1.0)
    assert (pi_at_1[live] - pi_oracle[live]).abs().max() > 100 * ATOL  # T matters on this rollout

    # the loss: π at T, π_old = π, μ = the rollout's, the (truncation-)mask, advantages by hand
    (call,) = spy.loss
    inp: losses.LossInputs = call["inp"]
    # on the completion tokens: the shared-prefix pass leaves the padding after a completion out (reads 0)
    torch.testing.assert_close(inp.logps[live], pi_oracle[live], atol=ATOL, rtol=0)
    assert torch.equal(inp.old_logps, inp.logps)
    assert torch.equal(inp.rollout_logps, out.logprobs)
    mask = expected_mask(out, mask_truncated)
    assert torch.equal(inp.mask, mask)
    torch.testing.assert_close(inp.entropy[live], entropy_oracle[live], atol=ATOL, rtol=0)
    assert inp.ref_logps is None  # beta = 0
    (table,) = spy.tables
    adv = hand_advantages(table, [1.0, 1.0], G, "group")
    assert adv.abs().max() > 0.1  # some group has a reward spread, so scaling is visible
    torch.testing.assert_close(inp.advantages.double(), adv, atol=1e-5, rtol=0)
    assert call["algo"] is cfg.algo
    assert call["max_completion_len"] == 4
    assert float(call["num_items_in_batch"]) == float(mask.sum())
    assert row["loss"] == pytest.approx(float(call["result"][0]), abs=1e-7)

    # the mismatch metrics and histogram: (μ, π, completion mask), in that order
    for name, calls in (("mismatch_metrics", spy.mismatch), ("dlogp_histogram", spy.hist)):
        (m,) = calls
        assert torch.equal(m["rollout_logps"], out.logprobs), name
        assert torch.equal(m["train_logps"], inp.logps), name
        assert torch.equal(m["mask"], out.mask), name
    mm = spy.mismatch[0]["result"]
    for key in ("mismatch/k1", "mismatch/k3", "mismatch/abs_dlogp_max", "mismatch/tokens"):
        assert row[key] == mm[key], key
    assert mm["mismatch/tokens"] == float(out.mask.sum())
    assert mm["mismatch/abs_dlogp_max"] < ATOL  # μ and π agree at the same T and the same weights
    assert row["completion/truncated_frac"] == pytest.approx(out.truncated.float().mean().item())


# ---- each algorithm preset's switches reach the loss ------------------------------------------------


@pytest.mark.parametrize("name", list(algorithms.PRESETS))
def test_each_preset_reaches_the_loss(trainer, monkeypatch, name):
    cfg = load(f"algo.name={name}")
    spy, _, _ = one_step(trainer, cfg, monkeypatch)
    ((_, _, out),) = spy.rollouts
    (call,) = spy.loss
    algo = call["algo"]
    for key, value in algorithms.PRESETS[name].items():
        assert getattr(algo, key.split(".", 1)[1]) == value, key
    inp = call["inp"]
    assert torch.equal(inp.mask, expected_mask(out, algorithms.PRESETS[name]["algo.mask_truncated_completions"]))
    (table,) = spy.tables
    adv = hand_advantages(table, [1.0, 1.0], G, algorithms.PRESETS[name]["algo.scale_rewards"])
    torch.testing.assert_close(inp.advantages.double(), adv, atol=1e-5, rtol=0)
    assert float(call["num_items_in_batch"]) == float(inp.mask.sum())


def test_presets_differ_where_the_papers_say():
    """The switches the presets exist for, named explicitly: DAPO masks truncated completions and
    uses the token-sum loss with clip-higher; Dr. GRPO only centres rewards and divides by B·L_max;
    GSPO uses one sequence-level ratio with a 3e-4/4e-4 clip."""
    p = algorithms.PRESETS
    assert (
        p["dapo"]["algo.mask_truncated_completions"],
        p["dapo"]["algo.loss_type"],
        p["dapo"]["algo.epsilon_high"],
    ) == (True, "dapo", 0.28)
    assert (p["dr_grpo"]["algo.scale_rewards"], p["dr_grpo"]["algo.loss_type"]) == ("none", "dr_grpo")
    assert (p["gspo"]["algo.importance_sampling_level"], p["gspo"]["algo.epsilon"], p["gspo"]["algo.epsilon_high"]) == (
        "sequence",
        3e-4,
        4e-4,
    )
    assert p["grpo"]["algo.mask_truncated_completions"] is False and p["grpo"]["algo.scale_rewards"] == "group"


@pytest.mark.parametrize("scale", ["batch", "none"])
def test_scale_rewards_reaches_the_advantages(trainer, monkeypatch, scale):
    for _ in range(4):  # the first step whose batch tells the scalings apart (equal stds happen)
        with monkeypatch.context() as patch:
            spy, _, _ = one_step(trainer, load(f"algo.scale_rewards={scale}"), patch)
        (table,) = spy.tables
        wanted = hand_advantages(table, [1.0, 1.0], G, scale)
        if (wanted - hand_advantages(table, [1.0, 1.0], G, "group")).abs().max() > 1e-3:
            break
    else:
        pytest.fail("four steps in a row where group and batch scaling agree")
    torch.testing.assert_close(spy.loss[0]["inp"].advantages.double(), wanted, atol=1e-5, rtol=0)


def test_reward_weights_reach_the_advantages(tmp_path, monkeypatch):
    """rewards.weights is read when the trainer is built, so this one gets its own trainer."""
    t = Trainer(load("rewards.weights=[2.0, 0.25]", "algo.scale_rewards=none"), tmp_path / "run")
    t.rundir.acquire()
    try:
        spy, _, _ = one_step(t, t.cfg, monkeypatch)
    finally:
        t.rundir.release()
    (table,) = spy.tables
    wanted = hand_advantages(table, [2.0, 0.25], G, "none")
    assert (wanted - hand_advantages(table, [1.0, 1.0], G, "none")).abs().max() > 0.1
    torch.testing.assert_close(spy.loss[0]["inp"].advantages.double(), wanted, atol=1e-5, rtol=0)


# ---- evaluate() samples at the run's temperature ------------------------------------------------------


def test_evaluate_samples_at_the_run_temperature_and_scores_by_hand(trainer, monkeypatch):
    # room for "<answer>NN</answer>"
    trainer.cfg = trainer.grpo.cfg = trainer.grpo.rollouts.cfg = load(
        "rollout.max_completion_len=8", "train.micro_batch_size=0"
    )
    spy = Spy(monkeypatch, trainer)
    before = copy.deepcopy(trainer.policy)
    accuracy = trainer.evaluate(limit=12)
    ((prompt_ids, sampling, out),) = spy.rollouts
    assert (sampling.n, sampling.temperature, sampling.max_tokens) == (1, TEMP, 8)
    live = out.mask.bool()
    pi, _ = plain_logps(before, prompt_ids, out.completion_ids, TEMP)
    torch.testing.assert_close(out.logprobs[live], pi[live], atol=ATOL, rtol=0)
    # accuracy by hand: the share of completions whose <answer> is the row's answer
    texts = trainer.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
    rows = trainer.eval_rows[:12]
    right = 0
    for text, row in zip(texts, rows):
        found = re.search(r"<answer>\s*(-?\d+)\s*</answer>", text)
        right += bool(found) and int(found.group(1)) == int(row["answer"])
    assert accuracy == right / 12
    assert 0 < right < 12  # some right, some wrong: the count is not trivially all or nothing


# ---- the reference policy (algo.beta > 0) at the sampler's temperature ------------------------------


@pytest.mark.parametrize("lora_rank", [16, 0])
def test_reference_logps_are_the_base_model_at_the_sampler_temperature(tmp_path, monkeypatch, lora_rank):
    """Two steps, so the policy has moved from the base: the reference must still be the base
    weights (LoRA: adapters disabled; full fine-tune: a frozen copy), at T, not at 1."""
    from transformers import AutoModelForCausalLM

    cfg = load("algo.beta=0.04", f"model.lora_rank={lora_rank}", "train.steps=2", "train.lr=0.01")
    t = Trainer(cfg, tmp_path / "run")
    t.rundir.acquire()
    try:
        t.step()
        spy = Spy(monkeypatch, t)
        row = t.step()
    finally:
        t.rundir.release()
    base = AutoModelForCausalLM.from_pretrained(t.model_path, dtype=torch.float32)
    ((prompt_ids, sampling, out),) = spy.rollouts
    assert sampling.temperature == TEMP
    inp = spy.loss[0]["inp"]
    ref, _ = plain_logps(base, prompt_ids, out.completion_ids, TEMP)
    live = out.mask.bool()
    torch.testing.assert_close(inp.ref_logps[live], ref[live], atol=ATOL, rtol=0)
    assert (inp.ref_logps[live] - inp.logps[live]).abs().max() > 100 * ATOL  # the policy did move
    # kl_ref: k3 of (ref, π), times the ratio π/π_old = 1, averaged over the loss mask
    d = ref - inp.logps
    k3 = torch.exp(d) - d - 1
    assert row["kl_ref"] == pytest.approx(float((k3 * inp.mask).sum() / inp.mask.sum()), rel=1e-3, abs=1e-9)
