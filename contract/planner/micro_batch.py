"""train.micro_batch_size = auto: the micro-batch chosen for this machine, once, where the trainer starts.

choose(card, cfg, devs) takes, among micro-batches of whole groups (a prompt's G completions together, so
train.shared_prefix computes the prompt once per micro-batch and zero-advantage groups are skipped whole):

  memory  the largest whose planned peak (the VRAM planner's accurate plan, contract/planner/vram.py, with that
          micro-batch filled in) fits the free memory of the devices the run lands on: free VRAM (pynvml) on a
          GPU, available host RAM (psutil) on a CPU (contract/planner/preflight.py places and devices). Below one
          group only where one group does not fit: halving the rows down to 1.
  CPU     on a CPU also at most CPU_KNEE_TOKENS computed tokens per micro-batch (the prompt once per group where
          the shared-prefix pass runs, else once per row; every completion), where a larger forward and backward
          stops paying (docs/performance.md, "Micro-batches"). Then the step's rows are spread evenly over the
          micro-batches that takes (ceil(B / n), rounded up to whole groups).

The rows are whole-batch exact for every loss type: the engine weights each micro-batch by its share
(contract/loss_types.py micro_batch_weight with exact=True). Pure python, like the rest of the planner.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from .. import model_card
from ..config import AUTO, Config
from ..errors import UserError
from ..model_card import Card
from . import preflight
from .train_memory import rank_prompts

CPU_KNEE_TOKENS = 2048  # computed tokens per CPU micro-batch past which a larger one stops paying (measured)


@dataclass(frozen=True)
class Choice:
    rows: int  # sequences per forward/backward on one rank
    why: str  # what decided it: the whole step, the CPU knee, the memory
    budget: str = ""  # the plan at these rows against the free memory, where there is a plan

    def line(self) -> str:
        return f"micro-batch auto = {self.rows} row{'s' if self.rows > 1 else ''} ({self.why})"

    def full_line(self) -> str:
        return f"{self.line()[:-1]}; {self.budget})" if self.budget else self.line()


def is_auto(cfg: Config) -> bool:
    return cfg.train.micro_batch_size == AUTO and not cfg.train.micro_batch_tokens


def with_rows(cfg: Config, rows: int) -> Config:
    """A copy of `cfg` with train.micro_batch_size = `rows` (config.toml keeps the word auto)."""
    new = copy.deepcopy(cfg)
    new.train.micro_batch_size = rows
    return new


def fixed(cfg: Config) -> Config:
    """`cfg` with any `auto` micro-batch read as the whole step's batch (under micro_batch_tokens: its budget)."""
    return with_rows(cfg, 0) if cfg.train.micro_batch_size == AUTO else cfg


def knee_rows(cfg: Config, world_size: int = 1) -> int:
    """Whole-group rows whose computed tokens stay within CPU_KNEE_TOKENS (at least one group), spread evenly
    over the rank's step batch."""
    r, t = cfg.rollout, cfg.train
    G, batch = r.num_generations, rank_prompts(cfg, world_size) * r.num_generations
    shared = t.shared_prefix != "off" and t.parallel != "fsdp" and not cfg.model.gradient_checkpointing
    per_group = (r.max_prompt_len if shared else G * r.max_prompt_len) + G * r.max_completion_len
    rows = max(1, CPU_KNEE_TOKENS // per_group) * G
    return even(min(rows, batch), batch, G)


def even(rows: int, batch: int, G: int) -> int:
    """The micro-batches `rows` cuts `batch` into, made as even as whole groups allow: 96 of 128 → 2 of 64."""
    n = math.ceil(batch / rows)
    return min(batch, math.ceil(math.ceil(batch / n) / G) * G) if rows >= G else rows


def choose(card: Card | None, cfg: Config, devs: list[preflight.Device] | None = None, world_size: int = 1) -> Choice:
    """The micro-batch of `cfg` (micro_batch_size = auto) on `devs` (default: this machine's, preflight.devices())."""
    devs = devs or preflight.devices()
    r = cfg.rollout
    G, batch = r.num_generations, rank_prompts(cfg, world_size) * r.num_generations
    cpu = devs[0].kind == "cpu"
    cap, cap_why = batch, "the whole step"
    if cpu:
        cap = knee_rows(cfg, world_size)
        if cap < batch:
            cap_why = f"CPU knee {CPU_KNEE_TOKENS} tokens"
    if card is None:
        return Choice(cap, cap_why, "no model card to plan memory with")
    candidates = [k for k in range(G, cap + 1, G)] or [cap]
    candidates = [2**i for i in range(int(math.log2(min(G, cap)))) if 2**i < candidates[0]] + candidates

    def need(rows: int) -> list[preflight.Place]:
        plan_cfg = with_rows(cfg, rows)
        return preflight.places(plan_cfg, preflight.estimate(plan_cfg, card, devs[0], world_size), devs)

    def fits(rows: int) -> bool:
        return all(p.need_gib <= p.dev.free_gib for p in need(rows))

    lo, hi = -1, len(candidates)  # candidates[lo] fits (or none does), candidates[hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(candidates[mid]) else (lo, mid)
    rows = candidates[max(lo, 0)]
    place = max(need(rows), key=lambda p: p.need_gib - p.dev.free_gib)
    budget = f"{place.need_gib:.2f} GiB planned of {place.dev.free_gib:.2f} free on {place.dev.where()}"
    if lo < 0:
        return Choice(rows, f"not even {rows} fits", budget)
    if rows == cap:
        return Choice(rows, cap_why, budget)
    return Choice(even(rows, batch, G), "the most that fits", budget)


def here(cfg: Config, world_size: int = 1) -> Choice:
    """choose() on this machine's devices, with the model's card where one can be read (a hub model not
    downloaded has none: the choice says so)."""
    try:
        card = model_card.load(cfg.model.name)
    except UserError:
        card = None
    return choose(card, cfg, world_size=world_size)


def rows_here(cfg: Config) -> int:
    """train.micro_batch_size as a one-process run here takes it: auto resolved, 0 = the whole batch."""
    return here(cfg).rows if is_auto(cfg) else fixed(cfg).train.micro_batch_size


def for_plan(cfg: Config, device: str, world_size: int = 1) -> Config:
    """`cfg` as a plan that knows no free memory sees an auto micro-batch (`grpo-studio vram`, the studio's
    panel): on a CPU the knee's rows, on a GPU the whole batch, the upper bound (the pre-flight check plans the
    rows choose() takes on the devices themselves)."""
    if not is_auto(cfg):
        return fixed(cfg)
    return with_rows(cfg, knee_rows(cfg, world_size) if device == "cpu" else 0)
