"""A chart's axes and legend as text: tick values (few, round, evenly spaced), their labels (one number
format per axis, all distinct) and the legend line under the plot (a marker glyph per series)."""

from __future__ import annotations

import math

# One marker per series, so lines differ without colour; the glyph the legend shows for each.
MARKERS = ["hd", "braille", "•", "+", "x", "*"]
GLYPHS = {"hd": "▞", "braille": "⠿"}
HD = set("▖▗▘▝▚▞▙▛▜▟▌▐▀▄█")  # the 2×2 block characters plotext draws an "hd" line with
SHARED = "◆"  # a canvas cell where the markers of two series fall (metric_chart.SharedCells)
SHARED_KEY = f"{SHARED} shared"  # its legend entry


def glyph(marker: str) -> str:
    return GLYPHS.get(marker, marker)


def drawn_by(char: str) -> str | None:
    """Which of MARKERS plotext drew `char` with (hd: 2×2 blocks; braille: 2×4 dots), None for any other."""
    if char in HD:
        return "hd"
    if "\u2801" <= char <= "\u28ff":
        return "braille"
    return char if char in MARKERS else None


def ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """At most n round values within [lo, hi], 1, 2 or 5 × 10^k apart (the smallest such step
    that gives at most n); whole numbers when `integer`."""
    if hi <= lo:
        return [lo]

    def grid(step: float) -> list[float]:
        return [i * step for i in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)]

    k = math.floor(math.log10((hi - lo) / max(n, 1)))
    steps = [m * 10.0**e for e in (k, k + 1, k + 2) for m in (1, 2, 5)]
    return next(g for g in map(grid, [s for s in steps if s >= 1 or not integer]) if len(g) <= n)


def nice_range(lo: float, hi: float, n: int = 5, integer: bool = False) -> tuple[float, float, list[float]]:
    """The axis [lo, hi] widened to round ends, and its ticks: the finest 1-2-5 step whose widened range
    holds at most n ticks (n >= 3), so both ends of the frame are labelled."""
    if hi <= lo:
        return lo, hi, [lo]
    k = math.floor(math.log10((hi - lo) / max(n, 1)))
    for step in (m * 10.0**e for e in range(k, k + 4) for m in (1, 2, 5)):
        if integer and step < 1:
            continue
        a, b = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
        if b - a + 1 <= n:
            return a * step, b * step, [i * step for i in range(a, b + 1)]
    return lo, hi, ticks(lo, hi, n, integer)


def log_range(lo: float, hi: float, n: int = 5) -> tuple[float, float, list[float]]:
    """A log10 axis (lo, hi and the ticks are log10 values): 1, 2, 5 × 10^k marks; whole decades, the frame
    widened to them, when those marks are more than n; round values (4e-6, 5e-6, 6e-6) when they are fewer
    than two, so every label is a round number."""
    marks = [k + math.log10(m) for k in range(math.floor(lo), math.ceil(hi) + 1) for m in (1, 2, 5)]
    marks = [t for t in marks if lo - 1e-9 <= t <= hi + 1e-9]
    if len(marks) > n:
        return nice_range(lo, hi, n, integer=True)
    if len(marks) >= 2:
        return lo, hi, marks
    a, b, values = nice_range(10.0**lo, 10.0**hi, n)
    if a <= 0:  # the widened frame would reach 0: keep the data's frame and the round values inside it
        return lo, hi, [math.log10(v) for v in ticks(10.0**lo, 10.0**hi, n) if v > 0]
    return math.log10(a), math.log10(b), [math.log10(v) for v in values]


def labels(values: list[float], percent: bool = False) -> list[str]:
    """One number format for the whole axis: fixed decimals while every value is within [1e-3, 1e5) (or
    zero), else scientific; the fewest digits that show each value exactly and keep the labels distinct.
    `percent`: the values are shares, shown ×100 with a % sign."""
    values = [100 * v for v in values] if percent else list(values)
    big = max((abs(v) for v in values), default=0.0)
    small = min((abs(v) for v in values if v != 0), default=1.0)
    scientific = big >= 1e5 or small < 1e-3
    for digits in range(7):
        out = [f"{v:.{digits}e}" if scientific else f"{v:.{digits}f}" for v in values]
        exact = all(math.isclose(float(t), v, rel_tol=1e-6, abs_tol=1e-12) for t, v in zip(out, values))
        if exact and len(set(out)) == len(out):
            break
    out = ["0" if float(t) == 0 else t for t in out]  # no "-0.00" or "0.00e+00" beside the others
    return [t + "%" for t in out] if percent else out


def legend_lines(entries: list[tuple[str, str]], width: int, shared: bool = False) -> tuple[str, list[str]]:
    """The legend line and the lines under it: '▞ label  ⠿ label' when every name fits whole, else numbered
    markers ('▞1 ⠿2 •3') with the names listed under the plot ('1 step_s · 2 rollout_s'), wrapped to `width`.
    `shared`: the line ends with '◆ shared' (cells two series share)."""
    tail = f"  {SHARED_KEY}" if shared else ""
    whole = "  ".join(f"{g} {name}" for g, name in entries) + tail
    if len(whole) <= width:
        return whole, []
    numbered = " ".join(f"{g}{i}" for i, (g, _) in enumerate(entries, 1)) + tail
    lines, line = [], ""
    for i, (_, name) in enumerate(entries, 1):
        item = f"{i} {name}"
        if line and len(line) + 3 + len(item) > width:
            lines.append(line)
            line = ""
        line = f"{line} · {item}" if line else item[:width]
    return numbered, lines + [line]


def title_fits(length: int, width: int, y_width: int) -> bool:
    """Whether plotext draws a title of `length` on a chart `width` wide whose y labels are `y_width` wide: it
    centres the title on the canvas and drops one that would cross the widget's edge (plotext/_build.py, the
    title row; _matrix.py, check_space)."""
    center = (y_width + 1) + (width - y_width - 2) // 2
    return center - length // 2 >= 0 and center - length // 2 + length <= width


def fit_title(candidates: list[str], width: int, y_width: int) -> str:
    """The first candidate plotext will draw whole, else the last one cut with '…' to the longest that it will."""
    for title in candidates:
        if title_fits(len(title), width, y_width):
            return title
    last = candidates[-1]
    n = len(last) - 1
    while n > 1 and not title_fits(n + 1, width, y_width):
        n -= 1
    return last[:n] + "…"
