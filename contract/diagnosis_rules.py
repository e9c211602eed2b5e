"""Why is my reward not increasing? The doctor's rules over a run directory, most important first.

Each rule is a small function over a `RunView` (contract/diagnosis.py: what a run's files hold, read by the
tolerant readers) returning a `Finding` or None: evidence (steps, values), a one-line cause, one config change to
try. `diagnose(run_dir)` sorts what fired by SEVERITIES (errors, then no learning signal, then warnings), then RULES
order. The thresholds are named in contract/diagnosis.py (docs/doctor.md). No torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from . import config_bounds as keys
from . import metrics as schema
from .diagnosis import (
    BETA,
    CLIP,
    CLIP_FLOOR,
    CLIP_HIGHER,
    ENTROPY,
    ENTROPY_DROP,
    ERROR,
    EVAL_DROP,
    FLAT,
    FLAT_GAIN,
    GRAD_NORM,
    GRAD_X,
    LAG0_K3,
    LEN_MEAN,
    LENGTH_GROWTH,
    LR_CUT,
    LR_EASE,
    MIN_ROWS,
    MISMATCH_X,
    NO_SIGNAL,
    ROUTER_DISAGREE,
    ROUTER_SHARE,
    SEVERITIES,
    SKIPPED_SHARE,
    SPIKE_X,
    TRUNCATED,
    TRUNCATED_SHARE,
    WARNING,
    ZERO_STD,
    ZERO_STD_SHARE,
    Finding,
    RunView,
    constant_funcs,
    equal_groups,
    funcs_without,
    lr,
    mean,
    read_run,
    spikes,
    steps,
    stuck_formats,
    twice,
    windows,
)
from .dtypes import DTYPES
from .metrics import fmt
from .run_reader import Warn, as_number


def diverged(run: RunView) -> Finding | None:
    """A `diverged` event (non-finite steps in a row), or a `collapsed` one (reward and gradient exactly 0)."""
    event = next((e for e in reversed(run.events) if e["event"] in ("diverged", "collapsed")), None)
    if event is None:
        return None
    if event["event"] == "collapsed":
        return Finding(
            ERROR,
            "the run collapsed",
            f"events.jsonl: collapsed at step {event.get('step', '?')} after {event.get('bad_steps', '?')} steps "
            f"in a row with reward and gradient exactly 0",
            "the updates broke the model: it samples nothing that scores, and every number stays finite",
            *lr(run, LR_CUT),
        )
    return Finding(
        ERROR,
        "the run diverged",
        f"events.jsonl: diverged at step {event.get('step', '?')} after {event.get('bad_steps', '?')} "
        f"skipped steps in a row ({event.get('cause', 'non-finite numbers')})",
        "the weights or the sampler's probabilities went non-finite: a learning rate too high for the precision",
        *lr(run, LR_CUT),
    )


def skipped_steps(run: RunView) -> Finding | None:
    if any(e["event"] in ("diverged", "collapsed") for e in run.events):
        return None  # said by `diverged`
    bad = {e["step"] for e in run.events if e["event"] == "skipped_step" and isinstance(e.get("step"), int)}
    bad |= {
        row[schema.STEP]
        for row in run.rows
        if any(key in row and as_number(row[key]) is None for key in (schema.LOSS, GRAD_NORM))
    }
    total = max([len(run.rows), *(row[schema.STEP] for row in run.rows)])
    if not bad or len(bad) <= SKIPPED_SHARE * total:
        return None
    causes = sorted({str(e["cause"]) for e in run.events if e["event"] == "skipped_step" and e.get("cause")})
    shown = ", ".join(map(str, sorted(bad)[:8])) + (", ..." if len(bad) > 8 else "")
    return Finding(
        ERROR,
        "steps skipped for NaN or inf",
        f"{len(bad)} of {total} steps skipped or non-finite (steps {shown})"
        + (f"; causes: {', '.join(causes)}" if causes else ""),
        "the loss, gradients or sampler probabilities were not finite: fp16 overflow or a learning rate too high",
        *lr(run, LR_CUT),
    )


def zero_variance(run: RunView) -> Finding | None:
    points, source = run.series(ZERO_STD), ZERO_STD
    if not points:  # a run from before the metric: the samples' advantages say the same
        points, source = equal_groups(run.samples), "samples.jsonl (completions in all-zero-advantage groups)"
    last = windows(points)[1]
    if not last or mean(last) < ZERO_STD_SHARE:
        return None
    funcs, constant = run.funcs(), constant_funcs(run, last_only=True)
    key, value = funcs_without(run, *funcs)
    if funcs and constant == funcs and value != ",".join(map(str, run.get("rewards.funcs"))):  # not the same again
        cause = f"every reward function ({', '.join(funcs)}) scores every completion the same"
    else:
        cause = "every completion of a prompt scores the same (all right or all wrong)"
        key, value = (
            ("rollout.temperature", "1.0")
            if run.get("rollout.temperature") < 1.0
            else twice(run, "rollout.num_generations", keys.MAX_GENERATIONS)
        )
    return Finding(
        NO_SIGNAL,
        "no learning signal: groups with one reward for all",
        f"{source} averaged {fmt(mean(last))} over {steps(last)}",
        f"{cause}, so every advantage is 0 and those groups teach nothing",
        key,
        value,
    )


def constant_reward(run: RunView) -> Finding | None:
    means = {fn: run.series(schema.reward_key(fn)) for fn in constant_funcs(run, last_only=False)}
    constant = [fn for fn, points in means.items() if points and abs(mean(points)) > FLAT]  # 0: none right yet
    if not constant:
        return None
    fn = constant[0]
    points = run.series(schema.reward_key(fn, "std"))
    return Finding(
        NO_SIGNAL,
        f"reward function {fn!r} is constant",
        f"rewards/{fn}/std = 0 on all {len(points)} steps ({steps(points)}); rewards/{fn}/mean "
        f"{fmt(mean(means[fn]))}" + (f"; also constant: {', '.join(constant[1:])}" if len(constant) > 1 else ""),
        f"{fn!r} gives every completion the same score, so it adds nothing to any advantage",
        *funcs_without(run, fn),
    )


def format_stuck(run: RunView) -> Finding | None:
    stuck = stuck_formats(run)
    if not stuck:
        return None
    fn = stuck[0]
    last = windows(run.series(schema.reward_key(fn)))[1]
    start, end = run.get("rewards.solution_start"), run.get("rewards.solution_end")
    completions = [s.get("completion") for s in run.samples if isinstance(s.get("completion"), str)]
    cut = any(start in c and end not in c for c in completions) or any(v > 0 for _, v in run.series(TRUNCATED))
    key, value = (
        twice(run, "rollout.max_completion_len", keys.MAX_TOKENS)
        if cut
        else ("data.system_prompt", f"Give the final answer as {start}N{end}.")
    )
    why = "completions are cut before the format closes" if cut else "no completion writes the format"
    return Finding(
        NO_SIGNAL,
        f"format reward {fn!r} stuck at 0",
        f"rewards/{fn}/mean = 0 on {steps(last)}",
        f"{why}, so {fn!r} never rewards anything",
        key,
        value,
    )


def truncated(run: RunView) -> Finding | None:
    last = windows(run.series(TRUNCATED))[1]
    if not last or mean(last) <= TRUNCATED_SHARE:
        return None
    return Finding(
        WARNING,
        "many completions truncated",
        f"{TRUNCATED} averaged {fmt(mean(last))} over {steps(last)}",
        "completions are cut at rollout.max_completion_len before they finish, so their answers and endings are lost",
        *twice(run, "rollout.max_completion_len", keys.MAX_TOKENS),
    )


def entropy_collapse(run: RunView) -> Finding | None:
    points = run.series(ENTROPY)
    if len(points) < 2 * MIN_ROWS:
        return None
    first, last = windows(points)
    if mean(first) <= 0 or mean(last) >= ENTROPY_DROP * mean(first):
        return None
    clip_acts = run.get("train.num_iterations") > 1 or run.get("train.steps_per_generation") > 1
    key, value = (
        ("algo.epsilon_high", f"{CLIP_HIGHER:g}")
        if clip_acts and run.get("algo.epsilon_high") < CLIP_HIGHER
        else lr(run, LR_EASE)
    )
    return Finding(
        WARNING,
        "entropy collapse",
        f"{ENTROPY} fell from {fmt(mean(first))} ({steps(first)}) to {fmt(mean(last))} "
        f"({steps(last)}), {fmt(mean(last) / mean(first))}x",
        "the policy turned near-deterministic: a group's completions agree, so its rewards stop varying",
        key,
        value,
    )


def mismatch_spike(run: RunView) -> Finding | None:
    found = spikes(run.series(schema.K3), SPIKE_X, run.precision()[1])
    if found is None:
        return None
    key, value = ("algo.is_level", "sequence") if run.get("algo.is_level") in ("auto", "none") else lr(run, LR_EASE)
    return Finding(
        WARNING,
        "sampler/trainer mismatch spikes",
        f"{schema.K3} {found}",
        "on those steps the sampler's token probabilities left the trainer's: the policy moved into "
        "tokens the two compute differently",
        key,
        value,
    )


def clip_spike(run: RunView) -> Finding | None:
    found = spikes(run.series(CLIP), SPIKE_X, CLIP_FLOOR)
    return (
        None
        if found is None
        else Finding(
            WARNING,
            "clip share spikes",
            f"{CLIP} {found}",
            "the policy moved far from the one that sampled the batch within one rollout",
            *lr(run, LR_EASE),
        )
    )


def grad_blowup(run: RunView) -> Finding | None:
    found = spikes(run.series(GRAD_NORM), GRAD_X, 0.0)
    return (
        None
        if found is None
        else Finding(
            WARNING,
            "gradient norm blow-ups",
            f"{GRAD_NORM} {found}",
            "the updates are far larger than usual: a learning rate too high (train.grad_clip caps the step, not the "
            "cause)",
            *lr(run, LR_EASE),
        )
    )


def length_hacking(run: RunView) -> Finding | None:
    funcs, lengths = run.funcs(), run.series(LEN_MEAN)
    if not funcs or len(lengths) < 2 * MIN_ROWS:
        return None
    first, last = windows(lengths)
    correct = windows(run.series(schema.reward_key(funcs[0])))
    if not correct[0] or mean(first) <= 0 or mean(last) < LENGTH_GROWTH * mean(first):
        return None
    before, after = mean(correct[0]), mean(correct[1])
    if after - before >= FLAT_GAIN * max(abs(before), abs(after), FLAT):
        return None
    funcs_cfg = list(map(str, run.get("rewards.funcs")))
    key, value = (
        ("algo.loss_type", "dr_grpo")
        if "length_penalty" in funcs_cfg
        else ("rewards.funcs", ",".join([*funcs_cfg, "length_penalty"]))
    )
    return Finding(
        WARNING,
        "length grows while correctness stays flat",
        f"{LEN_MEAN} {fmt(mean(first))} -> {fmt(mean(last))} ({steps(first)} to {steps(last)}) "
        f"while rewards/{funcs[0]}/mean {fmt(before)} -> {fmt(after)}",
        "longer completions are paid for without being more correct: reward hacking or a length bias",
        key,
        value,
    )


def mismatch_level(run: RunView) -> Finding | None:
    name = LAG0_K3 if run.series(LAG0_K3) else schema.K3  # lag-0: the precision gap without policy lag
    last, (precision, normal) = windows(run.series(name))[1], run.precision()
    if len(last) < MIN_ROWS or (median := statistics.median(v for _, v in last)) <= MISMATCH_X * normal:
        return None
    model, rollout = run.get("model.dtype"), run.get("rollout.dtype")
    key, value = (
        ("rollout.dtype", model)
        if rollout not in ("", model)
        else ("model.dtype", DTYPES[precision].less_mismatch)
        if DTYPES[precision].less_mismatch
        else ("algo.is_level", "sequence")
    )
    return Finding(
        WARNING,
        "sampler/trainer mismatch above the precision's normal range",
        f"{name} median {fmt(median)} over {steps(last)}; normal for {precision}: {fmt(normal)} (docs/mismatch.md)",
        "the sampler and the trainer disagree more than rounding explains: different dtypes, kernels or weights",
        key,
        value,
    )


def router_disagreement(run: RunView) -> Finding | None:
    last = windows(run.series(ROUTER_DISAGREE))[1]  # MoE models sampled by hf only; 0 under router replay
    if len(last) < MIN_ROWS or mean(last) <= ROUTER_SHARE:
        return None
    return Finding(
        WARNING,
        "MoE routers disagree between the sampler and the trainer",
        f"{ROUTER_DISAGREE} averaged {fmt(mean(last))} over {steps(last)}",
        "the sampler sends tokens to other experts than the trainer does, a gap no precision fix closes "
        "(docs/mismatch.md, MoE routers)",
        "algo.router_replay",
        "replay",
    )


def eval_falls(run: RunView) -> Finding | None:
    evals, rewards = run.series(schema.EVAL_ACCURACY), run.series(schema.REWARD)
    if len(evals) < 2 or len(rewards) < 2 * MIN_ROWS:
        return None
    best_step, best = max(evals, key=lambda p: p[1])
    last_step, last = evals[-1]
    first, late = windows(rewards)
    if last_step <= best_step or last > best - EVAL_DROP or mean(late) <= mean(first):
        return None
    key, value = ("algo.beta", f"{BETA:g}") if run.get("algo.beta") <= 0 else lr(run, LR_EASE)
    return Finding(
        WARNING,
        "eval accuracy falls while train reward rises",
        f"{schema.EVAL_ACCURACY} {fmt(best)} at step {best_step} -> {fmt(last)} at step {last_step}; "
        f"{schema.REWARD} {fmt(mean(first))} -> {fmt(mean(late))}",
        "the policy fits the training rewards at the cost of held-out accuracy: over-optimisation",
        key,
        value,
    )


RULES: list[Callable[[RunView], Finding | None]] = [
    diverged,
    skipped_steps,
    zero_variance,
    constant_reward,
    format_stuck,
    truncated,
    entropy_collapse,
    mismatch_spike,
    clip_spike,
    grad_blowup,
    length_hacking,
    mismatch_level,
    router_disagreement,
    eval_falls,
]


def findings(run: RunView) -> list[Finding]:
    """What RULES found, most important first (SEVERITIES, then RULES order)."""
    found = [f for f in (rule(run) for rule in RULES) if f is not None]
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))


def diagnose(run_dir: Path, warn: Warn | None = None) -> list[Finding]:
    return findings(read_run(run_dir, warn))


def healthy_line(run: RunView) -> str:
    """The one line of a run no rule fired on."""
    if not run.rows:
        return "no findings: no metrics rows yet"
    rewards = run.series(schema.REWARD)
    trend = f", {schema.REWARD} {fmt(rewards[0][1])} -> {fmt(rewards[-1][1])}" if rewards else ""
    return f"no findings: {len(run.rows)} steps{trend}; none of the {len(RULES)} rules fired"
