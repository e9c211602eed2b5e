"""The VRAM panel beside the setup form: breakdown rows, total, detected GPU, fits, and the
inverse-solved suggestion. Documented (Unsloth's formulas) vs accurate mode."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ..vram_adapter import Plan


def render_plan(plan: Plan, gpu_label: str, width: int = 0) -> Group | Text:
    """The plan as a table: part, GiB and, from 50 columns on, each part's formula (the wider, the more of it)."""
    wide = width >= 50
    if plan.error:
        return Text.assemble((f"VRAM · {plan.mode}\n", "bold"), (plan.error, "bold red"))
    table = Table(box=None, expand=True, show_header=False, pad_edge=False, padding=(0, 1))
    table.add_column("part", ratio=3, overflow="fold")
    table.add_column("GiB", justify="right", no_wrap=True)
    if wide:
        table.add_column("formula", ratio=4 if width < 80 else 9, overflow="ellipsis", no_wrap=True, style="dim")
    table.add_row(
        Text(f"VRAM · {plan.mode} (ctrl+t)", style="bold"),
        Text("GiB", style="bold"),
        *([Text("formula", style="bold")] if wide else []),
    )
    for row in plan.rows:
        style = "" if row.in_total else "dim"
        table.add_row(
            Text(row.name, style=style), Text(f"{row.gib:,.2f}", style=style), *([row.formula] if wide else [])
        )
    table.add_row(Text("total", style="bold"), Text(f"{plan.total:,.2f}", style="bold"), *([""] if wide else []))
    # the total is the planner's peak, not always the rows' sum: say which rows it adds
    rule = [Text(f"total = {plan.peak_rule}", style="dim")] if plan.peak_rule else []
    weights = [Text(plan.params, style="dim")] if plan.params else []
    lines = [table, *rule, *weights, *device_lines(plan), Text(""), Text(gpu_label, style="italic")]
    if plan.fits is True:
        lines.append(Text(f"fits in {plan.gpu_gib:,.0f} GiB  ✓", style="bold green"))
    elif plan.fits is False:
        lines.append(Text(f"does not fit in {plan.gpu_gib:,.0f} GiB  ✗", style="bold red"))
    else:
        lines.append(Text("no GPU size to check against", style="yellow"))
    if plan.suggestion:
        lines.append(Text(plan.suggestion, style="yellow"))
    return Group(*lines)


def device_lines(plan: Plan) -> list[Text]:
    """One line per device when the planner splits the run over more than one (vram.Breakdown.devices)."""
    if len(plan.devices) < 2:
        return []
    out = [Text("per device", style="bold")]
    for dev in plan.devices:
        mark = {True: ("  ✓", "green"), False: ("  ✗", "bold red")}.get(getattr(dev, "fits", None), ("", ""))
        name = dev.name if dev.kind in dev.name else f"{dev.name} ({dev.kind})"
        out.append(Text.assemble(f"{name}  {dev.total_gib:,.2f} GiB", mark))
    return out


class VramPanel(Static):
    DEFAULT_CSS = "VramPanel { height: auto; }"

    def __init__(self, **kwargs):
        super().__init__("", **kwargs)
        self.plan: Plan | None = None
        self.gpu_label = ""

    def show(self, plan: Plan, gpu_label: str) -> None:
        self.plan, self.gpu_label = plan, gpu_label
        self.border_title = f"VRAM · {plan.mode}"
        self.update(render_plan(plan, gpu_label, self.size.width))

    def on_resize(self) -> None:
        if self.plan is not None:
            self.update(render_plan(self.plan, self.gpu_label, self.size.width))
