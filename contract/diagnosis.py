"""What the doctor's rules read and share: a run directory as a `RunView` (metrics rows, samples, events and
config, read by the tolerant readers: a live or damaged run reads as far as it can), the `Finding` a rule returns,
every named threshold (docs/doctor.md), and the windows, spikes and suggestions the rules are built from. The rules
themselves, and `diagnose(run_dir)`, are contract/diagnosis_rules.py. No torch.
"""

from __future__ import annotations

import shlex
import statistics
from dataclasses import asdict, dataclass
from itertools import groupby
from pathlib import Path

from . import config_schema as keys
from . import metrics as schema
from .dtypes import DTYPES
from .metrics import fmt
from .run_files import METRICS, SAMPLES
from .run_reader import (
    Warn,
    as_number,
    read_config,
    read_events,
    read_rows,
    setting,
    total_steps,
)

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
ROUTER_DISAGREE = _known(schema.ROUTER_DISAGREE)

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
ROUTER_SHARE = 0.01  # mismatch/router_disagree averaged over the last window: above this (1 token in 100)
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
    """The run as the rules read it: stream rows beyond the run's total steps (total_steps) left out, said."""
    run_dir = Path(run_dir)
    events, cfg = read_events(run_dir, warn), read_config(run_dir, warn)
    started = next((e.get("total_steps") for e in reversed(events) if e["event"] == "started"), None)
    total = total_steps(started, cfg)
    return RunView(read_rows(run_dir / METRICS, warn, total), read_rows(run_dir / SAMPLES, warn, total), events, cfg)


def steps(points: list[tuple[int, float]]) -> str:
    first, last = points[0][0], points[-1][0]
    return f"step {first}" if first == last else f"steps {first}-{last}"


def mean(points: list[tuple[int, float]]) -> float:
    return sum(v for _, v in points) / len(points)


def windows(points: list[tuple[int, float]]) -> tuple[list, list]:
    """The first and the last third of a series, at least MIN_ROWS points each (they overlap on a short run)."""
    w = max(MIN_ROWS, len(points) // 3)
    return points[:w], points[-w:]


def lr(run: RunView, factor: float) -> tuple[str, str]:
    return "train.lr", f"{run.get('train.lr') * factor:g}"


def twice(run: RunView, key: str, cap: int) -> tuple[str, str]:
    return key, str(min(cap, 2 * int(run.get(key))))


def funcs_without(run: RunView, *fns: str) -> tuple[str, str]:
    """rewards.funcs without the functions named `fns` (the metrics name 'file.py:fn' fn), or the schema's
    default when none is left."""
    kept = [f for f in map(str, run.get("rewards.funcs")) if f.rpartition(":")[2] not in fns]
    return "rewards.funcs", ",".join(kept or DEFAULTS.rewards.funcs)


def constant_funcs(run: RunView, last_only: bool) -> list[str]:
    """Reward functions whose std is 0 on every step (on the last window only, with `last_only`)."""
    stds = {fn: run.series(schema.reward_key(fn, "std")) for fn in run.funcs()}
    stds = {fn: windows(points)[1] if last_only else points for fn, points in stds.items()}
    return [fn for fn, points in stds.items() if len(points) >= MIN_ROWS and all(v <= FLAT for _, v in points)]


def stuck_formats(run: RunView) -> list[str]:
    """Format reward functions (a name with "format" in it) whose mean is 0 on every step of the last window."""
    means = {fn: windows(run.series(schema.reward_key(fn)))[1] for fn in run.funcs() if "format" in fn}
    return [fn for fn, points in means.items() if len(points) >= MIN_ROWS and all(abs(v) <= FLAT for _, v in points)]


def no_signal(group: list[dict]) -> bool:
    """A group of samples.jsonl rows (one prompt's completions) whose advantages are all 0: one reward for the
    whole group, so it adds nothing to the gradient."""
    advantages = [as_number(s.get("advantage")) for s in group]
    return len(advantages) > 1 and all(a is not None and abs(a) <= FLAT for a in advantages)


def equal_groups(samples: list[dict]) -> list[tuple[int, float]]:
    """Per sampled step, the share of its completions in groups (consecutive rows of one step and prompt) with
    no signal (no_signal)."""
    per_step: dict[int, list[int]] = {}
    for (step, _), rows in groupby(samples, key=lambda s: (s[schema.STEP], s.get("prompt"))):
        group = list(rows)
        counts = per_step.setdefault(step, [0, 0])
        counts[0], counts[1] = counts[0] + len(group) * no_signal(group), counts[1] + len(group)
    return [(step, equal / total) for step, (equal, total) in sorted(per_step.items())]


def spikes(points: list[tuple[int, float]], factor: float, floor: float) -> str | None:
    """The evidence of the steps (after the first MIN_ROWS) whose value is above `factor` times the median of the
    SPIKE_WINDOW steps before it, and above `floor`: a jump, not a steady climb."""
    found = []
    for i in range(MIN_ROWS, len(points)):
        (step, value), median = points[i], statistics.median(v for _, v in points[max(0, i - SPIKE_WINDOW) : i])
        if value > factor * median and value > floor and (median or floor):
            found.append((value, step, median))
    if not found:
        return None
    value, step, median = max(found)
    ratio = f", {fmt(value / median)}x the median {fmt(median)} of the steps before" if median else ""
    return f"{fmt(value)} at step {step}{ratio} ({len(found)} such step{'s' * (len(found) > 1)} of {len(points)})"
