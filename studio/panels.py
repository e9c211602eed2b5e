"""What each chart shows: metric keys per panel, shared by the dashboard, compare and report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..contract import metrics
from ..contract.environments import STOPS
from ..contract.metrics import fmt
from .lag import LAG0_K3, LAGGED_FRAC, LAGGED_K3
from .rundata import RunData
from .widgets.metric_chart import Line, ema, percent
from .widgets.perf_tables import MFU


@dataclass
class Panel:
    id: str
    title: str
    keys: list[str] = field(default_factory=list)  # metric keys, one line each
    rewards: bool = False  # add rewards/<fn>/mean + a smoothed line
    needs_beta: bool = False
    gate: str = ""  # shown only once this metric has been > 0 in the run
    logged: bool = False  # the gate opens once the metric is logged at all, 0 included
    note: str = ""  # one line under the chart: why it looks as it does
    before_note: str = ""  # added to the note only for a run with a step-0 (before training) point of a key
    short_title: str = ""  # the title where the full one does not fit the chart (80×24: about 38 columns)
    family: str = ""  # add every run column under this prefix (names known only at run time: an env's tools)
    percent: bool = False  # shares shown in percent (headline and ticks), as the Perf table shows them
    bounds: list[str] = field(default_factory=list)  # keys whose Wilson 95% interval (their _lo, _hi) is drawn

    @property
    def log(self) -> bool:
        """A log10 axis when the schema says so for every key (k3 spans decades)."""
        return all(metrics.SCHEMA[key].log for key in self.keys)

    def intervals(self, run: RunData, keys: list[str] | None = None) -> list[tuple[str, list, list, list]]:
        """(label, steps, lower bounds, upper bounds) of the Wilson 95% interval of each of `keys` (`bounds`)."""
        out = []
        for key in self.bounds if keys is None else keys:
            (xs, lo), (_, hi) = (run.series(bound) for bound in metrics.interval(key))
            if xs and len(lo) == len(hi):
                out.append((short(key), xs, lo, hi))
        return out

    def lines(self, run: RunData, label_prefix: str = "", bounds: bool = True) -> list[Line]:
        keys = list(self.keys)
        if self.rewards:
            keys += [metrics.reward_key(fn) for fn in run.reward_funcs()]
        if self.family:
            keys += sorted(k for k in run.columns if k.startswith(self.family) and k not in keys)
        out = []
        for key in keys:
            xs, ys = run.series(key)
            if xs:
                out.append(Line(label_prefix + short(key), xs, ys))
        for label, xs, lo, hi in self.intervals(run) if bounds else []:  # two faint lines, one legend entry
            name = f"{label_prefix}{label} {INTERVAL}"
            out += [Line(name, xs, lo, color=FAINT, under=True), Line(name, xs, hi, color=FAINT, under=True)]
        if self.rewards and out and out[0].xs:  # under the reward it smooths, so it hides none of its points
            out.append(Line(label_prefix + "smoothed", out[0].xs, ema(out[0].ys), color="white", under=True))
        return out

    def note_for(self, run: RunData) -> str:
        """The note under this panel's chart for `run`: what it says of step 0 only where step 0 exists."""
        before = self.before_note if any(key in run.eval_before for key in self.keys) else ""
        return "; ".join(part for part in (before, self.note) if part)

    def present(self, run: RunData) -> bool:
        return not self.gate or any(self.logged or v > 0 for v in run.series(self.gate)[1])

    def headline(self, run: RunData, title: str | None = None) -> str:
        """'title  value' of the first key's last value; a panel of several keys names the key the value is of
        ('episode stop reasons, share of episodes  done 62.5%'). `title`: a short title, without the axis note."""
        key = self.keys[0] if self.keys else ""
        value = run.last(key)
        suffix = " · log10 axis" if self.log and title is None else ""
        named = f"{short(key)} " if len(self.keys) > 1 else ""
        return f"{title or self.title}  {named}{percent(value) if self.percent else fmt(value)}{suffix}"

    def short_headline(self, run: RunData) -> str:
        return self.headline(run, self.short_title or self.title)


# Legend names that are not the key's own last part: what the value is, where the name alone would mislead.
LABELS = {"perf/train_s": "step−rollout"}  # the file's train_s: the step after its rollout, sync included


def short(key: str) -> str:
    if key in LABELS:
        return LABELS[key]
    prefixes = ("env/tool_calls/", "env/stop/", "env/", "eval/")
    for prefix in ("mismatch/", "completion/", "perf/", "precision/", "mem/", "policy/", *prefixes):
        if key.startswith(prefix):
            return key[len(prefix) :]
    return metrics.reward_fn(key) or key


FAINT = "gray"  # an interval's bounds
INTERVAL = "95% CI"  # the legend's name for a key's Wilson 95% interval (its two bounds: one marker, one entry)
ENV = "env/turns_mean"  # the env/* panels' gate: written by multi-turn runs only

# With one update per batch π_old = π, so the ratio is 1 and the zero-mean advantages cancel.
LOSS_NOTE = "≈0 by design: ratio 1, zero-mean advantages; gradient ≠ 0"

PANELS = {
    p.id: p
    for p in [
        Panel("reward", "reward", [metrics.REWARD], rewards=True),
        # pass@k and maj@k: train.eval_k > 1 only; general/*: the generalisation split; shown once the run has
        # evaluated, with accuracy's Wilson 95% interval as two faint lines named once in the legend ("accuracy
        # 95% CI"; the report: every interval, as bands)
        Panel(
            "eval",
            "held-out accuracy",  # short: plotext drops a title wider than the chart (80x24: ~38 columns)
            [
                metrics.EVAL_ACCURACY,
                metrics.general(metrics.EVAL_ACCURACY),
                metrics.EVAL_ANSWER,
                metrics.EVAL_PASS_AT_K,
                metrics.EVAL_MAJ_AT_K,
            ],
            gate=metrics.EVAL_ACCURACY,
            logged=True,
            before_note="step 0: before training",
            short_title="eval acc",
            bounds=[metrics.EVAL_ACCURACY],
        ),
        Panel("k3", "KL k3", [metrics.K3]),
        Panel("loss", "loss", [metrics.LOSS], note=LOSS_NOTE),
        Panel("grad_norm", "grad norm", ["grad_norm"]),
        Panel("lr", "lr", ["lr"]),
        Panel("entropy", "entropy", ["entropy"]),
        Panel("kl_ref", "KL to ref", ["kl_ref"], needs_beta=True),
        Panel("clip", "clip fraction", ["clip/region", "clip/low", "clip/high"]),
        Panel("dp_max", "|Δp| max", [metrics.DP_MAX, "mismatch/abs_dp_mean"]),
        Panel("is", "IS ratio range", ["mismatch/is_max", "mismatch/is_mean", "mismatch/is_min"]),
        Panel("masked", "masked fraction", ["mismatch/masked_frac"]),
        # MoE models only (engine/model/moe.py): once logged, 0 included (algo.router_replay = replay keeps it at 0)
        Panel(
            "router",
            "router disagreement",
            [metrics.ROUTER_DISAGREE],
            gate=metrics.ROUTER_DISAGREE,
            logged=True,
            family=f"{metrics.ROUTER_DISAGREE}/",
            percent=True,
        ),
        Panel("length", "completion length", ["completion/len_mean", "completion/len_max"]),
        Panel("truncated", "truncated share", ["completion/truncated_frac"]),
        # perf/env_s, perf/model_s: the rollout's split in multi-turn runs only (a key without data draws no line)
        Panel(
            "step_time",
            "step time s",
            ["perf/step_s", "perf/rollout_s", "perf/train_s", "perf/env_s", "perf/model_s"],
            short_title="step s",
        ),
        Panel("tok_s", "rollout tokens/s", ["perf/rollout_tok_s"], short_title="tok/s"),
        Panel("loss_scale", "fp16 loss scale", ["precision/loss_scale"], short_title="loss scale"),
        Panel("skipped", "skipped steps", ["precision/skipped_steps"]),
        Panel("memory", "memory GiB", [metrics.PEAK_GIB, "mem/rss_gib"]),
        Panel("lag_k3", "k3 lag 0 vs lagged", [LAG0_K3, LAGGED_K3], gate=LAGGED_FRAC),  # runs with policy lag only
        Panel("token_lag", "token policy lag", ["policy/token_lag_mean", "policy/token_lag_max"], gate=LAGGED_FRAC),
        Panel("mfu", "MFU, % of measured matmul peak", [MFU], gate=MFU, percent=True, short_title="MFU"),
        # env.environment runs only (engine/rollout/episodes.py): every episode has a model turn, so turns_mean > 0
        Panel("turns", "model turns per episode", ["env/turns_mean", "env/turns_max"], gate=ENV, short_title="turns"),
        Panel(
            "tool_calls",
            "tool calls per episode",
            ["env/tool_calls_mean"],
            gate=ENV,
            family="env/tool_calls/",
            short_title="tool calls",
        ),
        Panel(
            "env_shares",
            "share: env tokens (masked), failed tool calls",
            ["env/env_token_frac", "env/tool_failure_frac"],
            gate=ENV,
            percent=True,
            short_title="env tokens",  # the headline's value is the first key's; the legend names both
        ),
        Panel(
            "stops",
            "episode stop reasons, share of episodes",
            [f"env/stop/{s}" for s in STOPS],
            gate=ENV,
            percent=True,
            short_title="stop reasons",
        ),
    ]
}

TABS = [
    ("overview", "Overview", ["reward", "k3", "eval"]),
    ("training", "Train", ["loss", "grad_norm", "lr", "entropy", "clip", "kl_ref"]),
    ("mismatch", "Mismatch", ["k3", "dp_max", "is", "masked", "router", "lag_k3", "token_lag"]),
    (
        "lengths",
        "Length",
        ["length", "truncated", "loss_scale", "skipped", "turns", "tool_calls", "env_shares", "stops"],
    ),
    ("perf", "Perf", ["step_time", "tok_s", "memory", "mfu"]),
]


def histogram_title(hist: dict) -> str:
    return f"token |Δlogp| per decade, step {hist.get('step')}"


def histogram_bars(hist: dict | None) -> tuple[list[str], list[float]]:
    """|Δlogp| counts grouped per decade: "=0" for exact zeros, then each decade by its lower edge (1e-8)."""
    if not hist:
        return [], []
    labels, values = ["=0"], [float(hist.get("zero", 0))]
    if hist.get("under"):
        labels.append("<")
        values.append(float(hist["under"]))
    groups: dict[int, float] = {}
    for edge, count in zip(hist.get("edges", []), hist.get("counts", [])):
        groups[math.floor(math.log10(edge) + 1e-9)] = groups.get(math.floor(math.log10(edge) + 1e-9), 0) + count
    for decade in sorted(groups):
        labels.append(f"1e{decade}")
        values.append(groups[decade])
    if hist.get("over"):
        labels.append(">")
        values.append(float(hist["over"]))
    return labels, values
