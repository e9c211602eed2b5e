"""The studio's reusable widgets and rich renderables, shared by the screens (studio/screens/).

metric_chart   MetricChart, a plotext chart that redraws only on new data, and its line maths (ema, downsample)
chart_axes     a chart's ticks (round, evenly spaced), their labels (one format, distinct) and its legend line
vram_panel     the VRAM panel beside the setup form: breakdown, total, fits, the solved suggestion
perf_tables    the Perf tab's time split and the Hardware tab's per-rank rows
reward_list    the setup form's rewards picker, with ☑ / ☐ boxes
sample_view    one samples.jsonl row in the Samples tab: the completion, or an episode turn by turn (trained / masked)
samples_panel  the Samples tab: filters (best, worst, zero-variance groups, truncated), search, table and detail
doctor_panel   the Doctor tab: the doctor's findings, the highlighted one's evidence, cause and suggested change
"""
