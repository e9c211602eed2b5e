"""The fault suite's hostile cases for train.micro_batch_size = auto (contract/planner/micro_batch.py;
benchmarks/fault_probes.py says how they run). Values the key cannot take, and a number beside
train.micro_batch_tokens, are refused in one line before anything loads; odd machines and odd configs give a
choice of at least one row, whole groups where a group fits, and a pre-flight that says what it planned."""

from __future__ import annotations

from pathlib import Path

from .fault_cases import Case, train
from .fault_probes import named_probes

CATEGORY = "micro batch"


def commands() -> list[Case]:
    """`train` with a micro-batch it cannot take: one line, exit 2, no run directory."""
    sets = {
        "negative": ("train.micro_batch_size=-1",),
        "a fraction": ("train.micro_batch_size=1.5",),
        "auto misspelt": ("train.micro_batch_size=autoo",),
        "empty": ("train.micro_batch_size=",),
        "NaN": ("train.micro_batch_size=nan",),
        "past the sequence limit": ("train.micro_batch_size=1e308",),
        "a number with a token budget": ("train.micro_batch_size=4", "train.micro_batch_tokens=64"),
        "auto and a negative token budget": ("train.micro_batch_size=auto", "train.micro_batch_tokens=-5"),
    }
    return [
        Case(CATEGORY, name, train(*[arg for s in values for arg in ("--set", s)])) for name, values in sets.items()
    ]


def _cfg(*sets: str):
    from ..contract import config

    return config.load("tiny-arith", list(sets))


def _gpu(free: float):
    from ..contract.planner import preflight

    return [preflight.Device("cuda", "GPU", 80.0, free)]


def auto_in_capitals_is_auto(tmp: Path) -> str | None:
    """'Auto' and ' AUTO ' read as auto, as rollout.gpu_memory_utilization reads them."""
    for text in ("Auto", " AUTO "):
        got = _cfg(f"train.micro_batch_size={text}").train.micro_batch_size
        if got != "auto":
            return f"{text!r} read as {got!r}"
    return None


def auto_with_a_token_budget_cuts_by_tokens(tmp: Path) -> str | None:
    """auto beside micro_batch_tokens: the budget cuts (no auto choice, the plan's rows from the budget)."""
    from ..contract.planner import micro_batch, vram

    cfg = _cfg("train.micro_batch_size=auto", "train.micro_batch_tokens=48")
    if micro_batch.is_auto(cfg):
        return "auto still chose beside a token budget"
    rows = vram.train_rows(micro_batch.fixed(cfg))
    return None if rows == 2 else f"the plan cut {rows} rows, expected 48 // 24 = 2"


def a_budget_too_small_for_one_group_goes_below_it_then_refuses(tmp: Path) -> str | None:
    """Free memory below one group: halved rows; below one row: 1 row, and the pre-flight refuses in one line."""
    from ..contract import model_card
    from ..contract.planner import micro_batch, preflight

    cfg = _cfg("rollout.max_prompt_len=256", "rollout.max_completion_len=64", "train.prompts_per_step=8")
    card = model_card.load("qwen3-0.6b")
    need = {}
    for rows in (1, 4, 8):
        plan_cfg = micro_batch.with_rows(cfg, rows)
        need[rows] = preflight.places(plan_cfg, preflight.estimate(plan_cfg, card, _gpu(80)[0]), _gpu(80))[0].need_gib
    below = micro_batch.choose(card, cfg, _gpu((need[4] + need[8]) / 2))
    if below.rows != 4:
        return f"between 4 and 8 rows' need it chose {below.rows}"
    nothing = micro_batch.choose(card, cfg, _gpu(need[1] / 3))
    if (nothing.rows, nothing.why) != (1, "not even 1 fits"):
        return f"with no room it chose {nothing.line()}"
    verdict = preflight.check(cfg, _gpu(need[1] / 3), card)
    if verdict.fits or "\n" in verdict.message or "largest row" not in verdict.message:
        return f"the pre-flight said: {verdict.message!r}"
    return None


def huge_prompts_still_train_one_group(tmp: Path) -> str | None:
    """A group far over the CPU knee (64 completions of 32k-token prompts) still trains a whole group."""
    from ..contract.planner import micro_batch

    cfg = _cfg("rollout.max_prompt_len=32768", "rollout.num_generations=64", "train.shared_prefix=off")
    rows = micro_batch.knee_rows(cfg)
    return None if rows == 64 else f"{rows} rows, expected one group of 64"


def no_model_card_chooses_by_the_knee(tmp: Path) -> str | None:
    """A hub model with no card nor config.json here: no memory plan, the CPU knee alone, said so."""
    from ..contract.planner import micro_batch, preflight

    cfg = _cfg("model.name=nobody/not-a-model")
    choice = micro_batch.choose(None, cfg, [preflight.Device("cpu", "host RAM", 8.0, 8.0)])
    if choice.rows != micro_batch.knee_rows(cfg) or "no model card" not in choice.full_line():
        return choice.full_line()
    return None


def ranks_share_the_step(tmp: Path) -> str | None:
    """Two CPU ranks: each chooses from its own half of the prompts, whole groups."""
    from ..contract.planner import micro_batch

    cfg = _cfg("train.prompts_per_step=6", "train.parallel=ddp")
    rows = micro_batch.knee_rows(cfg, world_size=2)
    return None if rows == 24 else f"{rows} rows on a rank, expected its 3 prompts · 8"


def cases() -> list:
    probes = [
        auto_in_capitals_is_auto,
        auto_with_a_token_budget_cuts_by_tokens,
        a_budget_too_small_for_one_group_goes_below_it_then_refuses,
        huge_prompts_still_train_one_group,
        no_model_card_chooses_by_the_knee,
        ranks_share_the_step,
    ]
    return [*named_probes(CATEGORY, probes), *commands()]
