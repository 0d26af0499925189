"""
Drawings of ARR's maps and saccades, for the app and `python -m arr_coc.run --save-dir`.

- heatmap_overlay   relevance over the image, each saccade a box coloured by rank, the top N numbered (numbers
                    never overlap: crowded ones move aside on a leader line, or are skipped and listed); a second
                    look's saccades (ARR's Options.refixate) in SECOND_LOOK green, said in a legend
- saccade_mosaic    the selected high-res cells tiled in rank order: what the LLM read at full detail
- kept_overlay      the cells a token reducer (divprune, visionzip, fastv) kept, boxed as ARR's saccades are, over
                    the image or ARR's relevance map; VisionZip's merged context cells shaded
- channel_grid      the 13 texture channels, on one [0, 1] scale
- scorer_maps       the scorer maps (config.SCORERS), the participatory prior and the balanced relevance
- weights_bar       the balancer's three weights, and each scorer map's share of the saccades' relevance
- difference_map    B - A of two relevance maps, with both saccade sets marked
- moves_overlay     a conversation's turn against the one before: cells new in it, kept from it, dropped
- faithfulness_chart  the answer's log-likelihood as saccades are removed (rank order, random) or inserted
- saccade_overlap, rank_correlation: how much two selections / two maps agree
- teacher_comparison  the teacher's map (where the model looks reading everything, arr_coc.distill) beside ARR's
                    relevance, their overlap, and the asked box where the page has one

Every drawing is a PIL RGB image (what gr.Image shows). Cell drawings are plain PIL, so a cell maps to
exact pixels; charts are matplotlib `Figure`s built without pyplot, so no figure is ever registered
globally: nothing leaks and Gradio's worker threads cannot race on pyplot's state.

    from arr_coc import viz
    viz.heatmap_overlay(image, out.relevance[0], out.positions[0]).save("heatmap.png")
    viz.saccade_mosaic(views.highres, views.candidate_grid, out.positions[0]).save("mosaic.png")
    viz.save_all(answer, "out/run")   # heatmap.png, mosaic.png, channels.png, scorers.png
"""

import math
import textwrap
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image, ImageDraw, ImageFont

from arr_coc.relevance.config import scorer_names
from arr_coc.relevance.texture import CHANNELS, minmax
from arr_coc.vlm.views import box_coverage, to_rgb

MapLike = torch.Tensor | np.ndarray  # [gh, gw] (or [1, gh, gw]) map
CellsLike = torch.Tensor | np.ndarray | Sequence  # (row, col) positions [K, 2], or Saccade objects; rank order

MIN_SIDE = 768  # cell drawings are at least this long: a small image is upscaled so its numbers stay legible
MAX_SIDE = 2048  # and at most this long: a 64x64 grid at 1792^2 is drawn 1:1, 28 px a cell; still quick to send
HEAT_CMAP = "inferno"  # relevance: dark = ignored, bright = relevant
RANK_CMAP = "cool"  # saccade boxes: rank 1 cyan ... last magenta, apart from the heatmap's colours
SECOND_LOOK = (57, 255, 20)  # a second fixation's saccade boxes: a green in neither RANK_CMAP nor HEAT_CMAP
SECOND_LOOK_LEGEND = "cyan to magenta: the first look's saccades by rank · green: the second look's"
KEY_BARS = (0.12, 0.55)  # with_key: where the relevance bar and the rank bar start, as shares of the width
KEY_BAR_SHARE = 0.3  # and how long each is
DIFF_CMAP = "RdBu_r"  # B - A: red = B finds it more relevant, blue = A does
TOP_LABELS = 20  # saccades numbered by default: at 64x64 or finer, 273 numbers would hide the image
MOSAIC_SCALE = 3  # each 28 px saccade cell is shown 3x (84 px): nearest, so every pixel the ViT read is visible
MOSAIC_GAP = 2  # px between mosaic tiles
MOSAIC_BACKGROUND = (32, 32, 32)  # the gaps and the empty places of the last row
SCORER_COLOURS = ("#4c72b0", "#dd8452", "#55a868")  # weights_bar's, by scorer index (config.SCORERS' order),
# round again past the third
EQUAL_WEIGHTS = 0.05  # weights_bar: balancer weights closer than this are said to be about equal
FAITHFULNESS_TITLE_CHARS = 56  # a long answer in the chart's title is cut to fit the chart's width
FAITHFULNESS_STYLES = {"deletion": ("#c44e52", "-"), "random": ("#8c8c8c", "--"), "insertion": ("#4c72b0", "-")}
KEPT_COLOUR = (0, 255, 255)  # a reducer's kept cells: one colour (it does not rank them), the saccades' rank-1 cyan
MERGED_FILL = (255, 140, 0, 110)  # VisionZip's merged context cells: shaded orange (RGBA) under their box
A_MARK, B_MARK = (0, 0, 0), (0, 200, 0)  # difference_map: A's saccades black squares, B's green dots
MOVE_COLOURS = {"new": (57, 255, 20), "kept": (0, 255, 255), "dropped": (255, 64, 64)}  # moves_overlay's boxes
DPI = 100


# ----------------------------------------------------------------------------- conversions


def as_array(values) -> np.ndarray:
    """A tensor (any dtype or device) or array-like -> float64 numpy."""
    if isinstance(values, torch.Tensor):
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def as_map(values: MapLike) -> np.ndarray:
    """A [gh, gw] or [1, gh, gw] tensor/array -> float64 numpy [gh, gw]."""
    a = as_array(values)
    if a.ndim == 3 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 2:
        raise ValueError(f"expected a [gh, gw] map, got shape {a.shape}")
    return a


def as_cells(saccades: CellsLike) -> list[tuple[int, int]]:
    """Saccade objects or (row, col) positions [K, 2] / [1, K, 2] -> [(row, col)] in rank order."""
    if isinstance(saccades, torch.Tensor):
        saccades = saccades.detach().cpu().numpy()
    if len(saccades) and hasattr(saccades[0], "row"):
        return [(s.row, s.col) for s in saccades]
    return [(int(r), int(c)) for r, c in np.asarray(saccades, dtype=np.int64).reshape(-1, 2)]


def normalise(values: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1] (a flat map becomes all zeros); NaN/inf count as the minimum."""
    return minmax(torch.from_numpy(values)[None], floor=0)[0].numpy()


def colourise(values: np.ndarray, cmap: str, lo: float = 0.0, hi: float = 1.0) -> Image.Image:
    """A map -> RGB image with one pixel per cell, `lo`..`hi` spanning the colormap."""
    rgba = matplotlib.colormaps[cmap](np.clip((values - lo) / (hi - lo), 0, 1))
    return Image.fromarray((rgba[..., :3] * 255).round().astype(np.uint8))


def canvas_size(width: int, height: int) -> tuple[int, int]:
    """
    The image's own size, scaled only to bring its long side into [MIN_SIDE, MAX_SIDE]: a native-resolution
    candidate grid needs the image's resolution to be seen, cell by cell.
    """
    long = max(width, height)
    scale = min(MAX_SIDE / long, max(1.0, MIN_SIDE / long))
    return max(1, round(width * scale)), max(1, round(height * scale))


def cell_rect(row: int, col: int, grid: tuple[int, int], size: tuple[int, int]) -> tuple[int, int, int, int]:
    """Pixel box (x0, y0, x1, y1), inclusive, of a grid cell on a canvas of `size` (width, height)."""
    (gh, gw), (W, H) = grid, size
    x0, y0 = round(col * W / gw), round(row * H / gh)
    x1, y1 = round((col + 1) * W / gw) - 1, round((row + 1) * H / gh) - 1
    return x0, y0, max(x0, x1), max(y0, y1)


@lru_cache(maxsize=16)
def font(size: int) -> ImageFont.FreeTypeFont:
    """Bold DejaVu Sans, the font matplotlib ships, so it exists wherever matplotlib does."""
    path = font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans", weight="bold"))
    return ImageFont.truetype(path, size)


def render(fig: Figure) -> Image.Image:
    """Rasterise a matplotlib Figure (made without pyplot, so there is nothing to close) -> PIL RGB."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy())


# ----------------------------------------------------------------------------- cell drawings


def rank_colours(n: int) -> list[tuple[int, int, int]]:
    """n RGB colours along RANK_CMAP: rank 1 cyan ... rank n magenta."""
    return [tuple(round(255 * v) for v in rgba[:3]) for rgba in matplotlib.colormaps[RANK_CMAP](np.linspace(0, 1, n))]


def label_font(cell: float, canvas: Image.Image) -> ImageFont.FreeTypeFont:
    """
    Rank numbers about half a cell high, but never smaller than 1/90 of the canvas's long side: a fine grid's
    cells are small, and a shown drawing is scaled down to the page, so numbers keep a legible size.
    """
    return font(max(10, round(cell * 0.5), round(max(canvas.size) / 90)))


def draw_rank(draw: ImageDraw.ImageDraw, xy: tuple[float, float], rank: int, typeface, anchor: str = "mm") -> None:
    """A rank number, white with a black outline: it reads on any colour of the heatmap or of a tile."""
    draw.text(xy, str(rank), font=typeface, anchor=anchor, fill="white",
              stroke_width=max(1, round(typeface.size / 7)), stroke_fill="black")


def draw_saccades(canvas: Image.Image, cells: list[tuple[int, int]], grid: tuple[int, int],
                  numbered: int = TOP_LABELS) -> list[int]:
    """
    Every saccade as a thin box coloured by rank (better ranks drawn over worse ones); rank 1 thick inside a
    white ring; the first `numbered` ranks carry their number, placed so no two numbers overlap (place_labels).
    Thin boxes keep a 64x64 or 128x128 grid readable. Returns the ranks left unnumbered for lack of room.
    """
    if not cells:
        return []
    draw = ImageDraw.Draw(canvas)
    W, H = canvas.size
    cell = min(W / grid[1], H / grid[0])  # px per cell side
    colours, line = rank_colours(len(cells)), max(1, round(cell / 16))  # 1 px below 24 px cells, 2 px at 28
    for rank in range(len(cells), 1, -1):  # last first, so better ranks are drawn over worse ones
        draw.rectangle(cell_rect(*cells[rank - 1], grid, canvas.size), outline=colours[rank - 1], width=line)
    # rank 1: a thick box in its colour inside a white ring, so it stands out among the other top ranks
    x0, y0, x1, y1 = cell_rect(*cells[0], grid, canvas.size)
    width = max(2, round(cell / 8))
    draw.rectangle((x0 - width, y0 - width, x1 + width, y1 + width), outline="white", width=width)
    draw.rectangle((x0, y0, x1, y1), outline=colours[0], width=width)
    numbers = label_font(cell, canvas)
    ranks = list(range(1, min(len(cells), max(0, int(numbered))) + 1))
    centres = [((x0 + x1) / 2, (y0 + y1) / 2) for x0, y0, x1, y1 in (cell_rect(*cells[r - 1], grid, canvas.size)
                                                                      for r in ranks)]
    sizes = [label_size(draw, str(r), numbers) for r in ranks]
    spots = place_labels(centres, sizes, canvas.size)
    for centre, spot in zip(centres, spots):  # leader lines first, so no line crosses a number
        if spot is not None and spot != centre:
            draw.line((centre, spot), fill="white", width=max(1, line))
    for rank, spot in reversed(list(zip(ranks, spots))):
        if spot is not None:
            draw_rank(draw, spot, rank, numbers)
    return [rank for rank, spot in zip(ranks, spots) if spot is None]


def label_size(draw: ImageDraw.ImageDraw, text: str, typeface) -> tuple[int, int]:
    """(width, height) in px of a rank number as draw_rank draws it, outline included."""
    x0, y0, x1, y1 = draw.textbbox((0, 0), text, font=typeface, anchor="mm",
                                   stroke_width=max(1, round(typeface.size / 7)))
    return x1 - x0, y1 - y0


def place_labels(centres: list[tuple[float, float]], sizes: list[tuple[int, int]],
                 canvas: tuple[int, int]) -> list[tuple[float, float] | None]:
    """
    Where each label goes, in rank order (a better rank keeps the better spot): on its cell's centre if no
    placed label is there, else the nearest free spot on two rings around it (drawn with a leader line), else
    None (not numbered: the drawing says so). No two placed labels overlap, and all lie inside the canvas.
    """
    placed: list[tuple[float, float, float, float]] = []
    spots = []
    for (cx, cy), (w, h) in zip(centres, sizes):
        step = max(w, h) * 1.1
        angles = np.linspace(-math.pi / 2, 1.5 * math.pi, 8, endpoint=False)  # above first, then clockwise
        offsets = [(0.0, 0.0)] + [(ring * step * math.cos(a), ring * step * math.sin(a)) for ring in (1, 2) for a in angles]
        spot = None
        for dx, dy in offsets:
            box = (cx + dx - w / 2, cy + dy - h / 2, cx + dx + w / 2, cy + dy + h / 2)
            inside = box[0] >= 0 and box[1] >= 0 and box[2] <= canvas[0] and box[3] <= canvas[1]
            if inside and not any(overlaps(box, other) for other in placed):
                spot = (cx + dx, cy + dy)
                placed.append(box)
                break
        spots.append(spot)
    return spots


def overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float], gap: float = 1.0) -> bool:
    """Whether two (x0, y0, x1, y1) boxes overlap or come closer than `gap` px."""
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def skipped_note(canvas: Image.Image, skipped: list[int]) -> None:
    """Say on the drawing (bottom left) which ranks carry no number because their cells are crowded."""
    if not skipped:
        return
    shown = ", ".join(map(str, skipped[:8])) + (f" and {len(skipped) - 8} more" if len(skipped) > 8 else "")
    text = f"not numbered, no room beside their crowded cells: {shown}"
    typeface = font(max(11, canvas.width // 80))
    draw = ImageDraw.Draw(canvas)
    x0, y0, x1, y1 = draw.textbbox((6, canvas.height - 6), text, font=typeface, anchor="ld")
    draw.rectangle((x0 - 4, y0 - 3, x1 + 4, y1 + 3), fill="black")
    draw.text((6, canvas.height - 6), text, font=typeface, anchor="ld", fill="white")


def heat_canvas(image: Image.Image, relevance: MapLike | None, alpha: float = 0.5) -> Image.Image:
    """The image at its own resolution (see canvas_size), with the relevance map (min-max scaled, one flat
    colour per cell) blended over it; the image alone when there is no map."""
    base = to_rgb(image)
    size = canvas_size(*base.size)
    canvas = base.resize(size, Image.Resampling.BICUBIC)
    if relevance is None:
        return canvas
    heat = colourise(normalise(as_map(relevance)), HEAT_CMAP).resize(size, Image.Resampling.NEAREST)
    return Image.blend(canvas, heat, alpha)


def heatmap_overlay(image: Image.Image, relevance: MapLike, saccades: CellsLike = (),
                    alpha: float = 0.5, numbered: int = TOP_LABELS, second: CellsLike = (),
                    key: bool = True) -> Image.Image:
    """
    The relevance map blended over the image (heat_canvas), and the saccades, whose (row, col) are cells of the
    relevance map's grid, as boxes coloured by rank, the first `numbered` of them numbered; with `key`, a colour
    bar of the relevance and one of the ranks' colours below (with_key). `second`: a second fixation's saccades,
    boxes in SECOND_LOOK, said in a legend below.
    """
    out, shape, cells = heat_canvas(image, relevance, alpha), as_map(relevance).shape, as_cells(saccades)
    skipped_note(out, draw_saccades(out, cells, shape, numbered))
    second = as_cells(second)
    if second:
        draw_boxes(out, second, shape, SECOND_LOOK)  # as thin as the first look's boxes: they never share a cell
    out = with_key(out, len(cells)) if key else out
    return with_legend(out, SECOND_LOOK_LEGEND) if second else out


def key_geometry(width: int) -> tuple[int, int, int, int, int]:
    """with_key's strip for a canvas `width` px wide: (font size, strip height, bars' top, bar height, bar width);
    the relevance bar starts at KEY_BARS[0] of the width, the rank bar at KEY_BARS[1]."""
    size = max(12, width // 48)  # larger than with_legend's: a page's drawing is shown at a third of its size
    bar = round(size * 1.2)
    return size, round(size * 1.6) + bar + round(size * 0.6), round(size * 1.6), bar, round(width * KEY_BAR_SHARE)


def with_key(canvas: Image.Image, saccades: int) -> Image.Image:
    """
    The heatmap with its key on a white strip below it: a colour bar of HEAT_CMAP from the image's least relevant
    cell (0) to its most relevant (1), the map being min-max scaled, and, with saccades, a bar of RANK_CMAP from
    rank 1 (the most relevant, also ringed in white) to rank `saccades`: the boxes' colours.
    """
    size, height, top, bar, length = key_geometry(canvas.width)
    out = Image.new("RGB", (canvas.width, canvas.height + height), "white")
    out.paste(canvas, (0, 0))
    draw, text, y = ImageDraw.Draw(out), font(size), canvas.height + top
    bars = [(HEAT_CMAP, "relevance, min-max scaled", "0 low", "1 high")]
    if saccades:
        bars.append((RANK_CMAP, "saccade box by rank (1: white ring)", "1", str(saccades)))
    for start, (cmap, title, low, high) in zip(KEY_BARS, bars):
        x = round(canvas.width * start)
        gradient = colourise(np.linspace(0.0, 1.0, length)[None], cmap)  # [1, length]: one pixel a step
        out.paste(gradient.resize((length, bar), Image.Resampling.NEAREST), (x, y))
        draw.text((x, canvas.height + top // 2), title, font=text, anchor="lm", fill="black")
        draw.text((x - 4, y + bar / 2), low, font=text, anchor="rm", fill="black")
        draw.text((x + length + 4, y + bar / 2), high, font=text, anchor="lm", fill="black")
    return out


def draw_boxes(canvas: Image.Image, cells: list[tuple[int, int]], grid: tuple[int, int], colour: tuple) -> None:
    """Unnumbered boxes of one colour around cells of `grid`, as thin as draw_saccades' for the same cell size."""
    draw, cell = ImageDraw.Draw(canvas), min(canvas.width / grid[1], canvas.height / grid[0])  # px per cell side
    for r, c in cells:
        draw.rectangle(cell_rect(r, c, grid, canvas.size), outline=colour, width=max(1, round(cell / 16)))


def draw_kept(canvas: Image.Image, cells: list[tuple[int, int]], grid: tuple[int, int],
              merged: list[tuple[int, int]] = ()) -> None:
    """A reducer's kept cells as draw_saccades boxes ARR's (the same line for the same cell size), in one colour
    since a reducer does not rank them; the merged ones (VisionZip's context tokens) shaded under their box."""
    if merged:
        shade = Image.new("RGBA", canvas.size, (0, 0, 0, 0))
        fill = ImageDraw.Draw(shade)
        for r, c in merged:
            fill.rectangle(cell_rect(r, c, grid, canvas.size), fill=MERGED_FILL)
        canvas.paste(Image.alpha_composite(canvas.convert("RGBA"), shade).convert("RGB"))
    draw_boxes(canvas, cells, grid, KEPT_COLOUR)


def kept_overlay(image: Image.Image, grid: tuple[int, int], kept: CellsLike, merged: CellsLike | None = None,
                 relevance: MapLike | None = None, name: str = "the baseline") -> Image.Image:
    """
    The cells a token reducer kept (positions on `grid`, the native view's grid), boxed over the image, or over
    ARR's relevance map when one is given (the Microscope), at heatmap_overlay's size, so its selection and
    ARR's saccades can be compared by eye; VisionZip's merged context cells shaded; a legend underneath.
    """
    canvas = heat_canvas(image, relevance)
    cells, context = as_cells(kept), as_cells(merged if merged is not None else ())
    draw_kept(canvas, cells, grid, context)
    legend = f"{name}: the {len(cells)} cells its LLM read (cyan boxes)"
    if context:
        legend += f", of which {len(context)} hold merged context (shaded orange)"
    return with_legend(canvas, legend + (" · over ARR's relevance" if relevance is not None else ""))


def saccade_mosaic(highres: Image.Image, grid: tuple[int, int], saccades: CellsLike, numbered: int = TOP_LABELS,
                   scale: int = MOSAIC_SCALE, gap: int = MOSAIC_GAP, cols: int | None = None) -> Image.Image:
    """
    The selected cells of the high-res (candidate) view, cropped and tiled in rank order (rank 1 top-left,
    row by row, ceil(sqrt(K)) columns unless `cols` says), each upscaled `scale`x with nearest neighbours:
    exactly the pixels the vision tower encoded for the saccade block, beside the gestalt. The first
    `numbered` tiles carry their rank on a band above their tile (mosaic_band high, in the rows that hold them), so
    no number covers a pixel the ViT read.
    """
    cells = as_cells(saccades)
    view = to_rgb(highres)
    cols = cols or max(1, math.ceil(math.sqrt(len(cells))))
    rows = max(1, math.ceil(len(cells) / cols))
    rects = [cell_rect(r, c, grid, view.size) for r, c in cells]
    tile_w = max((x1 - x0 + 1 for x0, _, x1, _ in rects), default=round(view.width / grid[1])) * scale
    tile_h = max((y1 - y0 + 1 for _, y0, _, y1 in rects), default=round(view.height / grid[0])) * scale
    shown = min(len(cells), max(0, int(numbered)))
    band, banded = mosaic_band(tile_h), math.ceil(shown / cols)  # the rows whose tiles carry a number get a band
    out = Image.new("RGB", (cols * tile_w + (cols + 1) * gap, rows * tile_h + (rows + 1) * gap + banded * band),
                    MOSAIC_BACKGROUND)
    for k, (x0, y0, x1, y1) in enumerate(rects):
        tile = view.crop((x0, y0, x1 + 1, y1 + 1)).resize((tile_w, tile_h), Image.Resampling.NEAREST)
        out.paste(tile, mosaic_origin(k, cols, (tile_w, tile_h), gap, band, banded))
    draw, numbers = ImageDraw.Draw(out), font(band - 2)
    for k in range(shown):
        x, y = mosaic_origin(k, cols, (tile_w, tile_h), gap, band, banded)
        draw_rank(draw, (x + 2, y - band / 2), k + 1, numbers, anchor="lm")
    return out


def mosaic_band(tile_h: int) -> int:
    """The height in px of the band above a row of numbered mosaic tiles: a number about 0.28 of a tile high."""
    return max(12, round(tile_h * 0.28)) + 2


def mosaic_origin(k: int, cols: int, tile: tuple[int, int], gap: int, band: int = 0, banded: int = 0) -> tuple[int, int]:
    """Top-left pixel of the k-th (0-based) tile of a saccade mosaic whose first `banded` rows have a band `band` px
    high above their tiles (the rank numbers')."""
    row, col = divmod(k, cols)
    return gap + col * (tile[0] + gap), gap + row * (tile[1] + gap) + band * min(row + 1, banded)


def difference_map(rel_a: MapLike, rel_b: MapLike, saccades_a: CellsLike = (),
                   saccades_b: CellsLike = ()) -> Image.Image:
    """
    B - A of the two min-max scaled maps (checkpoints may score on different scales, and selection only
    depends on order), red where B finds a cell more relevant, blue where A does; A's saccades are black
    squares, B's green dots, with a legend underneath.
    """
    a, b = normalise(as_map(rel_a)), normalise(as_map(rel_b))
    if a.shape != b.shape:
        raise ValueError(f"the maps have different grids: {a.shape} and {b.shape}")
    gh, gw = a.shape
    size = canvas_size(gw, gh)
    canvas = colourise(b - a, DIFF_CMAP, -1.0, 1.0).resize(size, Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(canvas)
    cell = min(size[0] / gw, size[1] / gh)
    inset = max(1, round(cell / 6))
    for r, c in as_cells(saccades_a):
        x0, y0, x1, y1 = cell_rect(r, c, a.shape, size)
        draw.rectangle((x0 + inset, y0 + inset, x1 - inset, y1 - inset), outline=A_MARK, width=max(1, round(cell / 12)))
    dot = max(1, round(cell / 6))
    for r, c in as_cells(saccades_b):
        x0, y0, x1, y1 = cell_rect(r, c, a.shape, size)
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        draw.ellipse((cx - dot, cy - dot, cx + dot, cy + dot), fill=B_MARK)
    return with_legend(canvas, "red: B more relevant · blue: A more relevant · black squares: A's saccades · "
                               "green dots: B's saccades")


def moves_overlay(image: Image.Image, grid: tuple[int, int], new: CellsLike, kept: CellsLike, dropped: CellsLike,
                  relevance: MapLike | None = None, turn: int = 2) -> Image.Image:
    """How a conversation's saccades moved at turn `turn`: the cells new in it, those the turn before also read,
    and those it no longer reads, boxed in MOVE_COLOURS over the image (or this turn's relevance), with a legend."""
    canvas = heat_canvas(image, relevance)
    cells = {"new": as_cells(new), "kept": as_cells(kept), "dropped": as_cells(dropped)}
    for name, colour in MOVE_COLOURS.items():
        draw_boxes(canvas, cells[name], grid, colour)
    return with_legend(canvas, f"turn {turn} against turn {turn - 1}: {len(cells['new'])} cells new (green), "
                               f"{len(cells['kept'])} kept (cyan), {len(cells['dropped'])} dropped (red)")


def with_legend(canvas: Image.Image, text: str) -> Image.Image:
    """The canvas with the text on a white strip below it, wrapped to the canvas's width (a portrait map is narrow)."""
    text_font = font(max(11, canvas.width // 70))
    measure = ImageDraw.Draw(canvas)
    lines = [""]
    for word in text.split(" "):
        wider = f"{lines[-1]} {word}" if lines[-1] else word
        if lines[-1] and measure.textlength(wider, font=text_font) > canvas.width - 16:
            lines.append(word)
        else:
            lines[-1] = wider
    step = round(text_font.size * 1.4)
    out = Image.new("RGB", (canvas.width, canvas.height + step * len(lines) + text_font.size // 2), "white")
    out.paste(canvas, (0, 0))
    draw = ImageDraw.Draw(out)
    for i, line in enumerate(lines):
        draw.text((8, canvas.height + step * i + step / 2 + text_font.size // 4), line, font=text_font, anchor="lm",
                  fill="black")
    return out


def on_grid(values: MapLike, grid: tuple[int, int]) -> np.ndarray:
    """A map as a distribution over the cells of `grid` (resampled bilinearly where its own grid differs, clipped
    at 0), summing to 1 -> [gh, gw]."""
    a = np.clip(as_map(values), 0, None)
    if a.shape != tuple(grid):
        t = torch.nn.functional.interpolate(torch.from_numpy(a)[None, None], size=tuple(grid), mode="bilinear",
                                            align_corners=False)
        a = np.clip(t[0, 0].numpy(), 0, None)
    total = a.sum()
    return a / total if total > 0 else np.full(grid, 1.0 / (grid[0] * grid[1]))


def box_mass(distribution: np.ndarray, box, image_size: tuple[int, int]) -> float:
    """A distribution's mass [gh, gw] on the cells a pixel box (x0, y0, x1, y1) of an image (width, height) touches."""
    return float(distribution[box_coverage(box, image_size, distribution.shape).numpy() > 0].sum())


def teacher_comparison(image: Image.Image, teacher: MapLike, relevance: MapLike, box=None,
                       saccades: CellsLike = ()) -> Image.Image:
    """
    Where the model looks when it reads everything (the teacher's map, arr_coc.distill) beside where ARR looked (its
    relevance, with its saccades), and their overlap: both as distributions on the relevance map's grid, the
    overlap their cellwise minimum, whose sum (1: the same map, 0: disjoint) the legend says. The asked box, where
    the page has one (x0, y0, x1, y1 px of the image), is drawn on each panel and each map's mass on its cells said.
    """
    grid = as_map(relevance).shape
    t, r = on_grid(teacher, grid), on_grid(relevance, grid)
    overlap = np.minimum(t, r)
    panels = [heat_canvas(image, teacher), heatmap_overlay(image, relevance, saccades, numbered=0, key=False),
              heat_canvas(image, overlap)]
    titles = ["teacher: where the model looks", "ARR: relevance and saccades", "overlap: min of the two"]
    if box is not None:
        for panel in panels:
            sx, sy = panel.width / image.width, panel.height / image.height
            ImageDraw.Draw(panel).rectangle((box[0] * sx, box[1] * sy, box[2] * sx - 1, box[3] * sy - 1),
                                            outline=(0, 255, 0), width=max(2, panel.width // 300))
        titles = [f"{title} ({box_mass(m, box, image.size):.2f} in the box)"
                  for title, m in zip(titles, (t, r, overlap))]
    titled = [with_legend(panel, title) for panel, title in zip(panels, titles)]
    out = Image.new("RGB", (sum(p.width for p in titled) + 8 * (len(titled) - 1), max(p.height for p in titled)),
                    "white")
    for i, panel in enumerate(titled):
        out.paste(panel, (i * (panel.width + 8), 0))
    legend = f"overlap {overlap.sum():.2f} (the sum of the cellwise minimum of the two maps, each summing to 1)"
    return with_legend(out, legend + ("; green: the asked box" if box is not None else ""))


# ----------------------------------------------------------------------------- charts


def map_grid(panels: Sequence[tuple[str, MapLike]], cols: int, vrange: tuple[float, float] | None = None,
             colorbar: bool = False, cmap: str = "viridis") -> Image.Image:
    """Titled maps in a grid of `cols` columns; one shared colour range (`vrange`) or one per map (with colour bars)."""
    maps = [as_map(m) for _, m in panels]
    lo, hi = vrange or (None, None)  # None: each map spans its own range
    rows = math.ceil(len(maps) / cols)
    gh, gw = maps[0].shape
    panel = 2.4  # inches per panel side
    fig = Figure(figsize=(cols * panel, rows * (panel * gh / gw + 0.35)), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (title, _), values in zip(axes, panels, maps):
        im = ax.imshow(values, cmap=cmap, vmin=lo, vmax=hi, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        if colorbar:
            fig.colorbar(im, ax=ax, shrink=0.8)
    for ax in axes[len(maps):]:  # the grid's unused places
        ax.set_axis_off()
    return render(fig)


def channel_grid(textures: MapLike, channels: Sequence[tuple[str, str]] = CHANNELS) -> Image.Image:
    """The texture array [13, gh, gw] (or [1, 13, gh, gw]) as numbered, named panels on one [0, 1] scale."""
    t = as_array(textures)
    t = t[0] if t.ndim == 4 and t.shape[0] == 1 else t
    if t.ndim != 3 or t.shape[0] != len(channels):
        raise ValueError(f"expected textures [{len(channels)}, gh, gw], got shape {t.shape}")
    panels = [(f"{i}: {name}", values) for i, ((name, _), values) in enumerate(zip(channels, t))]
    return map_grid(panels, cols=5, vrange=(0.0, 1.0))


def scorer_panels(out, index: int = 0) -> list[tuple[str, torch.Tensor]]:
    """(title, map) of the scorer maps (config.SCORERS), titled with their balancer weights, the prior and the
    relevance."""
    weights = out.weights[index].tolist()
    panels = [(f"{name} (w={w:.2f})", m) for name, w, m in zip(scorer_names(), weights, out.scorers[index])]
    if out.participatory_prior is not None:
        panels.append(("participatory prior\n(gestalt attention)", out.participatory_prior[index]))
    panels.append(("balanced relevance", out.relevance[index]))
    return panels


def scorer_maps(out, index: int = 0) -> Image.Image:
    """The scorer maps, the participatory prior and the balanced relevance of one ARRCOCOutput image, in a row."""
    panels = scorer_panels(out, index)
    return map_grid(panels, cols=len(panels), colorbar=True)


def weights_bar(weights: MapLike | Sequence[float], shares: MapLike | Sequence[float] | None = None,
                agreement: float | None = None) -> Image.Image:
    """
    Horizontal bars of the balancer weights (information, perspectival, participatory) on a 0..1 axis. With
    `shares` (ARRCOCOutput.shares), a second chart beside it: each map's share of the selected saccades' relevance,
    which tells the scorers apart where the weights do not (a trained balancer may give all three the same weight:
    the chart then says so), and under it the maps' `agreement` (ARRCOCOutput.agreement: maps that agree share alike).
    """
    w, names = as_array(weights).ravel(), scorer_names()
    colours = [SCORER_COLOURS[i % len(SCORER_COLOURS)] for i in range(len(names))]
    if w.size != len(names):
        raise ValueError(f"expected {len(names)} weights, got {w.size}")
    share = None if shares is None else as_array(shares).ravel()
    if share is not None and share.size != len(names):
        raise ValueError(f"expected {len(names)} shares, got {share.size}")
    fig = Figure(figsize=(4.8 if share is None else 9.6, 1.9 if agreement is None else 2.2), dpi=DPI,
                 layout="constrained")
    axes = fig.subplots(1, 1 if share is None else 2, squeeze=False)[0]
    ax = axes[0]
    ax.barh(names, w, color=colours)
    ax.invert_yaxis()  # information on top, as in the scorer maps
    ax.set_xlim(0, max(1.0, float(w.max()) * 1.15))  # sigmoid weights: a fixed 0..1 axis compares runs
    for y, v in enumerate(w):
        ax.text(v, y, f" {v:.2f}", va="center", fontsize=9)
    equal = float(w.max() - w.min()) < EQUAL_WEIGHTS
    ax.set_title("balancer weights" + (": about equal, so the maps are summed alike" if equal else ""), fontsize=10)
    if share is None:
        return render(fig)
    ax = axes[1]
    ax.barh(names, share, color=colours)
    ax.invert_yaxis()
    ax.set_xlim(min(0.0, float(share.min()) * 1.3), max(1.0, float(share.max()) * 1.3))
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks([])
    for y, v in enumerate(share):
        ax.text(max(float(v), 0.0), y, f" {v:.0%}", va="center", fontsize=9)
    ax.set_title("share of the saccades' relevance", fontsize=10)
    if agreement is not None:
        ax.set_xlabel(f"the maps' mean correlation: {agreement:.2f} (1: one map three times)", fontsize=9)
    return render(fig)


def faithfulness_chart(fractions: Sequence[float], curves: dict[str, Sequence[float]], title: str) -> Image.Image:
    """
    Log-likelihood curves (arr_coc.eval.faithfulness: deletion, random, insertion) over the fraction of saccades
    removed or inserted, with their areas in the legend.
    """
    fig = Figure(figsize=(6.4, 3.6), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for name, values in curves.items():
        colour, line = FAITHFULNESS_STYLES[name]
        area = float(np.trapezoid(values, fractions))
        ax.plot(fractions, values, line, color=colour, marker="o", markersize=3, label=f"{name} (area {area:.3f})")
    ax.set_xlabel("fraction of saccades removed (deletion, random) or inserted (insertion)")
    ax.set_ylabel("answer log-likelihood / token")
    ax.set_xlim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(textwrap.shorten(title, FAITHFULNESS_TITLE_CHARS, placeholder=" …"), fontsize=10)  # long answers
    return render(fig)


# ----------------------------------------------------------------------------- agreement of two selections


def saccade_overlap(saccades_a: CellsLike, saccades_b: CellsLike) -> float:
    """Intersection over union of two sets of selected cells (two empty sets are identical: 1)."""
    a, b = set(as_cells(saccades_a)), set(as_cells(saccades_b))
    return len(a & b) / len(a | b) if a | b else 1.0


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of a 1-D array, tied values sharing the mean of their ranks."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # the highest rank of each distinct value
    return (last - (counts - 1) / 2)[inverse]


def rank_correlation(rel_a: MapLike, rel_b: MapLike) -> float:
    """Spearman correlation of two maps over their cells; NaN if either is flat or not finite (undefined)."""
    a, b = as_map(rel_a).ravel(), as_map(rel_b).ravel()
    if a.shape != b.shape:
        raise ValueError(f"the maps have different sizes: {a.size} and {b.size} cells")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denominator) if denominator > 0 else float("nan")


# ----------------------------------------------------------------------------- files


def save_all(result, folder: str | Path, image: Image.Image | None = None,
             numbered: int = TOP_LABELS) -> list[Path]:
    """
    An ARR Answer (or an ARRCOCOutput plus its image) -> heatmap.png, mosaic.png (an Answer only: the mosaic
    needs its high-res view), channels.png, scorers.png in `folder`. The image defaults to the answer's own;
    returns the written paths.
    """
    out = getattr(result, "arr", result)
    if out is None:
        raise ValueError(f"the {result.pipeline} pipeline has no ARR output to draw; use pipeline='arr'")
    views = getattr(result, "views", None)
    if image is None:
        if views is None:
            raise ValueError("save_all needs the image to draw an ARRCOCOutput over")
        image = views.image
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fixations = getattr(result, "fixations", [])
    second = fixations[1].arr.positions[0] if len(fixations) > 1 else ()  # a second look's saccades, in green
    ranked = out.in_order("relevance").positions[0]  # numbered most relevant first, whatever order they were fed in
    drawings = {"heatmap.png": heatmap_overlay(image, out.relevance[0], ranked, numbered=numbered, second=second)}
    if views is not None:
        drawings["mosaic.png"] = saccade_mosaic(views.highres, views.candidate_grid, ranked, numbered)
    drawings.update({"channels.png": channel_grid(out.textures[0]), "scorers.png": scorer_maps(out)})
    paths = []
    for name, drawing in drawings.items():
        drawing.save(folder / name)
        paths.append(folder / name)
    return paths
