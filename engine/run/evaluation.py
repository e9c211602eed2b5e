"""Held-out evaluation's numbers from k scored samples per prompt (train.eval_k): pass@1, pass@k, maj@k.

A sample is right when the first reward function scores it above 0. Per prompt, c of its k samples right:
  pass@1  c / k                            (the unbiased estimate from k samples)
  pass@k  1 - C(n - c, k) / C(n, k), n = k  (Chen et al. 2021; with n = k: any of the k right)
  maj@k   the sample of the most common extracted answer (ties: the first to occur) is right; a prompt
          none of whose samples has an answer counts wrong, and where no sample has one maj@k is not written
Answers are extracted as the built-in rewards do (rewards/builtin.py) and vote as they compare: numbers by
value, other text trimmed and case-folded.
"""

from __future__ import annotations

from collections import Counter
from math import comb

from ...contract import metrics
from ...contract.config import Config
from ...rewards import builtin
from ..sampler import Sampling

# what an eval sums over prompts (and over data-parallel ranks), in this order
TALLY = ("pass@1", "pass@k", "maj@k", "answered")
SEED = 10_007  # every eval samples with the same seed


def sample(rollouts, rows: list[dict], cfg: Config) -> list[float]:
    """The TALLY sums of these rows: train.eval_k samples each, at the run's temperature, in one sampler call
    (with an environment, episodes), scored by the first reward function (correctness by default)."""
    k = cfg.train.eval_k
    sampling = Sampling(n=k, max_tokens=cfg.rollout.max_completion_len, temperature=cfg.rollout.temperature, seed=SEED)
    return tally(*rollouts.first_scores(rows, sampling), k, cfg.rewards)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021: the chance that at least one of k samples drawn from n, c of them right, is right."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def majority(answers: list[str | None]) -> int | None:
    """The index of the first sample giving the most common answer (ties: the answer seen first); None when
    no sample has an answer."""
    keys = [None if a is None else builtin.answer_key(a) for a in answers]
    counts = Counter(key for key in keys if key is not None)
    if not counts:
        return None
    top, _ = counts.most_common(1)[0]  # most_common keeps first-seen order among equal counts
    return keys.index(top)


def tally(scores: list[float], texts: list[str], k: int, opts: builtin.Options) -> list[float]:
    """The TALLY sums over prompts of k consecutive samples each (scores and texts in the same order)."""
    sums = [0.0] * len(TALLY)
    for start in range(0, len(scores), k):
        right = [score > 0 for score in scores[start : start + k]]
        answers = [builtin.extract_answer(text, opts) for text in texts[start : start + k]]
        voted, c = majority(answers), sum(right)
        prompt = (c / k, pass_at_k(k, c, k), voted is not None and right[voted], sum(a is not None for a in answers))
        sums = [total + value for total, value in zip(sums, prompt)]
    return sums


def eval_metrics(sums: list[float], prompts: int, k: int) -> dict[str, float]:
    """The metrics row's eval/* values from the TALLY sums over every eval prompt: eval/accuracy alone at
    k = 1 (one sample per prompt, as before train.eval_k)."""
    out = {metrics.EVAL_ACCURACY: sums[0] / prompts}
    if k > 1:
        out[metrics.EVAL_PASS_AT_K] = sums[1] / prompts
        if sums[3]:
            out[metrics.EVAL_MAJ_AT_K] = sums[2] / prompts
    return out
