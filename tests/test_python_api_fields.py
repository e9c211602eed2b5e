"""The Python API's GRPOConfig against TRL 1.16's (the oracle: trl.GRPOConfig itself): every field decided on,
the same defaults, TRL's batch arithmetic and its errors, the studio keys each mapped field sets, and
docs/python-api.md's table equal to the one generated from the code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")

from grpo_studio import GRPOConfig  # noqa: E402
from grpo_studio.contract.errors import UserError  # noqa: E402
from grpo_studio.field_fates import BY_FIELD, FATES, MAPPED, markdown_table  # noqa: E402
from grpo_studio.grpo_config import from_trl, studio_config, studio_keys  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
API = [ROOT / "api" / name for name in ("grpo_config.py", "grpo_trainer.py", "callback_bridge.py")]


def trl_defaults() -> dict:
    out = {}
    for f in dataclasses.fields(trl.GRPOConfig):
        if f.init:
            out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return out


def test_every_trl_field_has_a_fate_and_trls_default():
    defaults = trl_defaults()
    assert len(defaults) == 189 and trl.__version__ == "1.16.0"
    assert [f.field for f in FATES] == list(defaults)  # nobody's field undecided, in TRL's order
    assert {f.field: f.default for f in FATES} == defaults
    ours = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(GRPOConfig)
    }
    assert ours == defaults


def test_each_mapped_field_is_read_by_the_api():
    """A mapped field without a one-to-one key is converted by name somewhere in the API's code."""
    code = "".join(path.read_text() for path in API)
    unread = [
        f.field
        for f in FATES
        if f.kind == MAPPED and not f.key and f"args.{f.field}" not in code and f"self.{f.field}" not in code
    ]
    assert unread == []


def test_the_doc_holds_the_generated_table():
    page = (ROOT / "docs" / "python-api.md").read_text()
    assert markdown_table() in page
    table = page.split("## Every GRPOConfig field")[1]
    assert table.count("\n| `") == len(FATES)  # one row per field, no stale hand-written ones


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_generations": 4},
        {"per_device_train_batch_size": 4, "num_generations": 2, "steps_per_generation": 4},
        {"per_device_train_batch_size": 4, "num_generations": 4, "generation_batch_size": 16},
    ],
)
def test_batch_arithmetic_is_trls(kwargs):
    ours = GRPOConfig("o", **kwargs)
    theirs = trl.GRPOConfig("o", use_cpu=True, report_to="none", **kwargs)
    assert (ours.steps_per_generation, ours.generation_batch_size) == (
        theirs.steps_per_generation,
        theirs.generation_batch_size,
    )
    # transformers' __post_init__ rewrites some fields of no effect (report_to, disable_tqdm, ...): the keys agree
    assert studio_keys(from_trl(theirs), 10) == studio_keys(GRPOConfig("o", use_cpu=True, **kwargs), 10)


@pytest.mark.parametrize(
    "kwargs, line",
    [
        (
            {"per_device_train_batch_size": 3, "num_generations": 4},
            "GRPOConfig error: generation_batch_size = 3: generation_batch_size (3) must be divisible by num_generations (4)",
        ),
        (
            {"per_device_train_batch_size": 4, "generation_batch_size": 6},
            "GRPOConfig error: generation_batch_size = 6: generation_batch_size (6) must be divisible by the global batch size (4)",
        ),
        ({"num_generations": 1}, "GRPOConfig error: num_generations = 1: GRPO requires at least 2 generations"),
        ({"push_to_hub": True}, "GRPOConfig error: push_to_hub = true: grpo-studio does not upload"),
    ],
)
def test_trls_errors_are_one_line(kwargs, line):
    with pytest.raises(UserError) as err:
        GRPOConfig("o", **kwargs)
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_trl_raises_where_ours_does():
    """The divisibility errors are TRL's own: TRL refuses the same configs."""
    for kwargs in (
        {"per_device_train_batch_size": 3, "num_generations": 4},
        {"per_device_train_batch_size": 4, "generation_batch_size": 6},
    ):
        with pytest.raises(ValueError):
            trl.GRPOConfig("o", use_cpu=True, report_to="none", **kwargs)


def test_studio_keys_by_hand():
    """P=4, GA=2, G=4, spg=4 micro-steps: 4*2/4 = 2 prompts per optimizer step, 4/2 = 2 steps per generation;
    12 prompts, 3 epochs: (12 // (16/4)) * 4 * 1 = 12 micro-steps = 6 optimizer steps an epoch, 18 in all; save_steps 0.5 = 9 steps, rounded up to whole
    generations of 2 steps: 10."""
    args = GRPOConfig(
        "o",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        steps_per_generation=4,
        learning_rate=3e-6,
        warmup_steps=0.1,
        lr_scheduler_type="cosine",
        save_steps=0.5,
        epsilon_high=0.28,
    )
    cfg = studio_config(studio_keys(args, 12))
    t = cfg.train
    assert (t.prompts_per_step, t.steps_per_generation, t.micro_batch_size, t.steps) == (2, 2, 4, 18)
    assert (t.lr, t.lr_schedule, t.warmup_steps, t.save_every, t.seed) == (3e-6, "cosine", 2, 10, 42)
    assert (cfg.algo.epsilon, cfg.algo.epsilon_high, cfg.algo.loss_type, cfg.model.dtype) == (0.2, 0.28, "dapo", "bf16")
    assert (cfg.rollout.num_generations, cfg.rollout.max_completion_len, cfg.model.gradient_checkpointing) == (
        4,
        512,
        True,
    )


def test_a_split_the_studio_cannot_take_is_one_line():
    args = GRPOConfig("o", per_device_train_batch_size=4, num_generations=8, steps_per_generation=2)
    with pytest.raises(
        UserError,
        match=r"^GRPOConfig error: per_device_train_batch_size = 4: .* = 4 completions per optimizer step is not a multiple of num_generations \(8\)",
    ):
        studio_keys(args, 10)


def test_a_trl_field_nobody_decided_on_is_refused(monkeypatch):
    monkeypatch.delitem(BY_FIELD, "beta")
    with pytest.raises(
        UserError, match="^GRPOConfig error: beta = 0.0: a field of TRL 1.16.0 that grpo-studio has not decided on"
    ):
        from_trl(trl.GRPOConfig("o", use_cpu=True, report_to="none"))
