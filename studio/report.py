"""`grpo-studio report RUN [--out DIR]`: a run's charts as PNGs (matplotlib) and a one-page HTML summary."""

from __future__ import annotations

import html
from pathlib import Path

from ..contract import metrics
from ..contract.metrics import fmt
from .panels import PANELS, histogram_bars, histogram_title
from .rundata import RunData
from .widgets.metric_chart import ema, not_drawn, positive

REPORT_PANELS = [
    "reward",
    "eval",
    "k3",
    "loss",
    "grad_norm",
    "entropy",
    "dp_max",
    "is",
    "length",
    "step_time",
    "tok_s",
    "memory",
    "loss_scale",
    "kl_ref",
]


def _figure(run: RunData, pid: str, out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panel = PANELS[pid]
    lines = panel.lines(run, bounds=False)
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    colours, zeros, others = {}, 0, 0
    for line in lines:
        xs, ys = line.xs, line.ys
        if panel.log:  # matplotlib masks values <= 0 on a log axis silently: left out here, and counted
            xs, ys, n = positive(xs, ys)
            if not line.under:
                n_zero = sum(1 for y in line.ys if y == 0)
                zeros, others = zeros + n_zero, others + n - n_zero
        (drawn,) = ax.plot(
            xs,
            ys,
            label=line.label,
            linewidth=1.6 if line.under else 1.0,
            marker="o" if len(xs) <= 12 else None,  # a sparse series (eval every N steps) shows its points
            zorder=1 if line.under else 2 + 1 / (1 + len(xs)),  # as the studio draws them: the sparsest on top
        )
        colours[line.label] = drawn.get_color()
    for label, xs, lo, hi in panel.intervals(run, panel.keys):  # Wilson 95% intervals: faint bands, the lines' colours
        ax.fill_between(xs, lo, hi, color=colours.get(label), alpha=0.15, linewidth=0)
    if panel.log:
        ax.set_yscale("log")
    if panel.percent:
        from matplotlib.ticker import PercentFormatter

        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    dropped = not_drawn(zeros, others)
    ax.set_title(f"{panel.title} · {dropped}" if dropped else panel.title)
    note = panel.note_for(run)
    ax.set_xlabel(f"step\n{note}" if note else "step")
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{pid}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _histogram(run: RunData, out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    labels, values = histogram_bars(run.histogram)
    if not values:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    ax.bar(labels, values)
    ax.set_title(histogram_title(run.histogram))
    fig.tight_layout()
    path = out / "dlogp_histogram.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def export(run_dir: Path, out: Path | None = None, run: RunData | None = None) -> Path:
    """The report of `run_dir` in `out` (default RUN/report); `run`: the run already read (report_cmd's)."""
    if run is None:
        run = RunData(run_dir)
        run.drain()
    out = Path(out or run_dir / "report")
    out.mkdir(parents=True, exist_ok=True)
    images = [p for p in (_figure(run, pid, out) for pid in REPORT_PANELS) if p is not None]
    hist = _histogram(run, out)
    if hist:
        images.append(hist)
    (out / "index.html").write_text(_html(run, images))
    return out


def _html(run: RunData, images: list[Path]) -> str:
    rows = [
        ("state", run.state()),
        ("steps", f"{run.step}/{run.total_steps or '?'}"),
        ("dtype (train/rollout)", run.dtype()),
        ("model", run.config.get("model", {}).get("name", "?")),
        ("algorithm", run.config.get("algo", {}).get("name", "?")),
        ("final reward", fmt(run.last(metrics.REWARD))),
        ("smoothed reward", fmt(ema(run.series(metrics.REWARD)[1])[-1] if run.series(metrics.REWARD)[1] else None)),
        ("final k3", fmt(run.last(metrics.K3))),
        ("peak memory GiB", fmt(run.last(metrics.PEAK_GIB))),
    ]
    warnings = [e for e in run.events if e.get("event") in ("warning", "skipped_step", "reward_error", "crashed")]
    esc = html.escape
    table = "".join(f"<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in rows)
    warn = "".join(f"<li>{esc(e.get('event', ''))}: {esc(str(e.get('message', '')))}</li>" for e in warnings[-20:])
    figs = "".join(f'<img src="{esc(p.name)}" alt="{esc(p.stem)}">' for p in images)
    return (
        f"<!doctype html><meta charset='utf-8'><title>{esc(run.name)}</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}img{width:48%;margin:.5%}th{text-align:left;padding-right:1em}"
        "</style>"
        f"<h1>{esc(run.name)}</h1><table>{table}</table>"
        + (f"<h2>Warnings</h2><ul>{warn}</ul>" if warn else "")
        + f"<h2>Charts</h2>{figs}\n"
    )
