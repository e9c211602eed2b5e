"""The metric schema: every metric the trainer writes to metrics.jsonl and how every reader shows it.

The names are the interface between processes: add new ones here, never rename one. The run
writer refuses a row naming a metric not listed here (`check_row`), so the schema cannot drift
from the trainer. Per-reward metrics are one pattern, `rewards/<fn>/mean|std`; per-rank ones (written only by
data-parallel runs, world size > 1) another, `perf/rank<i>/…` and `mem/rank<i>/…` (PER_RANK).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

COMBINE = ("mean", "sum", "min", "max")  # how data-parallel ranks combine one metric
FN = "<fn>"  # stands for a reward function's name in a pattern
RANK = "<i>"  # stands for a data-parallel rank's number in a pattern
TOOL = "<tool>"  # stands for an environment's tool in a pattern
STEP_METRIC = "<name>"  # stands for a number a turn-shape environment's step() reports in info["metrics"]
LAYER = "layer<n>"  # stands for an MoE layer (layer0, layer1, ...) in a pattern
ROUTER_DISAGREE = "mismatch/router_disagree"
# split by policy lag as mismatch/lag0|lagged/k3 are (rollout.async_mode): lag-0 tokens, lagged tokens
ROUTER_DISAGREE_LAG0, ROUTER_DISAGREE_LAGGED = "mismatch/lag0/router_disagree", "mismatch/lagged/router_disagree"


@dataclass(frozen=True)
class Metric:
    name: str
    meaning: str
    unit: str = ""
    log: bool = False  # its chart uses a log10 axis (values span decades)
    combine: str = "mean"


# Names more than one reader asks for by name.
STEP, TIME = "step", "time"
REWARD, K3, LOSS = "reward/mean", "mismatch/k3", "loss"
DP_MAX, PEAK_GIB, STEP_S, EVAL_ACCURACY = "mismatch/abs_dp_max", "mem/peak_gib", "perf/step_s", "eval/accuracy"
EVAL_PASS_AT_K, EVAL_MAJ_AT_K = "eval/pass_at_k", "eval/maj_at_k"  # train.eval_k > 1 only
EVAL_ANSWER = "eval/answer_accuracy"  # the answer alone, whatever its format (engine/run/evaluation.py)
EVAL_REWARD = "eval/reward"  # TRL's eval_reward: the weighted reward sum's mean over the eval completions
# the prefixes of the held-out rows' metrics and of the generalisation split's (data.general_size)
EVAL, GENERAL = "eval/", "eval/general/"


def general(name: str) -> str:
    """The generalisation split's name of an eval/* metric: general('eval/accuracy') = 'eval/general/accuracy'."""
    return GENERAL + name.removeprefix(EVAL)


def interval(name: str) -> tuple[str, str]:
    """The names of an accuracy's Wilson 95% interval: ('eval/accuracy_lo', 'eval/accuracy_hi')."""
    return f"{name}_lo", f"{name}_hi"


def eval_reward_key(fn: str) -> str:
    """TRL's eval_rewards/<fn>/mean: 'eval/rewards/<fn>/mean'."""
    return f"{EVAL}rewards/{fn}/mean"


def _eval_names() -> list[str]:
    """Every eval/* name: each accuracy with its interval, and the rewards' means, for the held-out rows and the
    generalisation split."""
    out = []
    for split in (lambda name: name, general):
        for name in (EVAL_ACCURACY, EVAL_ANSWER, EVAL_PASS_AT_K, EVAL_MAJ_AT_K):
            out += [split(name), *map(split, interval(name))]
        out += [split(EVAL_REWARD), split(eval_reward_key(FN))]
    return out


EVAL_KEYS = tuple(_eval_names())  # the step-0 `eval` event's fields: these less "eval/" (<fn>: each function's)

SCHEMA = {
    m.name: m
    for m in [
        Metric(STEP, "optimizer steps done", "steps", combine="max"),
        Metric(TIME, "when the row was written", "unix s", combine="max"),
        Metric("epoch", "passes over the training prompts", "epochs"),
        Metric(REWARD, "mean weighted reward of the step's completions"),
        Metric("reward/std", "std of the weighted reward of the step's completions"),
        Metric(
            "reward/frac_zero_std", "share of completions in groups whose rewards are all equal (no signal)", "fraction"
        ),
        Metric(f"rewards/{FN}/mean", "mean score of one reward function (unscored completions left out)"),
        Metric(f"rewards/{FN}/std", "std of one reward function's scores"),
        Metric(
            "sampling/groups_kept",
            "algo.dynamic_sampling: groups with reward signal in the rollout (DAPO, arXiv 2503.14476)",
            "groups",
            combine="sum",
        ),
        Metric(
            "sampling/groups_dropped",
            "algo.dynamic_sampling: groups sampled for the rollout and left out of it (rewards all equal, "
            "or beyond the rollout's prompts)",
            "groups",
            combine="sum",
        ),
        Metric("sampling/rounds", "algo.dynamic_sampling: sampling rounds the rollout took", "rounds", combine="max"),
        Metric(LOSS, "policy loss of the step"),
        Metric("grad_norm", "global gradient L2 norm before clipping (inf on a skipped step)"),
        Metric("lr", "learning rate after the step"),
        Metric("entropy", "mean token entropy of the policy over completions", "nats"),
        Metric("kl_ref", "mean token k3 KL to the reference policy (algo.beta > 0)", "nats"),
        Metric("clip/low", "share of tokens clipped below 1 − ε (negative advantage)", "fraction"),
        Metric("clip/high", "share of tokens clipped above 1 + ε_high (positive advantage)", "fraction"),
        Metric("clip/region", "share of tokens clipped on either side", "fraction"),
        Metric(
            "policy/ratio_mean",
            "mean ratio π/π_old over the step's tokens (sequences at GSPO's sequence level); "
            "exactly 1 on a rollout's first update",
            "ratio",
        ),
        Metric("policy/ratio_max", "largest ratio π/π_old", "ratio", combine="max"),
        Metric(
            "policy/lag",
            "optimizer steps between the weights that sampled the step's batch and the weights it trains",
            "steps",
            combine="max",
        ),
        Metric(
            "policy/version",
            "weight syncs to the sampler before it sampled the step's batch (a rollout server "
            "reports the version it generated with)",
            "syncs",
            combine="min",
        ),
        Metric(
            "policy/token_lag_mean",
            "mean per-token policy lag: weight versions between the one that sampled a "
            "token and the one it trains (in_flight: a completion may span several)",
            "versions",
        ),
        Metric("policy/token_lag_max", "largest per-token policy lag", "versions", combine="max"),
        Metric(
            "policy/dropped_tokens", "tokens dropped for lagging more than train.max_staleness", "tokens", combine="sum"
        ),
        Metric("mismatch/k1", "k1 estimate of KL(μ‖π), rollout vs trainer: mean(log μ − log π)", "nats"),
        Metric("mismatch/k2", "k2 estimate of KL(μ‖π): ½·mean(Δlogp²)", "nats", log=True),
        Metric(K3, "k3 estimate of KL(μ‖π): mean(r − 1 − log r), unbiased and ≥ 0", "nats", log=True),
        Metric("mismatch/abs_dlogp_mean", "mean token |log π − log μ|", "nats", log=True),
        Metric("mismatch/abs_dlogp_max", "largest token |log π − log μ|", "nats", log=True, combine="max"),
        Metric("mismatch/abs_dp_mean", "mean token |π − μ| in probability", "probability"),
        Metric(DP_MAX, "largest token |π − μ| in probability", "probability", combine="max"),
        Metric("mismatch/seq_logratio_mean", "mean sequence log π(y)/μ(y)", "nats"),
        Metric("mismatch/seq_logratio_std", "std of the sequence log-ratio", "nats"),
        Metric(
            "mismatch/seq_logratio_slope_per_1k",
            "growth of the sequence log-ratio per 1k completion tokens",
            "nats/1k tokens",
        ),
        Metric("mismatch/prob_pearson", "Pearson correlation of the token probabilities π and μ"),
        Metric("mismatch/is_min", "smallest importance ratio π/μ", "ratio", combine="min"),
        Metric("mismatch/is_mean", "mean importance ratio π/μ", "ratio"),
        Metric("mismatch/is_max", "largest importance ratio π/μ", "ratio", combine="max"),
        Metric("mismatch/ess", "normalised effective sample size of the importance weights", "fraction"),
        Metric(
            "mismatch/masked_frac",
            "share of completion tokens (sequences at algo.is_level = sequence) whose ratio lies outside "
            "[algo.is_floor, algo.is_cap]: masked, or truncated to the band (rollout correction on)",
            "fraction",
        ),
        Metric(
            ROUTER_DISAGREE,
            "MoE models: share of tokens whose selected experts differ between the sampler's forward and the "
            "trainer's, over MoE layers (0 with algo.router_replay = replay)",
            "fraction",
        ),
        Metric(f"{ROUTER_DISAGREE}/{LAYER}", "router disagreement of one MoE layer", "fraction"),
        Metric("mismatch/tokens", "completion tokens the mismatch metrics cover", "tokens", combine="sum"),
        Metric("mismatch/nonfinite_tokens", "tokens left out because μ or π was not finite", "tokens", combine="sum"),
        Metric(
            "mismatch/lagged_frac", "share of the step's tokens sampled by older weights (policy lag > 0)", "fraction"
        ),
        Metric("mismatch/lag0/k3", "k3 of KL(μ‖π) over lag-0 tokens only: the precision/kernel gap", "nats", log=True),
        Metric("mismatch/lag0/abs_dlogp_mean", "mean |log π − log μ| over lag-0 tokens", "nats", log=True),
        Metric(
            "mismatch/lagged/k3", "k3 of KL(μ‖π) over lagged tokens: precision gap plus policy lag", "nats", log=True
        ),
        Metric("mismatch/lagged/abs_dlogp_mean", "mean |log π − log μ| over lagged tokens", "nats", log=True),
        Metric(
            ROUTER_DISAGREE_LAG0,
            "MoE models: router disagreement over lag-0 tokens only: the sampler's precision/kernel alone",
            "fraction",
        ),
        Metric(
            ROUTER_DISAGREE_LAGGED,
            "MoE models: router disagreement over lagged tokens: that plus the routers' change since they sampled",
            "fraction",
        ),
        Metric("completion/len_mean", "mean completion length", "tokens"),
        Metric("completion/len_max", "longest completion", "tokens", combine="max"),
        Metric("completion/truncated_frac", "share of completions cut at rollout.max_completion_len", "fraction"),
        Metric(STEP_S, "wall time of the step", "s", combine="max"),
        Metric("perf/rollout_s", "time spent sampling", "s", combine="max"),
        Metric(
            "perf/train_s",
            "time after the rewards: log-probs, loss, backward, optimizer, weight sync",
            "s",
            combine="max",
        ),
        Metric(
            "perf/sync_s",
            "weight sync to the sampler after the step (0 between a rollout's updates)",
            "s",
            combine="max",
        ),
        Metric(
            "perf/skipped_backward_rows",
            "rows of the step whose backward was skipped: every row of their micro-batch had advantage 0, "
            "so their gradient is exactly 0 (engine/train/zero_advantage.py)",
            "rows",
            combine="sum",
        ),
        Metric(
            "perf/skipped_forward_rows",
            "of those, the rows not run forward either (train.score_zero_advantage off): the loss's metrics and "
            "the mismatch are over the other rows",
            "rows",
            combine="sum",
        ),
        Metric(
            "perf/trainer_wait_s",
            "time the trainer waited for the step's rollout (on its first step)",
            "s",
            combine="max",
        ),
        Metric(
            "perf/overlap_frac",
            "share of the rollout's sampling hidden behind training (rollout.async_mode = "
            "one_step; 0 when the trainer waits for all of it)",
            "fraction",
            combine="min",
        ),
        Metric(
            "perf/idle_s",
            "time of the step outside waiting for the rollout (perf/trainer_wait_s), training "
            "(π_old, log-probs, loss, backward, AdamW) and the weight sync (perf/sync_s): rewards, "
            "decoding, advantages, metrics",
            "s",
            combine="max",
        ),
        Metric(
            "perf/mfu",
            "model FLOP/s of the step (perf/flop / perf/step_s) as a share of the matmul peak measured "
            "on this device at start (perf/peak_flop_s)",
            "fraction",
            combine="mean",
        ),
        Metric(
            "perf/flop",
            "model FLOPs of the step (engine/train/flops.py: 2N per generated or forwarded token, 4N LoRA / "
            "6N full per trained token, 2N where its backward was skipped)",
            "FLOP",
            log=True,
        ),
        Metric(
            "perf/peak_flop_s",
            "matmul peak of this device in the run dtype, measured once at start",
            "FLOP/s",
            log=True,
        ),
        # env.environment: multi-turn episodes (engine/rollout/episodes.py); environment tokens are in none of the above
        Metric("env/turns_mean", "model turns per episode", "turns"),
        Metric("env/turns_max", "most model turns of one episode", "turns", combine="max"),
        Metric("env/tool_calls_mean", "tool calls the model wrote per episode (malformed ones too)", "calls"),
        Metric(f"env/tool_calls/{TOOL}", "calls of one tool per episode", "calls"),
        Metric(
            f"env/step/{STEP_METRIC}",
            "mean over the rollout's steps of a number the environment's step() reported in info['metrics'] "
            "(guess_number: range_halving, log2 of the range before a guess over the range after it)",
        ),
        Metric(
            "env/tool_failure_frac",
            "share of tool calls that failed: malformed, unknown, raised or timed out",
            "fraction",
        ),
        Metric(
            "env/env_token_frac",
            "share of the episodes' completion tokens that are the environment's (masked)",
            "fraction",
        ),
        Metric("env/stop/done", "share of episodes the model or the environment finished", "fraction"),
        Metric("env/stop/max_turns", "share of episodes cut at env.max_turns", "fraction"),
        Metric("env/stop/length", "share of episodes cut at rollout.max_completion_len", "fraction"),
        Metric("env/stop/timeout", "share of episodes ended by a tool or step() past env.tool_timeout_s", "fraction"),
        Metric(
            "env/stop/error",
            "share of episodes ended by a malformed or unknown call, or a failing environment",
            "fraction",
        ),
        Metric("perf/env_s", "seconds in the environment (reset, tools, step) of the step's rollout", "s"),
        Metric("perf/model_s", "seconds in the model's turns of the step's rollout", "s"),
        Metric("perf/rollout_tok_s", "sampled completion tokens per second", "tokens/s", combine="sum"),
        Metric(
            "perf/comm_s",
            "time in data-parallel collectives before the metrics row (gradient all-reduce, "
            "global token count; waiting for the slowest rank included)",
            "s",
            combine="max",
        ),
        Metric(PEAK_GIB, "peak GPU memory allocated (CPU: peak resident memory)", "GiB", combine="max"),
        Metric("mem/rss_gib", "resident memory of the trainer process", "GiB", combine="max"),
        Metric("precision/loss_scale", "fp16 dynamic loss scale", log=True, combine="min"),
        Metric("precision/skipped_steps", "steps skipped for non-finite gradients so far", "steps", combine="max"),
        Metric(
            "precision/bad_steps",
            "steps skipped so far for non-finite sampler probabilities, loss or gradients",
            "steps",
            combine="max",
        ),
        Metric(
            "precision/bad_streak",
            "steps skipped in a row; at train.max_bad_steps the run stops as diverged",
            "steps",
            combine="max",
        ),
    ]
}
EVAL_MEANINGS = {
    EVAL_ACCURACY: "pass@1: share of eval samples the first reward function scores above 0 (train.eval_k per "
    "prompt: the mean over prompts of c/k, c of the k right)",
    EVAL_ANSWER: "share of eval samples whose answer alone is right, whatever its format: the last number of the "
    "reply against a numeric reference, else the answer the rewards extract (format rewards play no part)",
    EVAL_PASS_AT_K: "pass@k (train.eval_k > 1): share of eval prompts with at least one of their k samples right "
    "(Chen et al. 2021's unbiased estimator with n = k)",
    EVAL_MAJ_AT_K: "maj@k (train.eval_k > 1): share of eval prompts whose most common extracted answer among the k "
    "(ties: the first) is right; no answer counts wrong; not written when no sample has one",
    EVAL_REWARD: "mean over the eval completions (train.eval_k per prompt) of the reward functions' weighted sum, "
    "TRL's eval_reward; a completion no function scored is left out",
    eval_reward_key(FN): "mean of one reward function over the eval completions it scored (TRL's "
    "eval_rewards/<fn>/mean)",
}


def _eval_metric(name: str) -> Metric:
    base = name.replace(GENERAL, EVAL)
    for suffix, bound in (("_lo", "lower"), ("_hi", "upper")):
        if base.endswith(suffix):
            of = name.removesuffix(suffix)
            return Metric(name, f"{bound} bound of the Wilson 95% interval of {of} (n = the eval prompts)", "fraction")
    where = "; on the generalisation split (data.general_size)" if name.startswith(GENERAL) else ""
    unit = "reward" if base in (EVAL_REWARD, eval_reward_key(FN)) else "fraction"
    return Metric(name, EVAL_MEANINGS[base] + where, unit)


SCHEMA.update({name: _eval_metric(name) for name in EVAL_KEYS})

# The token |Δlogp| histogram (histograms.jsonl): 4 log-spaced bins per decade from 1e-8 to 10
# (36 bins), plus exact-zero, underflow and overflow counts. Fixed edges, so steps stack into a
# heat map without rebinning.
HIST_DECADE_LO, HIST_DECADE_HI, HIST_PER_DECADE = -8, 1, 4
HIST_EDGES = [
    10.0 ** (HIST_DECADE_LO + i / HIST_PER_DECADE)
    for i in range((HIST_DECADE_HI - HIST_DECADE_LO) * HIST_PER_DECADE + 1)
]


# One rank's own numbers next to the combined ones, in data-parallel runs only (not in `names`: a
# one-process run never writes them).
PER_RANK = {
    m.name: m
    for m in [
        Metric(f"perf/rank{RANK}/step_s", "wall time of the step on this rank", "s", combine="max"),
        Metric(
            f"perf/rank{RANK}/comm_s",
            "this rank's time in data-parallel collectives (waiting for the others included)",
            "s",
            combine="max",
        ),
        Metric(
            f"mem/rank{RANK}/peak_gib",
            "this rank's peak GPU memory allocated (CPU: peak resident memory)",
            "GiB",
            combine="max",
        ),
    ]
}


def rank_key(rank: int, name: str) -> str:
    """The per-rank name of a PER_RANK pattern: rank_key(1, 'perf/rank<i>/step_s') = 'perf/rank1/step_s'."""
    return name.replace(RANK, str(rank))


class UnknownMetric(ValueError):
    """A metrics row names a metric the schema does not list: a programming error."""


def reward_key(fn: str, stat: str = "mean") -> str:
    return f"rewards/{fn}/{stat}"


def reward_fn(name: str) -> str | None:
    """The <fn> of a rewards/<fn>/mean name, else None."""
    head, tail = "rewards/", "/mean"
    return name[len(head) : -len(tail)] if name.startswith(head) and name.endswith(tail) else None


def lookup(name: str) -> Metric | None:
    ranked = re.fullmatch(r"(perf|mem)/rank\d+/(.+)", name)
    if ranked:
        return PER_RANK.get(f"{ranked[1]}/rank{RANK}/{ranked[2]}")
    family, _, stat = name.rpartition("/")
    if family == "env/tool_calls":
        return SCHEMA.get(f"{family}/{TOOL}")
    if family == "env/step" and re.fullmatch(r"\w+", stat):
        return SCHEMA.get(f"{family}/{STEP_METRIC}")
    if family == ROUTER_DISAGREE and re.fullmatch(r"layer\d+", stat):
        return SCHEMA.get(f"{family}/{LAYER}")
    for split in (GENERAL, EVAL, ""):  # rewards/<fn>/*, and eval/rewards/<fn>/mean of either eval split
        if family.startswith(split + "rewards/"):
            return SCHEMA.get(split + reward_key(FN, stat))
    return SCHEMA.get(name)


def eval_fields(event: dict) -> dict:
    """The eval/* values a step-0 `eval` event holds (engine/run/trainer.py names its fields less "eval/")."""
    return {EVAL + field: value for field, value in event.items() if lookup(EVAL + field) is not None}


def names(reward_funcs: list[str]) -> list[str]:
    """Every name a run with these reward functions can write, in schema order."""
    out = []
    for name in SCHEMA:
        if all(p not in name for p in (TOOL, LAYER, STEP_METRIC)):  # known once the environment or model loads
            out += [name.replace(FN, fn) for fn in reward_funcs] if FN in name else [name]
    return out


def check_row(row: dict) -> None:
    unknown = [name for name in row if lookup(name) is None]
    if unknown:
        raise UnknownMetric(
            f"metrics row names {', '.join(unknown)}: not in the metric schema; add it to contract/metrics.py"
        )


def fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    a = abs(value)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{value:.2e}"
    return f"{value:.4g}"
