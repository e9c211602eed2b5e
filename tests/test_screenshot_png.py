"""scripts/svg_png.py: every screenshots/*.svg rasterised matches its SVG cell for cell. The grid is read
from the SVG here on its own (regular expressions, not the rasteriser's parser): a cell holding a glyph
has ink inside its box, and a cell the SVG leaves blank holds nothing but its background."""

from __future__ import annotations

import html
import importlib.util
import re
import sys
from math import ceil, floor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageColor
from rich.cells import cell_len

ROOT = Path(__file__).resolve().parents[1]
SVGS = sorted((ROOT / "screenshots").glob("*.svg"))
BLANK = {" ", "\xa0", "\n", "\u2800"}


def rasteriser():
    spec = importlib.util.spec_from_file_location("svg_png", ROOT / "scripts" / "svg_png.py")
    module = sys.modules.setdefault("svg_png", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def attrs(tag: str) -> dict[str, str]:
    return dict(re.findall(r'([\w-]+)="([^"]*)"', tag))


def grid(svg: str):
    """(origin, cell width, line height, {(col, row): background}, {(col, row): (char, colour)})."""
    ox, oy = (
        float(v)
        for v in re.search(r'translate\(([\d.]+), ([\d.]+)\)" clip-path="url\(#[\w-]+-clip-terminal', svg).groups()
    )
    fills = dict(re.findall(r"\.[\w-]+-(r\d+) \{ fill: (#[0-9a-f]{6})", svg))
    font_px = float(re.search(r"font-size: ([\d.]+)px;\s+line-height", svg).group(1))
    line_h = float(re.search(r"line-height: ([\d.]+)px", svg).group(1))
    texts = [
        (attrs(m.group(1)), html.unescape(m.group(2)))
        for m in re.finditer(r"<text (class=\"[\w-]+-r\d+\"[^>]*)>([^<]*)</text>", svg)
    ]
    cell_w = float(texts[0][0]["textLength"]) / len(texts[0][1])
    back = {}
    for m in re.finditer(r"<rect (fill=\"#[0-9a-f]{6}\" [^>]*crispEdges)\"/>", svg):
        a = attrs(m.group(1) + '"')
        row, col = round((float(a["y"]) - 1.5) / line_h), round(float(a["x"]) / cell_w)
        for c in range(col, col + round(float(a["width"]) / cell_w)):
            back[c, row] = a["fill"]
    ink = {}
    for a, text in texts:
        row, col = round((float(a["y"]) - font_px) / line_h), round(float(a["x"]) / cell_w)
        for char in text:
            ink[col, row] = (char, fills[a["class"].rsplit("-", 1)[1]])
            col += cell_len(char)
    return (ox, oy), cell_w, line_h, back, ink


def cell(pixels: np.ndarray, origin, cell_w: float, line_h: float, col: int, row: int) -> np.ndarray:
    """The pixels wholly inside cell (col, row)'s box."""
    left, top = origin[0] + col * cell_w, origin[1] + row * line_h + 1.5
    return pixels[ceil(top) : floor(top + line_h), ceil(left) : floor(left + cell_w)]


def mismatches(svg_path: Path, png_path: Path) -> list[str]:
    svg = svg_path.read_text(encoding="utf-8")
    origin, cell_w, line_h, back, ink = grid(svg)
    pixels = np.asarray(Image.open(png_path).convert("RGB")).astype(int)
    bad = []
    for (col, row), bg in back.items():
        char, fg = ink.get((col, row), (" ", bg))
        box, bg_rgb, fg_rgb = (
            cell(pixels, origin, cell_w, line_h, col, row),
            ImageColor.getrgb(bg),
            ImageColor.getrgb(fg),
        )
        away = np.abs(box - bg_rgb).sum(axis=2)
        if char in BLANK or fg == bg:
            if away.max() > 0:
                bad.append(f"({col},{row}) blank in the SVG has ink")
        elif away.max() < 0.25 * sum(abs(f - b) for f, b in zip(fg_rgb, bg_rgb)):
            bad.append(f"({col},{row}) {char!r} has no ink")
    return bad


def test_the_screenshots_are_there():
    assert len(SVGS) >= 8


@pytest.mark.parametrize("svg", SVGS, ids=lambda p: p.stem)
def test_png_matches_its_svg_cell_for_cell(svg, tmp_path):
    png = rasteriser().convert(svg, tmp_path / "shot.png")
    size = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg.read_text(encoding="utf-8")).groups()
    assert Image.open(png).size == tuple(ceil(float(v)) for v in size)
    _, _, _, back, ink = grid(svg.read_text(encoding="utf-8"))
    assert len(back) > 1000 and len(ink) > 200  # the grid was really read
    assert mismatches(svg, png) == []


def test_a_wrong_cell_width_is_caught(tmp_path):
    """The old PNGs' ~15 px glyph pitch against the SVG's cells: the comparison fails."""
    module = rasteriser()
    screen = module.parse(SVGS[0].read_text(encoding="utf-8"))
    scale = 15 / screen.cell_w
    screen.cell_w = 15
    screen.rects = [(x * scale, y, w * scale, h, fill) for x, y, w, h, fill in screen.rects]
    screen.runs = [type(r)(**{**r.__dict__, "x": r.x * scale}) for r in screen.runs]
    module.render(screen).save(tmp_path / "wide.png")
    assert len(mismatches(SVGS[0], tmp_path / "wide.png")) > 100
