"""Why is my reward not increasing? The doctor's rules over a run directory, most important first.

Each rule is a small function over a `RunView` (metrics rows, samples, events and config, read by the tolerant
readers: a live or damaged run reads as far as it can) returning a `Finding` or None: evidence (steps, values),
a one-line cause, one config change to try. `diagnose(run_dir)` sorts what fired by SEVERITIES (errors, then no
learning signal, then warnings), then RULES order. Thresholds are named below (docs/doctor.md). No torch.
"""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import groupby
from pathlib import Path

from grpo_studio.contract import config_schema as keys
from grpo_studio.contract import metrics as schema
from grpo_studio.contract.dtypes import DTYPES
from grpo_studio.contract.metrics import fmt
from grpo_studio.contract.run_files import METRICS, SAMPLES
from grpo_studio.contract.run_reader import Warn, as_number, read_config, read_events, read_rows, setting

ERROR, NO_SIGNAL, WARNING = "error", "no-signal", "warning"
SEVERITIES = (ERROR, NO_SIGNAL, WARNING)  # most important first


def _known(name: str) -> str:
    """A metric name the rules read, checked against the schema when this module loads (a renamed metric fails
    here, never silently as a rule that stops firing)."""
    if schema.lookup(name) is None:
        raise schema.UnknownMetric(f"{name}: not in the metric schema (contract/metrics.py)")
    return name


ZERO_STD, ENTROPY, GRAD_NORM = _known("reward/frac_zero_std"), _known("entropy"), _known("grad_norm")
CLIP, LEN_MEAN, LAG0_K3 = _known("clip/region"), _known("completion/len_mean"), _known("mismatch/lag0/k3")
TRUNCATED = _known("completion/truncated_frac")

MIN_ROWS = 3  # a rule over steps needs this many; its windows are the first and last third (>= MIN_ROWS)
SKIPPED_SHARE = 0.1  # steps skipped or non-finite: above this share of the steps
ZERO_STD_SHARE = 0.5  # reward/frac_zero_std averaged over the last window: at or above this
FLAT = 1e-9  # a reward function's std (or a format reward's mean) at or below this counts as 0
TRUNCATED_SHARE = 0.2  # completion/truncated_frac averaged over the last window: above this
ENTROPY_DROP = 0.1  # entropy's last-window mean below this share of its first-window mean: collapse
SPIKE_WINDOW = 5  # a spike is measured against the median of this many steps before it:
SPIKE_X = 10.0  # a step's k3 or clip share this many times that median ...
CLIP_FLOOR = 0.1  # ... and a clip share above this (k3: above the precision's normal k3)
GRAD_X = 10.0  # a step's grad_norm this many times that median: a blow-up
LENGTH_GROWTH = 1.5  # completion/len_mean last window over first window: at or above this ...
FLAT_GAIN = 0.05  # ... while the first reward function gained less than this share of its value
MISMATCH_X = 10.0  # median k3 of the last window this many times the precision's normal k3
EVAL_DROP = 0.05  # eval/accuracy this far below its best (absolute) while reward/mean rose
LR_CUT, LR_EASE = 0.1, 0.5  # the train.lr suggested: × LR_CUT after NaN or divergence, × LR_EASE otherwise
CLIP_HIGHER = 0.28  # DAPO's clip-higher algo.epsilon_high, against entropy collapse
BETA = 0.04  # the algo.beta suggested when a run drifts from its reference with none
DEFAULTS = keys.Config()  # a key's value where config.toml lacks it
# Normal k3 of a sampler/trainer pair computing in one dtype: docs/mismatch.md's measurement on a real chat
# model (vLLM against the trainer). fp8 has no measured row: it is held to bf16's (its master weights).
NORMAL_K3 = {"fp32": 3.4e-11, "fp16": 2.3e-5, "bf16": 1.5e-3}


@dataclass(frozen=True)
class Finding:
    severity: str  # one of SEVERITIES
    title: str
    evidence: str  # the steps and values that fired the rule
    cause: str  # one line
    suggestion_key: str  # a config key ...
    suggestion_value: str  # ... and the value to try, as --set takes it

    @property
    def suggestion(self) -> str:
        return f"--set {shlex.quote(f'{self.suggestion_key}={self.suggestion_value}')}"  # as a shell takes it

    def as_dict(self) -> dict:
        return {**asdict(self), "suggestion": self.suggestion}


@dataclass
class RunView:
    """What the rules read: metrics rows, samples, events (all in file order) and the config.toml tables."""

    rows: list[dict]
    samples: list[dict]
    events: list[dict]
    cfg: dict

    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) of every row whose `key` is a finite number."""
        return [(row[schema.STEP], v) for row in self.rows if (v := as_number(row.get(key))) is not None]

    def get(self, key: str):
        """The config's `key` ("rollout.temperature") when it has the schema default's type, else that default."""
        section, _, name = key.partition(".")
        default = getattr(getattr(DEFAULTS, section), name)
        return setting(
            self.cfg, section, name, (int, float) if type(default) in (int, float) else type(default), default
        )

    def funcs(self) -> list[str]:
        """The reward functions' names, as the metrics rows name them, in the order they first appear."""
        return list(dict.fromkeys(fn for row in self.rows for key in row if (fn := schema.reward_fn(key)) is not None))

    def precision(self) -> tuple[str, float]:
        """The weaker of the trainer's and the sampler's dtype (fewer mantissa bits), and its normal k3."""
        model = self.get("model.dtype") if self.get("model.dtype") in DTYPES else "fp32"
        rollout = self.get("rollout.dtype") if self.get("rollout.dtype") in DTYPES else model
        weaker = min(model, rollout, key=lambda name: DTYPES[name].mantissa_bits)
        return weaker, NORMAL_K3.get(weaker, NORMAL_K3["bf16"])


def read_run(run_dir: Path, warn: Warn | None = None) -> RunView:
    run_dir = Path(run_dir)
    return RunView(
        read_rows(run_dir / METRICS, warn),
        read_rows(run_dir / SAMPLES, warn),
        read_events(run_dir, warn),
        read_config(run_dir, warn),
    )


def _steps(points: list[tuple[int, float]]) -> str:
    first, last = points[0][0], points[-1][0]
    return f"step {first}" if first == last else f"steps {first}-{last}"


def _mean(points: list[tuple[int, float]]) -> float:
    return sum(v for _, v in points) / len(points)


def _windows(points: list[tuple[int, float]]) -> tuple[list, list]:
    """The first and the last third of a series, at least MIN_ROWS points each (they overlap on a short run)."""
    w = max(MIN_ROWS, len(points) // 3)
    return points[:w], points[-w:]


def _lr(run: RunView, factor: float) -> tuple[str, str]:
    return "train.lr", f"{run.get('train.lr') * factor:g}"


def _twice(run: RunView, key: str, cap: int) -> tuple[str, str]:
    return key, str(min(cap, 2 * int(run.get(key))))


def _funcs_without(run: RunView, *fns: str) -> tuple[str, str]:
    """rewards.funcs without the functions named `fns` (the metrics name 'file.py:fn' fn), or the schema's
    default when none is left."""
    kept = [f for f in map(str, run.get("rewards.funcs")) if f.rpartition(":")[2] not in fns]
    return "rewards.funcs", ",".join(kept or DEFAULTS.rewards.funcs)


def _constant_funcs(run: RunView, last_only: bool) -> list[str]:
    """Reward functions whose std is 0 on every step (on the last window only, with `last_only`)."""
    stds = {fn: run.series(schema.reward_key(fn, "std")) for fn in run.funcs()}
    stds = {fn: _windows(points)[1] if last_only else points for fn, points in stds.items()}
    return [fn for fn, points in stds.items() if len(points) >= MIN_ROWS and all(v <= FLAT for _, v in points)]


def _stuck_formats(run: RunView) -> list[str]:
    """Format reward functions (a name with "format" in it) whose mean is 0 on every step of the last window."""
    means = {fn: _windows(run.series(schema.reward_key(fn)))[1] for fn in run.funcs() if "format" in fn}
    return [fn for fn, points in means.items() if len(points) >= MIN_ROWS and all(abs(v) <= FLAT for _, v in points)]


def _equal_groups(samples: list[dict]) -> list[tuple[int, float]]:
    """Per sampled step, the share of its completions in groups (consecutive rows of one step and prompt) whose
    advantages are all 0: one reward for the whole group."""
    per_step: dict[int, list[int]] = {}
    for (step, _), group in groupby(samples, key=lambda s: (s[schema.STEP], s.get("prompt"))):
        advantages = [as_number(s.get("advantage")) for s in group]
        flat = len(advantages) > 1 and all(a is not None and abs(a) <= FLAT for a in advantages)
        counts = per_step.setdefault(step, [0, 0])
        counts[0], counts[1] = counts[0] + len(advantages) * flat, counts[1] + len(advantages)
    return [(step, equal / total) for step, (equal, total) in sorted(per_step.items())]


# ---- the rules ------------------------------------------------------------------------------------


def diverged(run: RunView) -> Finding | None:
    event = next((e for e in reversed(run.events) if e["event"] == "diverged"), None)
    if event is None:
        return None
    return Finding(
        ERROR,
        "the run diverged",
        f"events.jsonl: diverged at step {event.get('step', '?')} after {event.get('bad_steps', '?')} "
        f"skipped steps in a row ({event.get('cause', 'non-finite numbers')})",
        "the weights or the sampler's probabilities went non-finite: a learning rate too high for the precision",
        *_lr(run, LR_CUT),
    )


def skipped_steps(run: RunView) -> Finding | None:
    if any(e["event"] == "diverged" for e in run.events):
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
        *_lr(run, LR_CUT),
    )


def zero_variance(run: RunView) -> Finding | None:
    points, source = run.series(ZERO_STD), ZERO_STD
    if not points:  # a run from before the metric: the samples' advantages say the same
        points, source = _equal_groups(run.samples), "samples.jsonl (completions in all-zero-advantage groups)"
    last = _windows(points)[1]
    if not last or _mean(last) < ZERO_STD_SHARE:
        return None
    funcs, constant = run.funcs(), _constant_funcs(run, last_only=True)
    key, value = _funcs_without(run, *funcs)
    if funcs and constant == funcs and value != ",".join(map(str, run.get("rewards.funcs"))):  # not the same again
        cause = f"every reward function ({', '.join(funcs)}) scores every completion the same"
    else:
        cause = "every completion of a prompt scores the same (all right or all wrong)"
        key, value = (
            ("rollout.temperature", "1.0")
            if run.get("rollout.temperature") < 1.0
            else _twice(run, "rollout.num_generations", keys.MAX_GENERATIONS)
        )
    return Finding(
        NO_SIGNAL,
        "no learning signal: groups with one reward for all",
        f"{source} averaged {fmt(_mean(last))} over {_steps(last)}",
        f"{cause}, so every advantage is 0 and those groups teach nothing",
        key,
        value,
    )


def constant_reward(run: RunView) -> Finding | None:
    means = {fn: run.series(schema.reward_key(fn)) for fn in _constant_funcs(run, last_only=False)}
    constant = [fn for fn, points in means.items() if points and abs(_mean(points)) > FLAT]  # 0: none right yet
    if not constant:
        return None
    fn = constant[0]
    points = run.series(schema.reward_key(fn, "std"))
    return Finding(
        NO_SIGNAL,
        f"reward function {fn!r} is constant",
        f"rewards/{fn}/std = 0 on all {len(points)} steps ({_steps(points)}); rewards/{fn}/mean "
        f"{fmt(_mean(means[fn]))}" + (f"; also constant: {', '.join(constant[1:])}" if len(constant) > 1 else ""),
        f"{fn!r} gives every completion the same score, so it adds nothing to any advantage",
        *_funcs_without(run, fn),
    )


def format_stuck(run: RunView) -> Finding | None:
    stuck = _stuck_formats(run)
    if not stuck:
        return None
    fn = stuck[0]
    last = _windows(run.series(schema.reward_key(fn)))[1]
    start, end = run.get("rewards.solution_start"), run.get("rewards.solution_end")
    completions = [s.get("completion") for s in run.samples if isinstance(s.get("completion"), str)]
    cut = any(start in c and end not in c for c in completions) or any(v > 0 for _, v in run.series(TRUNCATED))
    key, value = (
        _twice(run, "rollout.max_completion_len", keys.MAX_TOKENS)
        if cut
        else ("data.system_prompt", f"Give the final answer as {start}N{end}.")
    )
    why = "completions are cut before the format closes" if cut else "no completion writes the format"
    return Finding(
        NO_SIGNAL,
        f"format reward {fn!r} stuck at 0",
        f"rewards/{fn}/mean = 0 on {_steps(last)}",
        f"{why}, so {fn!r} never rewards anything",
        key,
        value,
    )


def truncated(run: RunView) -> Finding | None:
    last = _windows(run.series(TRUNCATED))[1]
    if not last or _mean(last) <= TRUNCATED_SHARE:
        return None
    return Finding(
        WARNING,
        "many completions truncated",
        f"{TRUNCATED} averaged {fmt(_mean(last))} over {_steps(last)}",
        "completions are cut at rollout.max_completion_len before they finish, so their answers and endings are lost",
        *_twice(run, "rollout.max_completion_len", keys.MAX_TOKENS),
    )


def entropy_collapse(run: RunView) -> Finding | None:
    points = run.series(ENTROPY)
    if len(points) < 2 * MIN_ROWS:
        return None
    first, last = _windows(points)
    if _mean(first) <= 0 or _mean(last) >= ENTROPY_DROP * _mean(first):
        return None
    clip_acts = run.get("train.num_iterations") > 1 or run.get("train.steps_per_generation") > 1
    key, value = (
        ("algo.epsilon_high", f"{CLIP_HIGHER:g}")
        if clip_acts and run.get("algo.epsilon_high") < CLIP_HIGHER
        else _lr(run, LR_EASE)
    )
    return Finding(
        WARNING,
        "entropy collapse",
        f"{ENTROPY} fell from {fmt(_mean(first))} ({_steps(first)}) to {fmt(_mean(last))} "
        f"({_steps(last)}), {fmt(_mean(last) / _mean(first))}x",
        "the policy turned near-deterministic: a group's completions agree, so its rewards stop varying",
        key,
        value,
    )


def _spikes(points: list[tuple[int, float]], factor: float, floor: float) -> str | None:
    """The evidence of the steps (after the first MIN_ROWS) whose value is above `factor` times the median of the
    SPIKE_WINDOW steps before it, and above `floor`: a jump, not a steady climb."""
    spikes = []
    for i in range(MIN_ROWS, len(points)):
        (step, value), median = points[i], statistics.median(v for _, v in points[max(0, i - SPIKE_WINDOW) : i])
        if value > factor * median and value > floor and (median or floor):
            spikes.append((value, step, median))
    if not spikes:
        return None
    value, step, median = max(spikes)
    ratio = f", {fmt(value / median)}x the median {fmt(median)} of the steps before" if median else ""
    return f"{fmt(value)} at step {step}{ratio} ({len(spikes)} such step{'s' * (len(spikes) > 1)} of {len(points)})"


def mismatch_spike(run: RunView) -> Finding | None:
    found = _spikes(run.series(schema.K3), SPIKE_X, run.precision()[1])
    if found is None:
        return None
    key, value = ("algo.is_level", "sequence") if run.get("algo.is_level") in ("auto", "none") else _lr(run, LR_EASE)
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
    found = _spikes(run.series(CLIP), SPIKE_X, CLIP_FLOOR)
    return (
        None
        if found is None
        else Finding(
            WARNING,
            "clip share spikes",
            f"{CLIP} {found}",
            "the policy moved far from the one that sampled the batch within one rollout",
            *_lr(run, LR_EASE),
        )
    )


def grad_blowup(run: RunView) -> Finding | None:
    found = _spikes(run.series(GRAD_NORM), GRAD_X, 0.0)
    return (
        None
        if found is None
        else Finding(
            WARNING,
            "gradient norm blow-ups",
            f"{GRAD_NORM} {found}",
            "the updates are far larger than usual: a learning rate too high (train.grad_clip caps the step, not the "
            "cause)",
            *_lr(run, LR_EASE),
        )
    )


def length_hacking(run: RunView) -> Finding | None:
    funcs, lengths = run.funcs(), run.series(LEN_MEAN)
    if not funcs or len(lengths) < 2 * MIN_ROWS:
        return None
    first, last = _windows(lengths)
    correct = _windows(run.series(schema.reward_key(funcs[0])))
    if not correct[0] or _mean(first) <= 0 or _mean(last) < LENGTH_GROWTH * _mean(first):
        return None
    before, after = _mean(correct[0]), _mean(correct[1])
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
        f"{LEN_MEAN} {fmt(_mean(first))} -> {fmt(_mean(last))} ({_steps(first)} to {_steps(last)}) "
        f"while rewards/{funcs[0]}/mean {fmt(before)} -> {fmt(after)}",
        "longer completions are paid for without being more correct: reward hacking or a length bias",
        key,
        value,
    )


def mismatch_level(run: RunView) -> Finding | None:
    name = LAG0_K3 if run.series(LAG0_K3) else schema.K3  # lag-0: the precision gap without policy lag
    last, (precision, normal) = _windows(run.series(name))[1], run.precision()
    if len(last) < MIN_ROWS or (median := statistics.median(v for _, v in last)) <= MISMATCH_X * normal:
        return None
    model, rollout = run.get("model.dtype"), run.get("rollout.dtype")
    key, value = (
        ("rollout.dtype", model)
        if rollout not in ("", model)
        else ("model.dtype", "fp16")
        if precision == "bf16"
        else ("algo.is_level", "sequence")
    )
    return Finding(
        WARNING,
        "sampler/trainer mismatch above the precision's normal range",
        f"{name} median {fmt(median)} over {_steps(last)}; normal for {precision}: {fmt(normal)} (docs/mismatch.md)",
        "the sampler and the trainer disagree more than rounding explains: different dtypes, kernels or weights",
        key,
        value,
    )


def eval_falls(run: RunView) -> Finding | None:
    evals, rewards = run.series(schema.EVAL_ACCURACY), run.series(schema.REWARD)
    if len(evals) < 2 or len(rewards) < 2 * MIN_ROWS:
        return None
    best_step, best = max(evals, key=lambda p: p[1])
    last_step, last = evals[-1]
    first, late = _windows(rewards)
    if last_step <= best_step or last > best - EVAL_DROP or _mean(late) <= _mean(first):
        return None
    key, value = ("algo.beta", f"{BETA:g}") if run.get("algo.beta") <= 0 else _lr(run, LR_EASE)
    return Finding(
        WARNING,
        "eval accuracy falls while train reward rises",
        f"{schema.EVAL_ACCURACY} {fmt(best)} at step {best_step} -> {fmt(last)} at step {last_step}; "
        f"{schema.REWARD} {fmt(_mean(first))} -> {fmt(_mean(late))}",
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
