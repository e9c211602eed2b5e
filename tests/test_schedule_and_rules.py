"""The learning-rate schedule and the config's cross-field rules, against hand-computed values.

Schedule (GRPOStep._lr_factor, the LambdaLR multiplier after `done` optimizer steps, warm-up w,
run length S):
    done < w:   (done + 1) / (w + 1)            the first step already trains at lr/(w+1)
    after:      p = (done - w) / max(1, S - w)
                constant 1;  linear max(0, 1 - p);  cosine ½(1 + cos(π·min(1, p)))
The trainer steps the LambdaLR once per *taken* optimizer step: a skipped (non-finite) step
leaves the learning rate where it was.

Cross-field rules (config.validate): each rule with one failing case (the exact one-line message)
and a passing case at its boundary.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from grpo_studio.contract import config
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.run.trainer import Trainer
from grpo_studio.engine.train.grpo_step import GRPOStep

# ---- the schedule --------------------------------------------------------------------------------


def factor(schedule: str, warmup: int, steps: int, done: int) -> float:
    cfg = config.Config()
    cfg.train.lr_schedule, cfg.train.warmup_steps, cfg.train.steps = schedule, warmup, steps
    return GRPOStep._lr_factor(SimpleNamespace(cfg=cfg), done)


# (schedule, warmup, steps) → {done: factor}, worked by hand
HAND = {
    ("constant", 0, 10): {0: 1.0, 5: 1.0, 9: 1.0, 10: 1.0},
    ("constant", 3, 10): {0: 0.25, 1: 0.5, 2: 0.75, 3: 1.0, 9: 1.0},
    ("linear", 0, 10): {0: 1.0, 1: 0.9, 5: 0.5, 9: 0.1, 10: 0.0, 12: 0.0},
    # warm-up 4 of 12: 1/5 .. 4/5, then 1 - (done - 4)/8
    ("linear", 4, 12): {0: 0.2, 1: 0.4, 3: 0.8, 4: 1.0, 6: 0.75, 8: 0.5, 11: 0.125, 12: 0.0, 13: 0.0},
    ("cosine", 0, 8): {
        0: 1.0,
        2: 0.5 * (1 + math.cos(math.pi / 4)),
        4: 0.5,
        6: 0.5 * (1 + math.cos(3 * math.pi / 4)),
        8: 0.0,
        9: 0.0,
    },
    ("cosine", 2, 10): {0: 1 / 3, 1: 2 / 3, 2: 1.0, 4: 0.5 * (1 + math.cos(math.pi / 4)), 6: 0.5, 10: 0.0, 11: 0.0},
    # warm-up as long as the run: the divisor max(1, S - w) is 1, so the decay is over in one step
    ("linear", 5, 5): {4: 5 / 6, 5: 1.0, 6: 0.0},
    ("cosine", 5, 5): {5: 1.0, 6: 0.0},
}


@pytest.mark.parametrize("key", list(HAND), ids=["-".join(map(str, k)) for k in HAND])
def test_lr_factor_hand_values(key):
    for done, want in HAND[key].items():
        assert factor(*key, done) == pytest.approx(want, abs=1e-12), (key, done)


def test_lr_factor_is_monotone_where_it_should_be():
    lin = [factor("linear", 3, 20, d) for d in range(25)]
    cos = [factor("cosine", 3, 20, d) for d in range(25)]
    assert lin[:4] == sorted(lin[:4]) and lin[3:] == sorted(lin[3:], reverse=True)
    assert cos[:4] == sorted(cos[:4]) and cos[3:] == sorted(cos[3:], reverse=True)
    assert all(0.0 <= v <= 1.0 for v in lin + cos)


SMALL = ["train.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_completion_len=4"]


def run_steps(tmp_path, overrides, n, poison_step=None):
    """n real trainer steps; returns (lr the optimizer used at each step, each row's `lr`). At
    `poison_step` one gradient is set to inf, so that step is skipped."""
    trainer = Trainer(config.load("tiny-arith", [*SMALL, *overrides]), tmp_path / "run")
    used = []
    trainer.grpo.optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    rows = []
    trainer.rundir.acquire()
    try:
        for k in range(1, n + 1):
            hook = None
            if k == poison_step:
                hook = trainer.grpo.params[0].register_hook(lambda grad: torch.full_like(grad, float("inf")))
            rows.append(trainer.step())
            if hook:
                hook.remove()
    finally:
        trainer.rundir.release()
    return trainer, used, rows


def test_lambdalr_wiring_in_a_real_run(tmp_path):
    """lr 0.01, warm-up 2, linear over 5 steps: step k trains at lr·f(k-1); its row shows lr·f(k)."""
    lr = 0.01
    _, used, rows = run_steps(
        tmp_path, [f"train.lr={lr}", "train.warmup_steps=2", "train.lr_schedule=linear", "train.steps=5"], 4
    )
    f = [1 / 3, 2 / 3, 1.0, 2 / 3, 1 / 3]  # done = 0..4: warm-up (d+1)/3, then 1 - (d-2)/3
    assert used == pytest.approx([lr * x for x in f[:4]], rel=1e-12)
    assert [r["lr"] for r in rows] == pytest.approx([lr * x for x in f[1:5]], rel=1e-12)


def test_a_skipped_fp16_step_does_not_advance_the_schedule(tmp_path):
    """fp16 with an inf gradient at step 2: the step is skipped (no optimizer.step, scale halved), and
    steps 3 and 4 train at the rates steps 2 and 3 would have had."""
    lr = 0.01
    trainer, used, rows = run_steps(
        tmp_path,
        [f"train.lr={lr}", "train.warmup_steps=0", "train.lr_schedule=linear", "train.steps=4", "model.dtype=fp16"],
        4,
        poison_step=2,
    )
    # f(done) = 1 - done/4; taken steps: 1, 3, 4 (done = 0, 1, 2)
    assert used == pytest.approx([lr * 1.0, lr * 0.75, lr * 0.5], rel=1e-12)
    assert [r["lr"] for r in rows] == pytest.approx([lr * 0.75, lr * 0.75, lr * 0.5, lr * 0.25], rel=1e-12)
    assert [r["precision/skipped_steps"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [r["precision/loss_scale"] for r in rows] == [2.0**16, 2.0**15, 2.0**15, 2.0**15]
    assert math.isinf(rows[1]["grad_norm"]) and math.isfinite(rows[2]["grad_norm"])
    assert trainer.grpo.schedule.last_epoch == 3  # three taken steps


# ---- cross-field rules -----------------------------------------------------------------------------


def cfg_with(**keys) -> config.Config:
    """Defaults plus keys ('algo__is_mode' = algo.is_mode), set without validation."""
    cfg = config.Config()
    for name, value in keys.items():
        section, key = name.split("__")
        setattr(getattr(cfg, section), key, value)
    return cfg


def refused(**keys) -> str:
    with pytest.raises(UserError) as err:
        config.validate(cfg_with(**keys))
    return str(err.value)


RULES = [
    # (failing keys, exact message, passing keys at the boundary)
    pytest.param(
        dict(algo__is_level="token", algo__is_mode="mask", algo__is_cap=0.0),
        "config error: algo.is_cap = 0: algo.is_mode = 'mask' needs a cap > 0 (e.g. 10.0)",
        [
            dict(algo__is_level="token", algo__is_mode="mask", algo__is_cap=1e-9),
            dict(algo__is_level="none", algo__is_mode="mask", algo__is_cap=0.0),
            dict(algo__is_level="sequence", algo__is_mode="truncate", algo__is_cap=0.0),
        ],
        id="mask-needs-cap",
    ),
    pytest.param(
        dict(algo__is_level="sequence", algo__is_mode="mask", algo__is_cap=0.0),
        "config error: algo.is_cap = 0: algo.is_mode = 'mask' needs a cap > 0 (e.g. 10.0)",
        [],
        id="mask-needs-cap-sequence",
    ),
    pytest.param(
        dict(algo__delta=1.2, algo__epsilon_high=0.2),  # delta == 1 + epsilon_high is refused
        "config error: algo.delta = 1.2: must be > 1 + algo.epsilon_high (1.2), or 0 = off",
        [dict(algo__delta=1.2000001, algo__epsilon_high=0.2), dict(algo__delta=0.0, algo__epsilon_high=0.2)],
        id="delta-above-clip",
    ),
    pytest.param(
        dict(algo__delta=1e-9, algo__epsilon_high=0.28),
        "config error: algo.delta = 1e-09: must be > 1 + algo.epsilon_high (1.28), or 0 = off",
        [],
        id="delta-tiny",
    ),
    pytest.param(
        dict(algo__objective="pg", algo__importance_sampling_level="sequence"),
        "config error: algo.importance_sampling_level = 'sequence' with algo.objective = 'pg': the pg "
        "objective has no pi/pi_old ratio; use 'token' (its IS weight is algo.is_level)",
        [
            dict(algo__objective="pg", algo__importance_sampling_level="token"),
            dict(algo__objective="ppo", algo__importance_sampling_level="sequence"),
        ],
        id="pg-no-sequence-ratio",
    ),
    pytest.param(
        dict(rewards__funcs=["correctness", "format"], rewards__weights=[1.0]),
        "config error: rewards.weights = [1.0]: needs 2 values, one per rewards.funcs entry",
        [
            dict(rewards__funcs=["correctness", "format"], rewards__weights=[1.0, 0.5]),
            dict(rewards__funcs=["correctness", "format"], rewards__weights=[]),
        ],
        id="one-weight-per-func",
    ),
    pytest.param(
        dict(rewards__funcs=[], rewards__weights=[]),
        "config error: rewards.funcs = []: give at least one reward function (or an env.environment that scores "
        "its episodes)",
        [dict(rewards__funcs=["format"], rewards__weights=[])],
        id="at-least-one-func",
    ),
    pytest.param(
        dict(model__dtype="fp16", rollout__dtype="fp8"),
        "config error: rollout.dtype = 'fp8' with model.dtype = 'fp16': fp8 rollout pairs with "
        "model.dtype 'bf16' (rollout_only) or 'fp8' (unified)",
        [
            dict(model__dtype="bf16", rollout__dtype="fp8"),
            dict(model__dtype="fp8", rollout__dtype=""),
            dict(model__dtype="fp8", rollout__dtype="fp8"),
            dict(model__dtype="fp32", rollout__dtype="bf16"),
        ],
        id="fp8-rollout-pairs",
    ),
    pytest.param(
        dict(model__dtype="fp32", rollout__dtype="fp8"),
        "config error: rollout.dtype = 'fp8' with model.dtype = 'fp32': fp8 rollout pairs with "
        "model.dtype 'bf16' (rollout_only) or 'fp8' (unified)",
        [],
        id="fp8-rollout-fp32",
    ),
    pytest.param(
        dict(model__lora_rank=8, model__lora_target_modules=[]),
        "config error: model.lora_target_modules = []: give at least one module name, or 'all-linear'",
        [
            dict(model__lora_rank=0, model__lora_target_modules=[]),
            dict(model__lora_rank=1, model__lora_target_modules=["q_proj"]),
        ],
        id="lora-needs-targets",
    ),
    pytest.param(
        dict(rollout__max_prompt_len=500_000, rollout__max_completion_len=500_001),
        "config error: rollout.max_completion_len = 500001: prompt + completion must be <= 1000000 tokens",
        [dict(rollout__max_prompt_len=500_000, rollout__max_completion_len=500_000)],
        id="sequence-length-cap",
    ),
    pytest.param(
        dict(train__prompts_per_step=524_289, rollout__num_generations=2),
        "config error: train.prompts_per_step = 524289: 1048578 sequences per step with "
        "rollout.num_generations = 2; must be <= 1048576",
        [dict(train__prompts_per_step=524_288, rollout__num_generations=2)],
        id="sequences-per-step-cap",
    ),
    pytest.param(
        dict(model__load_in_4bit=True, model__lora_rank=0),
        "config error: model.load_in_4bit = true: a 4-bit base cannot be fine-tuned in full "
        "(model.lora_rank = 0); set a LoRA rank > 0 (QLoRA)",
        [
            dict(model__load_in_4bit=True, model__lora_rank=1, model__dtype="bf16", rollout__backend="hf"),
            dict(model__load_in_4bit=True, model__lora_rank=8, rollout__backend="auto"),
        ],
        id="4bit-needs-lora",
    ),
    pytest.param(
        dict(model__load_in_4bit=True, model__dtype="fp8"),
        "config error: model.load_in_4bit = true: model.dtype = 'fp8': bitsandbytes 4-bit layers compute "
        "in fp32, bf16 or fp16; use one of those",
        [],
        id="4bit-no-fp8-model",
    ),
    pytest.param(
        dict(model__load_in_4bit=True, model__dtype="bf16", rollout__dtype="fp8"),
        "config error: model.load_in_4bit = true: rollout.dtype = 'fp8': bitsandbytes 4-bit layers compute "
        "in fp32, bf16 or fp16; use one of those",
        [],
        id="4bit-no-fp8-rollout",
    ),
    pytest.param(
        dict(model__load_in_4bit=True, rollout__backend="vllm", rollout__vllm_sync="merged"),
        "config error: model.load_in_4bit = true: rollout.backend = 'vllm' syncs merged weights here "
        "(rollout.vllm_sync = 'merged'), which a 4-bit base cannot give; use rollout.vllm_sync = 'auto' (vLLM "
        "serves the 16-bit base under the adapter, docs/mismatch.md) or rollout.backend = 'hf'",
        [
            dict(model__load_in_4bit=False, rollout__backend="vllm", rollout__vllm_sync="merged"),
            dict(model__load_in_4bit=True, rollout__backend="vllm", rollout__vllm_sync="auto"),
        ],
        id="4bit-vllm-adapter-only",
    ),
    pytest.param(
        dict(train__prompts_per_step=1024, rollout__num_generations=1024, train__steps_per_generation=2),
        "config error: train.steps_per_generation = 2: 2097152 sequences per rollout (train.prompts_per_step "
        "× rollout.num_generations × this); must be <= 1048576",
        [
            dict(train__prompts_per_step=1024, rollout__num_generations=1024, train__steps_per_generation=1),
            dict(train__prompts_per_step=512, rollout__num_generations=1024, train__steps_per_generation=2),
        ],
        id="sequences-per-rollout-cap",
    ),
    pytest.param(
        dict(train__steps_per_generation=3, train__num_iterations=2, train__save_every=20),
        "config error: train.save_every = 20: must be a multiple of train.steps_per_generation × "
        "train.num_iterations (6), so a checkpoint never falls between the updates of one rollout; "
        "or 0 = only at the end",
        [
            dict(train__steps_per_generation=3, train__num_iterations=2, train__save_every=18),
            dict(train__steps_per_generation=3, train__num_iterations=2, train__save_every=0),
        ],
        id="save-on-rollout-boundaries",
    ),
    pytest.param(
        dict(rollout__backend="hf", rollout__top_k=5, algo__is_level="token", algo__logprob_support="full"),
        "config error: rollout.top_k = 5: algo.is_level = 'token' corrects towards the sampler's mu, which "
        "this truncates while pi does not with algo.logprob_support = 'full'; set algo.logprob_support = "
        "'sampler' or algo.is_level = 'none', or sample the full distribution (rollout.top_k = 0, rollout.top_p = 1)",
        [
            dict(rollout__backend="hf", rollout__top_k=5, algo__is_level="none", algo__logprob_support="full"),
            dict(rollout__backend="hf", rollout__top_k=5, algo__is_level="auto", algo__logprob_support="full"),
            dict(rollout__backend="hf", rollout__top_k=5, algo__is_level="token"),  # pi on the sampler's support
            dict(rollout__backend="hf", rollout__top_k=0, rollout__top_p=1.0, algo__is_level="token"),
        ],
        id="no-is-with-top-k",
    ),
    pytest.param(
        dict(rollout__backend="hf", rollout__top_p=0.9, algo__is_level="sequence", algo__logprob_support="full"),
        "config error: rollout.top_p = 0.9: algo.is_level = 'sequence' corrects towards the sampler's mu, "
        "which this truncates while pi does not with algo.logprob_support = 'full'; set algo.logprob_support = "
        "'sampler' or algo.is_level = 'none', or sample the full distribution (rollout.top_k = 0, rollout.top_p = 1)",
        [],
        id="no-is-with-top-p",
    ),
    pytest.param(
        dict(rollout__backend="vllm", rollout__top_k=5, algo__is_level="auto", algo__logprob_support="full"),
        "config error: rollout.top_k = 5: algo.is_level = 'auto' (sequence for the vllm rollout) corrects "
        "towards the sampler's mu, which this truncates while pi does not with algo.logprob_support = 'full'; "
        "set algo.logprob_support = 'sampler' or algo.is_level = 'none', or sample the full distribution "
        "(rollout.top_k = 0, rollout.top_p = 1)",
        [],
        id="no-auto-is-on-vllm",
    ),
]


@pytest.mark.parametrize("bad, message, good", RULES)
def test_cross_field_rule(bad, message, good):
    assert refused(**bad) == message
    for keys in good:
        config.validate(cfg_with(**keys))  # no error at the boundary


def test_rules_run_through_load_and_set():
    """The rules are applied to a loaded recipe plus --set overrides (not only when called directly)."""
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", ["algo.is_level=token", "algo.is_mode=mask", "algo.is_cap=0"])
    assert str(err.value) == "config error: algo.is_cap = 0: algo.is_mode = 'mask' needs a cap > 0 (e.g. 10.0)"
    assert config.load("tiny-arith", ["algo.is_level=token", "algo.is_mode=mask", "algo.is_cap=3"]).algo.is_cap == 3.0


def test_every_preset_passes_validation():
    from grpo_studio.contract import algorithms

    for name in algorithms.PRESETS:
        assert config.load("tiny-arith", [f"algo.name={name}"]).algo.name == name


def test_lora_rank_one_needs_targets_too():
    assert refused(model__lora_rank=1, model__lora_target_modules=[]) == (
        "config error: model.lora_target_modules = []: give at least one module name, or 'all-linear'"
    )


# ---- single keys: conversion and bounds (set_key, the path of every recipe key and --set) ------------

BIG = 10**400  # an int beyond the float range
KEYS = [
    # (key, value, from --set text?, stored value or the exact error line)
    ("model.load_in_4bit", True, False, True),
    ("model.load_in_4bit", "yes", True, True),
    ("model.load_in_4bit", "TRUE", True, True),
    ("model.load_in_4bit", "1", True, True),
    ("model.load_in_4bit", "no", True, False),
    ("model.load_in_4bit", "False", True, False),
    ("model.load_in_4bit", "0", True, False),
    ("model.load_in_4bit", "yes", False, "config error: model.load_in_4bit = 'yes': expected true or false"),
    ("model.load_in_4bit", "maybe", True, "config error: model.load_in_4bit = 'maybe': expected true or false"),
    ("model.load_in_4bit", 1, False, "config error: model.load_in_4bit = 1: expected true or false"),
    ("train.steps", 7, False, 7),
    ("train.steps", 7.0, False, 7),
    ("train.steps", "1_000", True, 1000),
    ("train.steps", True, False, "config error: train.steps = true: expected an integer"),
    ("train.steps", 7.5, False, "config error: train.steps = 7.5: expected an integer"),
    ("train.steps", "12", False, "config error: train.steps = '12': expected an integer"),
    ("train.steps", "x", True, "config error: train.steps = 'x': expected an integer"),
    ("train.lr", 3, False, 3.0),
    ("train.lr", "2e-3", True, 0.002),
    ("train.lr", True, False, "config error: train.lr = true: expected a number"),
    ("train.lr", "0.1", False, "config error: train.lr = '0.1': expected a number"),
    ("train.lr", "abc", True, "config error: train.lr = 'abc': expected a number"),
    ("train.lr", float("nan"), False, "config error: train.lr = nan: must be a finite number"),
    ("train.lr", "inf", True, "config error: train.lr = inf: must be a finite number"),
    ("train.lr", BIG, False, f"config error: train.lr = {BIG}: must be a finite number"),
    ("data.split", "test", False, "test"),
    ("data.split", 5, False, "config error: data.split = 5: expected a string"),
    ("data.split", "\udcff", False, "config error: data.split = '\\udcff': not valid UTF-8 text"),
    ("rewards.weights", "1, 2.5", True, [1.0, 2.5]),
    ("rewards.weights", "[1, 2]", True, [1.0, 2.0]),
    ("rewards.weights", [2, 0.5], False, [2.0, 0.5]),
    ("rewards.funcs", "a, b", True, ["a", "b"]),
    ("rewards.weights", ["a"], False, "config error: rewards.weights[0] = 'a': expected a number"),
    ("rewards.weights", "[1, ", True, 'config error: rewards.weights = \'[1,\': expected a list like ["a", "b"]'),
    ("rewards.weights", 3, False, "config error: rewards.weights = 3: expected a list"),
    # bounds: closed and open lower bounds, upper bounds, each at and past the boundary
    ("train.steps", 1, False, 1),
    ("train.steps", 0, False, "config error: train.steps = 0: must be >= 1"),
    ("train.warmup_steps", -1, False, "config error: train.warmup_steps = -1: must be >= 0"),
    ("train.lr", 1e-12, False, 1e-12),
    ("train.lr", 0.0, False, "config error: train.lr = 0.0: must be > 0"),
    ("model.lora_dropout", 0.99, False, 0.99),
    ("model.lora_dropout", 0.995, False, "config error: model.lora_dropout = 0.995: must be <= 0.99"),
    ("precision.loss_scale_backoff", 1.0, False, 1.0),
    ("precision.loss_scale_backoff", 0.0, False, "config error: precision.loss_scale_backoff = 0.0: must be > 0"),
    (
        "model.dtype",
        "fp61",
        False,
        "config error: model.dtype = 'fp61': allowed: fp32, bf16, fp16, fp8 (did you mean 'fp16'?)",
    ),
    ("train.stpes", 3, False, "config error: unknown key 'train.stpes' (did you mean 'train.steps'?)"),
    ("bogus.steps", 3, False, "config error: unknown key 'bogus.steps' (did you mean 'warmup.steps'?)"),
]


@pytest.mark.parametrize("key, value, from_text, want", KEYS, ids=[f"{k}={v!r}"[:60] for k, v, _, _ in KEYS])
def test_set_key(key, value, from_text, want):
    cfg = config.Config()
    if isinstance(want, str) and want.startswith("config error: "):
        with pytest.raises(UserError) as err:
            config.set_key(cfg, key, value, from_text=from_text)
        assert str(err.value) == want
    else:
        config.set_key(cfg, key, value, from_text=from_text)
        section, name = key.split(".")
        got = getattr(getattr(cfg, section), name)
        assert got == want and type(got) is type(want)


def test_set_key_reads_values_as_toml_typed_unless_told_they_are_text():
    cfg = config.Config()
    with pytest.raises(UserError) as err:
        config.set_key(cfg, "train.steps", "3")  # a TOML string is not an integer
    assert str(err.value) == "config error: train.steps = '3': expected an integer"


@pytest.mark.parametrize(
    "text, want",
    [
        ("train.steps=3", ("train.steps", "3")),
        (" train.lr = 2e-3 ", ("train.lr", "2e-3")),
        ("data.system_prompt=a=b", ("data.system_prompt", "a=b")),  # the first '=' splits
        ("train.steps", "config error: --set 'train.steps': expected section.key=value"),
        ("=3", "config error: --set '=3': expected section.key=value"),
        (" =3", "config error: --set ' =3': expected section.key=value"),
    ],
)
def test_parse_override(text, want):
    if isinstance(want, tuple):
        assert config.parse_override(text) == want
    else:
        with pytest.raises(UserError) as err:
            config.parse_override(text)
        assert str(err.value) == want
