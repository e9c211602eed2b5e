"""The setup form's rewards picker: a SelectionList whose boxes read ☑ / ☐, so the selected rewards show
without colour."""

from __future__ import annotations

from rich.segment import Segment
from textual.strip import Strip
from textual.widgets import SelectionList


class RewardList(SelectionList):
    """A SelectionList whose boxes read ☑ / ☐, so the selected rewards show without colour."""

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        index = self.scroll_offset.y + y
        if index >= self.option_count:
            return strip
        left, box, *rest = strip  # the toggle button: side, box character, side
        mark = "☑" if self.get_option_at_index(index).value in self.selected else "☐"
        return Strip([left, Segment(mark, box.style, box.control), *rest], strip.cell_length)
