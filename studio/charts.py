"""Moved to widgets/metric_chart.py. This re-export keeps the old import path working for
benchmarks/ui_bench.py until it imports the new one; then delete this file."""

from grpo_studio.studio.widgets.metric_chart import COLORS, Line, MetricChart, downsample, ema  # noqa: F401
