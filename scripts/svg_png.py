"""Textual's SVG screenshots (App.save_screenshot, written by Rich's Console.export_svg) as PNG, cell for cell.

The terminal grid is drawn at the SVG's own coordinates: each background <rect> as it is, and each <text>
run one glyph per cell, the cell width taken from the SVG (a run's textLength over its length) and the row
from its clip-path, every glyph clipped to its cell so that none spills into a neighbour. The window
chrome (frame, title, the three dots) is drawn too. Fonts: DejaVu Sans Mono (regular, bold, oblique) from
a few standard folders or matplotlib's own copy, DejaVu Sans for the glyphs the monospace face lacks;
without any, PIL's default font (said on stderr).

    python scripts/svg_png.py screenshots/*.svg     # writes each NAME.png beside NAME.svg
"""

from __future__ import annotations

import functools
import html
import importlib.util
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from math import ceil
from pathlib import Path

from PIL import Image, ImageColor, ImageDraw, ImageFont
from rich.cells import cell_len

NS = "{http://www.w3.org/2000/svg}"
BLANK = {" ", "\xa0", "\n", "\u2800"}
STANDINS = {"⭘": "○"}  # Textual's header icon: no DejaVu face has U+2B58


def font_dirs() -> list[Path]:
    dirs = [Path(d) for d in ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu", "/usr/share/fonts/TTF")]
    dirs += [Path.home() / "Library/Fonts", Path("/Library/Fonts")]
    mpl = importlib.util.find_spec("matplotlib")
    if mpl and mpl.origin:
        dirs.append(Path(mpl.origin).parent / "mpl-data/fonts/ttf")
    return dirs


@functools.cache
def font_file(name: str) -> Path | None:
    return next((d / name for d in font_dirs() if (d / name).is_file()), None)


@functools.cache
def cmap(path: Path) -> frozenset[int]:
    """The code points `path` has glyphs for."""
    from fontTools.ttLib import TTFont  # a dependency of matplotlib

    return frozenset(TTFont(path, lazy=True).getBestCmap())


@functools.cache
def truetype(path: Path | None, size: float) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    if path is None:
        return ImageFont.load_default(size)
    return ImageFont.truetype(str(path), size)


@functools.cache
def face(char: str, bold: bool, italic: bool) -> Path | None:
    """The first font file that has `char`: DejaVu Sans Mono in the run's weight and slant, then DejaVu Sans."""
    style = ("Bold" if bold else "") + ("Oblique" if italic else "")
    names = [f"DejaVuSansMono{'-' + style if style else ''}.ttf", "DejaVuSansMono.ttf"]
    names += [f"DejaVuSans{'-Bold' if bold else ''}.ttf", "DejaVuSans.ttf"]
    files = [f for f in map(font_file, names) if f is not None]
    if not files:
        warn_no_font()
        return None
    return next((f for f in files if ord(char) in cmap(f)), files[0])


@functools.cache
def warn_no_font() -> None:
    print("svg_png: no DejaVu font found; drawing with PIL's default font", file=sys.stderr)


@dataclass(frozen=True)
class Run:
    """One <text> of the grid: where its first cell is (SVG units, inside the terminal group) and its style."""

    x: float
    top: float  # the row's top: its clip-path's y
    baseline: float
    text: str
    fill: str
    bold: bool = False
    italic: bool = False
    line: str | None = None  # "underline" or "line-through"


@dataclass
class Screen:
    width: float
    height: float
    cell_w: float
    line_h: float
    font_px: float
    origin: tuple[float, float]  # the terminal group's translate
    rects: list[tuple[float, float, float, float, str]] = field(default_factory=list)  # x, y, w, h, fill
    runs: list[Run] = field(default_factory=list)
    chrome: list[ET.Element] = field(default_factory=list)  # frame, title, dots (with their translate)
    chrome_at: list[tuple[float, float]] = field(default_factory=list)
    classes: dict[str, dict[str, str]] = field(default_factory=dict)


def css_classes(style: str) -> dict[str, dict[str, str]]:
    """{class suffix ("r3", "matrix", "title"): {property: value}} of the SVG's <style>."""
    out = {}
    for name, body in re.findall(r"\.[\w-]*?-(\w+)\s*\{([^}]*)\}", style):
        out[name] = {k.strip(): v.strip() for k, v in (p.split(":", 1) for p in body.split(";") if ":" in p)}
    return out


def translate(el: ET.Element) -> tuple[float, float]:
    m = re.search(r"translate\(\s*([-\d.]+)[,\s]+([-\d.]+)", el.get("transform", ""))
    return (float(m.group(1)), float(m.group(2))) if m else (0.0, 0.0)


def parse(svg: str) -> Screen:
    root = ET.fromstring(svg)
    _, _, width, height = (float(v) for v in root.get("viewBox").split())
    classes = css_classes(root.findtext(f"{NS}style") or "")
    clips = {c.get("id"): c.find(f"{NS}rect") for c in root.iter(f"{NS}clipPath")}
    matrix = classes.get("matrix", {})
    font_px = float(matrix.get("font-size", "20px").removesuffix("px"))
    terminal = next(g for g in root.findall(f"{NS}g") if "clip-terminal" in g.get("clip-path", ""))
    texts = [t for t in terminal.iter(f"{NS}text") if t.get("textLength")]
    cell_w = next((float(t.get("textLength")) / len(t.text) for t in texts if t.text), font_px * 0.61)
    line_h = float(matrix.get("line-height", f"{font_px * 1.22}px").removesuffix("px"))
    screen = Screen(width, height, cell_w, line_h, font_px, translate(terminal), classes=classes)
    for el in root:
        if el.tag in (f"{NS}rect", f"{NS}text"):
            screen.chrome.append(el)
            screen.chrome_at.append((0.0, 0.0))
        elif el.tag == f"{NS}g" and el is not terminal:
            screen.chrome += list(el)
            screen.chrome_at += [translate(el)] * len(el)
    for r in terminal.findall(f"{NS}rect"):
        screen.rects.append((*(float(r.get(k)) for k in ("x", "y", "width", "height")), r.get("fill")))
    for t in texts:
        style = classes.get(t.get("class", "").rsplit("-", 1)[-1], {})
        clip = clips.get(re.sub(r"^url\(#|\)$", "", t.get("clip-path", "")))
        top = float(clip.get("y")) if clip is not None else float(t.get("y")) - font_px + 1.5
        deco = style.get("text-decoration")
        screen.runs.append(
            Run(
                float(t.get("x")),
                top,
                float(t.get("y")),
                html.unescape(t.text or ""),
                style.get("fill", "#c5c8c6"),
                style.get("font-weight") == "bold",
                style.get("font-style") == "italic",
                deco if deco in ("underline", "line-through") else None,
            )
        )
    return screen


@functools.cache
def glyph_mask(char: str, bold: bool, italic: bool, px: float, box: tuple[int, int], baseline: int) -> Image.Image:
    """`char` as an L mask of exactly `box` (w, h), its baseline at row `baseline`: shrunk to the box's width
    when its advance is wider, and clipped to the box."""
    path = face(char, bold, italic)
    font = truetype(path, px)
    advance = font.getlength(char)
    if advance > box[0]:
        font = truetype(path, px * box[0] / advance)
        advance = font.getlength(char)
    mask = Image.new("L", box)
    ImageDraw.Draw(mask).text(((box[0] - advance) / 2, baseline), char, font=font, fill=255, anchor="ls")
    return mask


def rgba(color: str, over: str | None = None) -> tuple[int, int, int, int]:
    """A CSS colour; an rgba(...) one blended over `over` when given."""
    m = re.match(r"rgba\(([\d\s,.]+)\)", color)
    if not m:
        return ImageColor.getcolor(color, "RGBA")
    r, g, b, a = (float(v) for v in m.group(1).split(","))
    base = ImageColor.getrgb(over or "#000000")[:3]
    return tuple(round(a * c + (1 - a) * o) for c, o in zip((r, g, b), base)) + (255,)


def draw_chrome(screen: Screen, draw: ImageDraw.ImageDraw) -> None:
    for el, (dx, dy) in zip(screen.chrome, screen.chrome_at):
        tag = el.tag.removeprefix(NS)
        if tag == "rect":
            x, y, w, h = (float(el.get(k)) for k in ("x", "y", "width", "height"))
            fill = el.get("fill", "#000000")
            outline = rgba(el.get("stroke"), fill) if el.get("stroke") else None
            draw.rounded_rectangle(
                (dx + x, dy + y, dx + x + w, dy + y + h), float(el.get("rx", 0)), fill=rgba(fill), outline=outline
            )
        elif tag == "circle":
            cx, cy, r = (float(el.get(k)) for k in ("cx", "cy", "r"))
            draw.ellipse((dx + cx - r, dy + cy - r, dx + cx + r, dy + cy + r), fill=rgba(el.get("fill")))
        elif tag == "text" and el.text:
            style = screen.classes.get(el.get("class", "").rsplit("-", 1)[-1], {})
            size = float(style.get("font-size", "18px").removesuffix("px"))
            path = font_file("DejaVuSans-Bold.ttf") or font_file("DejaVuSans.ttf")
            anchor = "ms" if el.get("text-anchor") == "middle" else "ls"
            xy = (dx + float(el.get("x")), dy + float(el.get("y")))
            draw.text(xy, html.unescape(el.text), font=truetype(path, size), fill=rgba(el.get("fill")), anchor=anchor)


def render(screen: Screen) -> Image.Image:
    image = Image.new("RGBA", (ceil(screen.width), ceil(screen.height)), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    draw_chrome(screen, draw)
    ox, oy = screen.origin
    for x, y, w, h, fill in screen.rects:
        left, right = round(ox + x), round(ox + x + w)
        if right > left:
            draw.rectangle((left, round(oy + y), right - 1, round(oy + y + h) - 1), fill=rgba(fill))
    cw = screen.cell_w
    for run in screen.runs:
        top, bottom = round(oy + run.top), round(oy + run.top + screen.line_h)
        baseline = round(oy + run.baseline) - top
        col = round(run.x / cw)
        for char in run.text:
            n = cell_len(char)
            left, right = round(ox + col * cw), round(ox + (col + n) * cw)
            col += n
            if char in BLANK and not run.line:
                continue
            box = (right - left, bottom - top)
            mask = glyph_mask(STANDINS.get(char, char), run.bold, run.italic, screen.font_px, box, baseline)
            if run.line:
                mask = mask.copy()
                y = baseline + 2 if run.line == "underline" else baseline - round(screen.font_px * 0.3)
                ImageDraw.Draw(mask).line((0, y, box[0], y), fill=255)
            image.paste(rgba(run.fill), (left, top, right, bottom), mask)
    return image


def convert(svg: Path, png: Path | None = None) -> Path:
    """Rasterise `svg` to `png` (default: beside it, .png)."""
    png = png or svg.with_suffix(".png")
    render(parse(svg.read_text(encoding="utf-8"))).save(png, optimize=True)
    return png


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for name in argv:
        print(convert(Path(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
