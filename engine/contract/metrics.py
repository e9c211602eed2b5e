"""The metric schema: what the trainer writes to metrics.jsonl and how every reader shows it."""

from __future__ import annotations

import math


def fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    a = abs(value)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{value:.2e}"
    return f"{value:.4g}"
