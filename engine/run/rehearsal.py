"""The rehearsal (`grpo-studio train --rehearse`): before the run starts, one real GRPO step in a throwaway
directory, built as the run builds it (engine/run/trainer.py's Trainer: the same model, dtype, LoRA, sampler and
optimizer), with every prompt of the rollout the longest prompt of the training data and every completion
forced to rollout.max_completion_len (EOS suppressed: Sampling.min_tokens). Its peak memory is measured for
comparison with the planner's estimate: torch.cuda.max_memory_allocated on a GPU, the growth of the process's
peak RSS (getrusage ru_maxrss) over its RSS before the rehearsal on a CPU. Everything it built is freed
before the run loads; the run directory gets nothing from it."""

from __future__ import annotations

import copy
import dataclasses
import gc
import resource
import sys
import tempfile
from pathlib import Path

import torch

from ...contract.config import AUTO, Config
from ..prompts import data, prompt_render

GIB = 2**30


@dataclasses.dataclass
class Rehearsal:
    """What the rehearsal step measured, next to what the pre-flight check planned and saw free."""

    prompt_tokens: int  # the longest prompt of the training data, after the chat template
    completion_tokens: int  # the shortest completion of the step (all of them: rollout.max_completion_len)
    measured_gib: float
    planned_gib: float  # the planner's total (the pre-flight line's "planned"); 0 when it could not plan
    free_gib: float  # free on the device when the pre-flight check looked
    where: str  # the device: a GPU's name or "host RAM"
    how: str  # what measured the peak
    micro_batch: str = ""  # the rows per forward/backward: "16 (auto)", "16", "whole batch", "tokens 4096"

    @property
    def fits(self) -> bool:
        return self.measured_gib <= self.free_gib

    def line(self) -> str:
        planned = f"{self.planned_gib:.2f} GiB planned" if self.planned_gib else "no plan (pre-flight skipped)"
        return (
            f"rehearsal: one step on the longest prompt ({self.prompt_tokens} tokens) at {self.completion_tokens} "
            f"completion tokens{self._at()}: peak {self.measured_gib:.2f} GiB measured ({self.how}), {planned} "
            f"({self.where})"
        )

    def _at(self) -> str:
        return f", micro-batch {self.micro_batch}" if self.micro_batch else ""

    def fields(self) -> dict:
        """The run's `rehearsal` event's fields."""
        return dataclasses.asdict(self)


class FullLength:
    """The run's sampler with EOS suppressed until max_tokens: every completion is as long as it can be."""

    def __init__(self, inner):
        self.inner = inner

    def generate(self, prompt_ids, sampling, *args, **kwargs):
        return self.inner.generate(prompt_ids, _full(sampling), *args, **kwargs)

    def submit(self, prompt_ids, sampling, *args, **kwargs):  # rollout.async_mode one_step / in_flight
        return self.inner.submit(prompt_ids, _full(sampling), *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _full(sampling):
    return dataclasses.replace(sampling, min_tokens=sampling.max_tokens)


def longest_prompt(rows: list[dict], cfg: Config, tokenizer) -> tuple[dict, int]:
    """The row whose rendered prompt has the most tokens, and that count (as the rollouts encode it)."""
    texts = [prompt_render.prompt_text(row, cfg.data, tokenizer) for row in rows]
    ids = prompt_render.encode_prompts(tokenizer, texts, cfg.rollout.max_prompt_len)
    i = max(range(len(ids)), key=lambda k: len(ids[k]))
    return rows[i], len(ids[i])


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def peak_rss() -> int:
    """The process's peak RSS so far in bytes (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def rehearse(cfg: Config, planned_gib: float, free_gib: float, where: str) -> Rehearsal:
    """One real GRPO step of `cfg` on its longest prompt at full completion length, in a temporary run
    directory; trackers and alerts off (nothing leaves the machine for it). Frees everything before returning."""
    from .trainer import Trainer

    quiet = copy.deepcopy(cfg)
    quiet.report.to, quiet.alerts.rules, quiet.alerts.on = [], [], []
    quiet.algo.dynamic_sampling = False  # each further round is one more rollout of the same peak memory
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before, how = torch.cuda.memory_allocated(), "torch.cuda.max_memory_allocated"
    else:
        before, how = _rss(), "peak RSS growth, getrusage ru_maxrss"
    with tempfile.TemporaryDirectory(prefix="grpo-studio-rehearsal-") as tmp:
        trainer, grpo = Trainer(quiet, Path(tmp) / "run"), None
        try:
            row, prompt_tokens = longest_prompt(trainer.prompts.rows, quiet, trainer.tokenizer)
            grpo = trainer.grpo
            grpo.prompts = grpo.rollouts.prompts = trainer.prompts = data.PromptStream([row], cfg.train.seed)
            grpo.rollouts.sampler = FullLength(grpo.rollouts.sampler)
            trainer.step()
            completion_tokens = int(grpo.batch.rollout.mask.sum(1).min())
            micro = micro_batch_text(quiet, trainer.micro_batch)
            peak = torch.cuda.max_memory_allocated() - before if cuda else peak_rss() - before
        finally:
            trainer.close()
            trainer = grpo = None  # the policy, its optimizer and the sampler go with them
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    return Rehearsal(prompt_tokens, completion_tokens, max(peak, 0) / GIB, planned_gib, free_gib, where, how, micro)


def micro_batch_text(cfg: Config, choice) -> str:
    """The micro-batch the step ran: the auto choice (contract/planner/micro_batch.Choice) or the config's."""
    if choice is not None:
        return f"{choice.rows} (auto: {choice.why})"
    t = cfg.train
    if t.micro_batch_tokens:
        return f"of at most {t.micro_batch_tokens} tokens"
    return str(t.micro_batch_size) if t.micro_batch_size not in (0, AUTO) else "the whole batch"
