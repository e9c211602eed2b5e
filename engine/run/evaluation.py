"""Held-out evaluation's numbers from k scored samples per prompt (train.eval_k): pass@1, pass@k, maj@k, and the
answer alone; each with its Wilson 95% interval.

A sample is right when the first reward function scores it above 0. Per prompt, c of its k samples right:
  pass@1  c / k                            (the unbiased estimate from k samples)
  pass@k  1 - C(n - c, k) / C(n, k), n = k  (Chen et al. 2021; with n = k: any of the k right)
  maj@k   the sample of the most common extracted answer (ties: the first to occur) is right; a prompt
          none of whose samples has an answer counts wrong, and where no sample has one maj@k is not written
  answer  the share of the k samples whose answer alone is right, whatever its format: the last number of the
          reply against a numeric reference, else the answer the rewards extract; format rewards play no part
Answers are extracted as the built-in rewards do (rewards/builtin.py) and vote as they compare: numbers by
value, other text trimmed and case-folded.

Each accuracy p over n prompts comes with its Wilson score interval (Wilson 1927), n the prompts: a prompt's
share of k right samples varies no more than one pass/fail trial, so at k > 1 the interval is conservative.

Beside them, TRL's eval numbers (GRPOTrainer._generate_and_score_completions in eval mode, logged as eval_*):
  eval/reward              the mean over the eval completions of the weighted sum of every reward function (and
                           an environment's reward), NaN scores left out of the sum; a completion no function
                           scored is left out of the mean (TRL's eval_reward)
  eval/rewards/<fn>/mean   each function's mean over the completions it scored (TRL's eval_rewards/<fn>/mean)
TRL averages per eval batch and then over batches; here over every completion at once (the same where its
batches are equal). The eval rows are data.eval_source's, or rows held out of data.source (engine/prompts/data.py).
The held-out rows' metrics are eval/*, the generalisation split's (data.general_size) eval/general/*.
"""

from __future__ import annotations

import math
from collections import Counter
from math import comb

from ...contract import metrics
from ...contract.config import Config
from ...rewards import builtin
from ..sampler import Sampling

# what an eval sums over prompts (and over data-parallel ranks), in this order
TALLY = ("pass@1", "pass@k", "maj@k", "answered", "answer")
SEED = 10_007  # every eval samples with the same seed
Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: a two-sided 95% interval


def sample(rollouts, rows: list[dict], cfg: Config) -> tuple[list[float], list[str]]:
    """The sums of these rows, TALLY's then reward_sums': train.eval_k samples each, at the run's temperature, in
    one sampler call (with an environment, episodes), scored by every reward function; the accuracies by the
    first (correctness by default). Then the replies, each row's k in turn."""
    k = cfg.train.eval_k
    sampling = Sampling(n=k, max_tokens=cfg.rollout.max_completion_len, temperature=cfg.rollout.temperature, seed=SEED)
    references = [row.get("answer") for row in rows]
    table, texts = rollouts.eval_scores(rows, sampling)
    first = [scores[0] for scores in table]
    sums = tally(first, texts, k, cfg.rewards, references) + reward_sums(table, rollouts.reward_weights.tolist())
    return sums, texts


def no_sums(reward_names: list[str]) -> list[float]:
    """The sums of no rows (a data-parallel rank left without eval rows), as long as sample's."""
    return [0.0] * (len(TALLY) + 2 * (len(reward_names) + 1))


def reward_sums(table: list[list[float]], weights: list[float]) -> list[float]:
    """TRL's eval reward as sums that add over prompts and ranks: [weighted sum, completions scored, then per
    function: its sum, completions it scored]. A completion's weighted sum is TRL's nansum of weight x reward;
    one every function left NaN is not counted (TRL sets its sum to NaN and takes nanmean)."""
    sums = [0.0] * (2 * (len(weights) + 1))
    for scores in table:
        scored = [(j, w * s) for j, (w, s) in enumerate(zip(weights, scores)) if not math.isnan(s)]
        if scored:
            sums[0] += sum(value for _, value in scored)
            sums[1] += 1
        for j, _ in scored:
            sums[2 + 2 * j] += scores[j]
            sums[3 + 2 * j] += 1
    return sums


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021: the chance that at least one of k samples drawn from n, c of them right, is right."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def wilson(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval of a share p of n trials: (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    if n <= 0:
        return 0.0, 1.0
    centre, spread = p + z * z / (2 * n), z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    lo, hi = (centre - spread) / scale, (centre + spread) / scale
    return (0.0 if p <= 0 else max(0.0, lo)), (1.0 if p >= 1 else min(1.0, hi))  # exact at the ends


def majority(answers: list[str | None]) -> int | None:
    """The index of the first sample giving the most common answer (ties: the answer seen first); None when
    no sample has an answer."""
    keys = [None if a is None else builtin.answer_key(a) for a in answers]
    counts = Counter(key for key in keys if key is not None)
    if not counts:
        return None
    top, _ = counts.most_common(1)[0]  # most_common keeps first-seen order among equal counts
    return keys.index(top)


def answer_right(text: str, reference, opts: builtin.Options) -> bool:
    """Whether the reply's answer alone is the reference: its last number against a numeric reference (however
    the reply marks it: tags, '####', a sentence), else the answer the rewards extract."""
    if reference is None:
        return False
    want = builtin.parse_number(builtin.reference_answer(reference))
    if want is None:
        return builtin.answers_match(builtin.extract_answer(text, opts), reference)
    numbers = builtin._NUMBER.findall(builtin.text_of(text).replace(",", ""))
    return bool(numbers) and builtin.parse_number(numbers[-1]) == want


def tally(
    scores: list[float], texts: list[str], k: int, opts: builtin.Options, references: list | None = None
) -> list[float]:
    """The TALLY sums over prompts of k consecutive samples each (scores and texts in the same order; one
    reference per prompt, None where a row has no answer column)."""
    sums = [0.0] * len(TALLY)
    for index, start in enumerate(range(0, len(scores), k)):
        right = [score > 0 for score in scores[start : start + k]]
        answers = [builtin.extract_answer(text, opts) for text in texts[start : start + k]]
        reference = references[index] if references else None
        alone = sum(answer_right(text, reference, opts) for text in texts[start : start + k])
        voted, c = majority(answers), sum(right)
        prompt = (
            c / k,
            pass_at_k(k, c, k),
            voted is not None and right[voted],
            sum(a is not None for a in answers),
            alone / k,
        )
        sums = [total + value for total, value in zip(sums, prompt)]
    return sums


def eval_metrics(
    sums: list[float], prompts: int, k: int, split: str = metrics.EVAL, reward_names: list[str] = ()
) -> dict[str, float]:
    """The metrics row's values from the sums over every prompt of one split (metrics.EVAL: the held-out
    rows, metrics.GENERAL: the generalisation split): from TALLY's, each with its Wilson interval, accuracy and
    answer_accuracy, and pass_at_k and maj_at_k at k > 1; from reward_sums' (after TALLY's, one pair per
    reward_names entry), eval/reward and eval/rewards/<fn>/mean where anything was scored. None for a split of
    no prompts."""
    if prompts <= 0:
        return {}
    rewards = {metrics.EVAL_REWARD: sums[len(TALLY) : len(TALLY) + 2]} if reward_names else {}
    for j, name in enumerate(reward_names):
        start = len(TALLY) + 2 + 2 * j
        rewards[metrics.eval_reward_key(name)] = sums[start : start + 2]
    shares = {metrics.EVAL_ACCURACY: sums[0], metrics.EVAL_ANSWER: sums[4]}
    if k > 1:
        shares[metrics.EVAL_PASS_AT_K] = sums[1]
        if sums[3]:
            shares[metrics.EVAL_MAJ_AT_K] = sums[2]
    out = {}
    for name, total in shares.items():
        share = total / prompts
        name = name if split == metrics.EVAL else metrics.general(name)
        out[name] = share
        out.update(zip(metrics.interval(name), wilson(share, prompts)))
    for name, (total, scored) in rewards.items():
        if scored:
            out[name if split == metrics.EVAL else metrics.general(name)] = total / scored
    return out


def summary(values: dict[str, float]) -> str:
    """One line of eval/* values, each accuracy with its interval: 'eval/accuracy 0.367 [0.289, 0.453], ...',
    then the rewards' means."""
    parts = []
    for name, value in values.items():
        if name.endswith(("_lo", "_hi")):
            continue
        lo, hi = (values.get(bound) for bound in metrics.interval(name))
        parts.append(f"{name} {value:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else ""))
    return ", ".join(parts)
