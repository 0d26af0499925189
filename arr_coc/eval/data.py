"""
Datasets for ARR-COC: a synthetic scene generator and a JSONL format for (image, question, answer, box).

A Sample is one image with one question about it, the expected answer, and the pixel box of the region
the question is about (None where no region is). The synthetic kinds are built to probe query-aware
token selection at native resolution (docs/ARCHITECTURE.md §1; any side works: each pipeline resizes to
its model's grids):

    text_vs_distractor  low-contrast gray text + a bright saturated shape; the question asks for the text
    distractor_query    the SAME image as text_vs_distractor with the same seed; the question asks for the
                        shape's colour. Pairs like this force a learned scorer to use the query.
    noise               uniform RGB noise, a "semantic void" (no box)
    chart               a matplotlib bar chart; the question asks for one named bar's value
    document            a dense page of small black text with one "Invoice total: NNNN" line
    fine_print, box_word, shape_colour
                        the fine-print suite (arr_coc.synth.fineprint) that the pocket model is trained on

Every scene is a pure function of (kind, seed, size).

A dataset on disk is a folder with images/ (PNG) and data.jsonl, one object per line:
    {"image": "images/000000_chart.png", "question": "...", "answer": "...", "box": [x0, y0, x1, y1] | null, "kind": "chart"}
Image paths are relative to the folder of data.jsonl. Boxes are half-open pixel boxes: a pixel (x, y) is
inside when x0 <= x < x1 and y0 <= y < y1, so image.crop(box) is exactly the region.

Run:
    python -m arr_coc.eval.data --out data/synth --n 200 --kinds text_vs_distractor,distractor_query --seed 0 --size 896
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from arr_coc import flags
from arr_coc.errors import InputError
from arr_coc.synth.families import FAMILIES, HELD_OUT, TRAINED, family_size, ink_cells, make_family_page
from arr_coc.synth.fineprint import LAYOUTS, PAGE_KINDS, SPEC, make_page
from arr_coc.vlm.images import open_image

Box = tuple[int, int, int, int]

IMAGE_NAME = re.compile(r"\d{6}_[A-Za-z0-9_-]+\.png")  # the name save_jsonl gives a sample's image under images/
SCENE_KINDS = ("text_vs_distractor", "distractor_query", "noise", "chart", "document", *PAGE_KINDS)


@dataclass
class Sample:
    image: Image.Image  # the picture, RGB
    question: str  # what the user asks about the image
    answer: str  # the expected answer, as text
    box: Box | None  # (x0, y0, x1, y1) half-open pixel box of the region the question is about; None if none
    kind: str  # scene kind (one of SCENE_KINDS) or a free label for real data
    family: str = ""  # a pocket page's layout family (arr_coc.synth.families), "" for the suite's own pages
    where: str = ""  # the data.jsonl line it was read from ("file:line"), "" for a generated scene


@dataclass(frozen=True)
class SceneStyle:
    background_gray: int = 128  # gray level of the text/distractor field
    text_gray: int = 110  # gray level of the low-contrast text (18 levels below the field)
    text_font: float = 0.032  # text/distractor font size as a fraction of the image side (~29 px at 896)
    min_font_px: int = 8  # smallest font in pixels, so small test images still get glyphs
    shape_radius: tuple[float, float] = (0.07, 0.13)  # distractor half-width range, fraction of the side
    margin: float = 0.04  # keep content this fraction of the side away from the edges and from each other
    doc_font: float = 0.0175  # document body font size as a fraction of the side (~16 px at 896)
    doc_line_pitch: float = 1.45  # document line pitch as a multiple of the font size


STYLE = SceneStyle()

# Bright, saturated distractor colours (max - min channel >= 180), by the name used as the answer.
DISTRACTOR_COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (235, 30, 30),
    "yellow": (250, 215, 0),
    "green": (30, 220, 60),
    "blue": (30, 90, 250),
    "magenta": (225, 40, 210),
    "orange": (255, 135, 0),
    "cyan": (0, 205, 230),
}

# Filler vocabulary. It must not contain "invoice" or "total", so the document target line is unique.
WORDS = (
    "amber anchor apple arrow autumn basket beacon birch blanket border bridge bronze cabin canvas "
    "carbon cedar chapter circle cloud copper corner cotton crystal delta desert harbor engine fabric "
    "falcon feather field forest garden glacier granite harvest hollow island ivory jacket journal "
    "kettle ladder lantern lemon marble meadow metal mirror morning motor needle north ocean orbit "
    "paper pencil pepper planet pocket quartz rabbit ribbon river rocket saddle salt silver signal "
    "spring stone summer tablet thunder timber tower travel tunnel valley velvet violet wagon window "
    "winter yellow zephyr report market shipping order account member office client review sample "
    "balance receipt supply service notice record ledger budget freight parcel vendor quarter"
).split()

CHART_LABELS = (
    "Apples", "Pears", "Plums", "Kiwis", "Mangos", "Grapes", "Lemons", "Limes", "Figs", "Dates",
    "Oslo", "Lima", "Quito", "Perth", "Turin", "Dakar", "Hanoi", "Porto", "Cairo", "Delhi",
)
CHART_TITLES = ("Units sold", "Monthly orders", "Survey votes", "Stock on hand", "Visitors (thousands)")


# -----------------------------------------------------------------------------
# helpers


def _rng(name: str, seed: int) -> random.Random:
    """A deterministic RNG for one generator and seed (string seeds hash with SHA-512, stable across runs)."""
    return random.Random(f"arr_coc:{name}:{int(seed)}")


@lru_cache(maxsize=64)
def _font(px: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's bundled scalable font at `px` pixels (Pillow >= 10.1); the fixed bitmap font on older Pillow."""
    try:
        return ImageFont.load_default(size=px)
    except TypeError:  # Pillow < 10.1 has no size argument
        return ImageFont.load_default()


def _word(rng: random.Random) -> str:
    """One filler token: mostly a word, sometimes a number."""
    return str(rng.randint(2, 999)) if rng.random() < 0.18 else rng.choice(WORDS)


def _place_text(draw: ImageDraw.ImageDraw, text: str, font, left: int, top: int, fill, size: int) -> Box:
    """Draw `text` so that its ink box starts at (left, top); return the ink box clipped to the size x size image."""
    l, t, _, _ = draw.textbbox((0, 0), text, font=font)
    xy = (left - l, top - t)
    draw.text(xy, text, font=font, fill=fill)
    return _clip_box(draw.textbbox(xy, text, font=font), size, size)


def _overlaps(a: Box, b: Box, gap: int = 0) -> bool:
    """True if boxes a and b, with b grown by `gap` on every side, intersect."""
    return a[0] < b[2] + gap and b[0] - gap < a[2] and a[1] < b[3] + gap and b[1] - gap < a[3]


def _clip_box(box: Sequence[float], w: int, h: int) -> Box:
    """Round a float box outwards to whole pixels and clip it to a w x h image."""
    x0, y0, x1, y1 = box
    return (max(0, math.floor(x0)), max(0, math.floor(y0)), min(w, math.ceil(x1)), min(h, math.ceil(y1)))


# -----------------------------------------------------------------------------
# scene generators


def _text_and_shape_scene(seed: int, size: int) -> dict:
    """Gray field with a low-contrast text line and a bright saturated disc or square that does not touch it."""
    s, rng = STYLE, _rng("text_and_shape", seed)
    img = Image.new("RGB", (size, size), (s.background_gray,) * 3)
    draw = ImageDraw.Draw(img)
    margin = max(2, round(s.margin * size))
    font = _font(max(s.min_font_px, round(s.text_font * size)))

    # the text: 3-5 tokens, dropped from the end until the line fits in 60% of the width
    tokens = [_word(rng) for _ in range(rng.randint(3, 5))]
    while len(tokens) > 1 and draw.textlength(" ".join(tokens), font=font) > 0.6 * size:
        tokens.pop()
    text = " ".join(tokens)
    l, t, r, b = draw.textbbox((0, 0), text, font=font)
    left = rng.randint(margin, max(margin, size - margin - (r - l)))
    top = rng.randint(margin, max(margin, size - margin - (b - t)))
    text_box = _place_text(draw, text, font, left, top, (s.text_gray,) * 3, size)

    # the distractor: rejection-sample a spot at least `margin` away from the text
    colour = rng.choice(sorted(DISTRACTOR_COLOURS))
    shape = rng.choice(("disc", "square"))
    half = round(rng.uniform(*s.shape_radius) * size)
    lo, hi = margin + half, size - margin - half
    for _ in range(1000):
        cx, cy = rng.randint(lo, hi), rng.randint(lo, hi)
        shape_box = (cx - half, cy - half, cx + half, cy + half)
        if not _overlaps(shape_box, text_box, margin):
            break
    else:  # cannot happen for size >= 64 with the default style, but stay correct anyway
        above = text_box[1] > size - text_box[3]
        cy = (text_box[1] // 2) if above else (text_box[3] + size) // 2
        cx = size // 2
        shape_box = (cx - half, cy - half, cx + half, cy + half)
    inclusive = [shape_box[0], shape_box[1], shape_box[2] - 1, shape_box[3] - 1]
    fill = DISTRACTOR_COLOURS[colour]
    (draw.ellipse if shape == "disc" else draw.rectangle)(inclusive, fill=fill)
    return dict(image=img, text=text, text_box=text_box, colour=colour, shape=shape, shape_box=shape_box)


def _text_vs_distractor(seed: int, size: int) -> Sample:
    scene = _text_and_shape_scene(seed, size)
    return Sample(scene["image"], "What does the gray text say?", scene["text"], scene["text_box"], "text_vs_distractor")


def _distractor_query(seed: int, size: int) -> Sample:
    scene = _text_and_shape_scene(seed, size)
    return Sample(scene["image"], "What colour is the bright shape?", scene["colour"], scene["shape_box"], "distractor_query")


def _noise(seed: int, size: int) -> Sample:
    rng = np.random.default_rng(_rng("noise", seed).getrandbits(64))
    pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    return Sample(Image.fromarray(pixels, "RGB"), "What is in this image?", "noise", None, "noise")


def _chart(seed: int, size: int) -> Sample:
    """A bar chart with value labels; the box is the asked bar plus its value label, in image pixels."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rng = _rng("chart", seed)
    n = rng.randint(4, 7)
    labels = rng.sample(CHART_LABELS, n)
    values = [rng.randint(5, 95) for _ in range(n)]
    target = rng.randrange(n)
    palette = matplotlib.colormaps["tab10"].colors
    start = rng.randrange(len(palette))
    colours = [palette[(start + i) % len(palette)] for i in range(n)]
    fs = max(4.0, 13.0 * size / 896)  # font size in points; the figure is size/100 inches at 100 dpi

    fig = Figure(figsize=(size / 100, size / 100), dpi=100, facecolor="white")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    bars = ax.bar(range(n), values, color=colours, width=0.65)
    ax.set_xticks(range(n), labels, fontsize=fs)
    ax.tick_params(axis="y", labelsize=fs)
    ax.set_ylim(0, 110)
    ax.set_title(rng.choice(CHART_TITLES), fontsize=fs * 1.2)
    ax.spines[["top", "right"]].set_visible(False)
    value_texts = ax.bar_label(bars, fontsize=fs)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.1, top=0.9)
    canvas.draw()

    rgba = np.asarray(canvas.buffer_rgba())
    h, w = rgba.shape[:2]
    renderer = canvas.get_renderer()
    bar = bars[target].get_window_extent(renderer)
    label = value_texts[target].get_window_extent(renderer)
    # display coordinates have y up from the bottom; image pixels have y down from the top
    x0, x1 = min(bar.x0, label.x0), max(bar.x1, label.x1)
    y0, y1 = h - max(bar.y1, label.y1), h - min(bar.y0, label.y0)
    image = Image.fromarray(np.ascontiguousarray(rgba[..., :3]), "RGB")
    if image.size != (size, size):  # guard against float rounding of figsize * dpi
        sx, sy = size / w, size / h
        image = image.resize((size, size), Image.BICUBIC)
        x0, x1, y0, y1 = x0 * sx, x1 * sx, y0 * sy, y1 * sy
    box = _clip_box((x0, y0, x1, y1), size, size)
    question = f"What is the value of the {labels[target]} bar?"
    return Sample(image, question, str(values[target]), box, "chart")


def _document(seed: int, size: int) -> Sample:
    """A dense page of small black text; one line says 'Invoice total: NNNN', another is a number decoy."""
    s, rng = STYLE, _rng("document", seed)
    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    px = max(s.min_font_px, round(s.doc_font * size))
    font = _font(px)
    pitch = max(px + 1, round(px * s.doc_line_pitch))
    margin = max(2, round(0.06 * size))
    width = size - 2 * margin
    n_lines = max(3, (size - 2 * margin) // pitch)

    total = rng.randint(1000, 9999)
    target, decoy = rng.sample(range(2, n_lines), 2) if n_lines > 3 else (n_lines - 1, 1)
    box = None
    for i in range(n_lines):
        if i == target:
            text = f"Invoice total: {total}"
        elif i == decoy:
            text = f"Invoice no. {rng.randint(10000, 99999)}   Account {rng.randint(100, 999)}"
        elif i == 0:
            text = " ".join(w.capitalize() for w in rng.sample(WORDS, 3))
        elif rng.random() < 0.07:
            continue  # paragraph break
        else:
            line_width, tokens = rng.uniform(0.6, 1.0) * width, []
            while True:
                candidate = tokens + [_word(rng)]
                if tokens and draw.textlength(" ".join(candidate), font=font) > line_width:
                    break
                tokens = candidate
            text = " ".join(tokens)
        line_box = _place_text(draw, text, font, margin, margin + i * pitch, (0, 0, 0), size)
        if i == target:
            box = line_box
    return Sample(img, "What is the invoice total?", str(total), box, "document")


def _fine_print_suite(kind: str):
    """A fine-print page (arr_coc.synth.fineprint, the pocket model's suite) with one of its questions, chosen by the
    seed; in the suite's layouts (SPEC) or in those pocket training never draws (LAYOUTS)."""
    def generate(seed: int, size: int, style=SPEC) -> Sample:
        page = make_page(kind, seed, size, style=style)
        q = _rng(kind, seed).choice(page.questions)
        return Sample(page.image, q.question, q.answer, q.box, kind)
    return generate


_GENERATORS = {
    "text_vs_distractor": _text_vs_distractor,
    "distractor_query": _distractor_query,
    "noise": _noise,
    "chart": _chart,
    "document": _document,
    **{kind: _fine_print_suite(kind) for kind in PAGE_KINDS},
}
assert tuple(_GENERATORS) == SCENE_KINDS


FAMILY_GROUPS = {"trained": TRAINED, "held-out": HELD_OUT}  # --families also takes these names


def family_names(text: str) -> tuple[str, ...]:
    """'slide,box_grid' or 'held-out' (or 'trained') -> the layout families it names, in order."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    out = [f for n in names for f in FAMILY_GROUPS.get(n, (n,))]
    if bad := [f for f in out if f not in FAMILIES]:
        raise ValueError(f"unknown layout famil{'y' if len(bad) == 1 else 'ies'} {', '.join(bad)}; expected some of "
                         f"{', '.join([*FAMILY_GROUPS, *FAMILIES])}")
    return tuple(dict.fromkeys(out))


def families_flag(text: str) -> tuple[str, ...]:
    """An argparse type: family_names, its error in argparse's words."""
    try:
        return family_names(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _family_scene(kind: str, seed: int, size: int, families: tuple[str, ...]) -> Sample:
    """A pocket page of `kind` on one of `families` that carries it (by seed), about size^2 px in its aspect."""
    carrying = [f for f in families if kind in FAMILIES[f].kinds]
    if not carrying:
        raise ValueError(f"none of the layout families {', '.join(families)} carries {kind}")
    family = carrying[seed % len(carrying)]
    page = make_family_page(family, kind, seed, *family_size(family, seed, size))
    q = _rng(f"{family}:{kind}", seed).choice(page.questions)
    return Sample(page.image, q.question, q.answer, q.box, kind, family)


def make_scene(kind: str, seed: int, size: int = 896, held_out_layouts: bool = False,
               families: tuple[str, ...] = ()) -> Sample:
    """One synthetic sample of `kind`, a pure function of (kind, seed, size). The image is size x size RGB.
    held_out_layouts: a pocket page (PAGE_KINDS) in the layouts pocket training never draws (fineprint.LAYOUTS).
    families: a pocket page drawn by one of these layout families (synth/families.py) instead, of about size^2 px
    in the family's own aspect."""
    if families:
        if kind not in PAGE_KINDS:
            raise ValueError(f"layout families draw the pocket suite ({', '.join(PAGE_KINDS)}), not {kind!r}")
        return _family_scene(kind, seed, size, families)
    if kind not in _GENERATORS:
        raise ValueError(f"unknown scene kind {kind!r}; expected one of {', '.join(SCENE_KINDS)}")
    if size < 64:
        raise ValueError(f"size must be at least 64 px, got {size}")
    if held_out_layouts:
        if kind not in PAGE_KINDS:
            raise ValueError(f"held-out layouts are the pocket suite's ({', '.join(PAGE_KINDS)}), not {kind!r}'s")
        return _GENERATORS[kind](seed, size, LAYOUTS)
    return _GENERATORS[kind](seed, size)


def iter_dataset(n: int, kinds: Sequence[str] = ("text_vs_distractor", "distractor_query"),
                 seed: int = 0, size: int = 896, held_out_layouts: bool = False,
                 families: tuple[str, ...] = ()) -> Iterator[Sample]:
    """Yield n samples, cycling through `kinds`. Sample i uses scene seed seed * 1_000_003 + i // len(kinds),
    so consecutive samples of different kinds share a scene seed: with the default kinds each image comes
    twice, once with a text question and once with a colour question. held_out_layouts, families: make_scene's."""
    kinds = tuple(kinds)
    if not kinds:
        raise ValueError("kinds must not be empty")
    bad = [k for k in kinds if k not in SCENE_KINDS]
    if bad:
        raise ValueError(f"unknown scene kind(s) {bad}; expected some of {', '.join(SCENE_KINDS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    for i in range(n):
        yield make_scene(kinds[i % len(kinds)], seed * 1_000_003 + i // len(kinds), size, held_out_layouts, families)


def make_dataset(n: int, kinds: Sequence[str] = ("text_vs_distractor", "distractor_query"),
                 seed: int = 0, size: int = 896, held_out_layouts: bool = False,
                 families: tuple[str, ...] = ()) -> list[Sample]:
    """A list of n synthetic samples (see iter_dataset for the seeding, held_out_layouts and families)."""
    return list(iter_dataset(n, kinds, seed, size, held_out_layouts, families))


# -----------------------------------------------------------------------------
# JSONL on disk


def save_jsonl(samples: Iterable[Sample], folder: str | Path) -> Path:
    """Write samples as folder/images/NNNNNN_<kind>.png + folder/data.jsonl; return the jsonl path.
    Streams, so a generator of samples never has to fit in memory."""
    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    path = folder / "data.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i, sample in enumerate(samples):
            rel = f"images/{i:06d}_{re.sub(r'[^A-Za-z0-9_-]+', '_', sample.kind) or 'sample'}.png"  # IMAGE_NAME
            sample.image.convert("RGB").save(folder / rel)
            record = {
                "image": rel,
                "question": sample.question,
                "answer": sample.answer,
                "box": None if sample.box is None else [int(v) for v in sample.box],
                "kind": sample.kind,
                "ink_cells": ink_cells(sample.image),  # 28 px cells holding ink (synth.families.ink_cells)
                **({"family": sample.family} if sample.family else {}),
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def remove_stale_images(path: Path) -> None:
    """Remove the images of a dataset written before into path's folder (save_jsonl's names) that path's lines no
    longer name: after --overwrite, the folder holds the new set alone."""
    named = {json.loads(line)["image"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
    for image in (path.parent / "images").glob("*.png"):
        if IMAGE_NAME.fullmatch(image.name) and f"images/{image.name}" not in named:
            image.unlink()


def _parse_box(value, where: str) -> Box | None:
    if value is None:
        return None
    ok = isinstance(value, list) and len(value) == 4 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    if not ok:
        raise InputError(f"{where}: 'box' must be null or [x0, y0, x1, y1] numbers, got {value!r}")
    x0, y0, x1, y1 = (int(round(v)) for v in value)
    if not (x0 < x1 and y0 < y1):
        raise InputError(f"{where}: 'box' must have x0 < x1 and y0 < y1, got {value!r}")
    return (x0, y0, x1, y1)


def check_at(where: str, check: Callable[[str], str], question: str) -> str:
    """check(question) (a question check: arr_coc.pipelines.request.check_question, ARRCOCQwen.check_question), its
    InputError naming `where` first (a JSONL line, "file:line"; "" adds nothing)."""
    try:
        return check(question)
    except InputError as e:
        if not where:
            raise
        raise InputError(f"{where}: {e}") from None


def _parse_record(line: str, root: Path, where: str) -> Sample:
    """One jsonl line -> Sample; every problem is an InputError that starts with `where` (file:line)."""
    from arr_coc.pipelines.request import check_question  # here, not above: the commands parse without torch

    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from e
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in ("image", "question", "answer"):
        if not isinstance(record.get(key), str):
            raise InputError(f"{where}: missing or non-string {key!r}")
    check_at(where, check_question, record["question"])  # empty or too long: refused here, not in the middle of a run
    kind = record.get("kind", "unknown")
    if not isinstance(kind, str):
        raise InputError(f"{where}: 'kind' must be a string, got {kind!r}")
    box = _parse_box(record.get("box"), where)

    image_path = root / record["image"]
    if not image_path.is_file():
        raise InputError(f"{where}: image file not found: {image_path}")
    try:
        image = open_image(image_path).convert("RGB")
    except Exception as e:  # PIL raises several types for broken files
        raise InputError(f"{where}: cannot read image {image_path}: {e}") from e
    if box is not None:
        w, h = image.size
        if box[0] < 0 or box[1] < 0 or box[2] > w or box[3] > h:
            raise InputError(f"{where}: box {list(box)} lies outside the {w}x{h} image {image_path}")
    family = record.get("family", "")
    if not isinstance(family, str):
        raise InputError(f"{where}: 'family' must be a string, got {family!r}")
    return Sample(image, record["question"], record["answer"], box, kind, family, where)


def load_jsonl(path: str | Path) -> list[Sample]:
    """Read a data.jsonl (or a folder holding one). Image paths are relative to the jsonl's folder.
    Blank lines are skipped; a malformed line, a question the pipelines refuse (empty, over MAX_QUESTION_CHARS) or a
    missing image raises InputError naming file and line."""
    path = Path(path)
    if path.is_dir():
        path = path / "data.jsonl"
    if not path.is_file():
        raise InputError(f"no such dataset file: {path}")
    samples = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                samples.append(_parse_record(line, path.parent, f"{path}:{lineno}"))
    return samples


# -----------------------------------------------------------------------------
# CLI


@dataclass
class DataConfig:
    """`python -m arr_coc.eval.data`'s flags, each field one (arr_coc.flags.flag)."""
    out: str = flags.flag(None, "output folder (created if needed)", required=True)
    n: int = flags.flag(100, "number of samples to write", flags.bounded_int(0, 10_000_000))
    kinds: str = flags.flag("text_vs_distractor,distractor_query", "comma-separated scene kinds, cycled in order; any "
                            f"of: {','.join(SCENE_KINDS)}", flags.comma_list(SCENE_KINDS))
    seed: int = flags.seed_flag(0, "the dataset: the same seed gives the same dataset")
    size: int = flags.flag(896, "image side in pixels (the pipelines read it at its native resolution, capped at "
                                "max_cells)", flags.bounded_int(64, 8192))
    families: tuple[str, ...] = flags.flag((), "draw the pocket kinds on these layout families (comma-separated names, "
                                               f"or 'trained' / 'held-out'); any of: {','.join(FAMILIES)}",
                                           families_flag, shown="–")
    overwrite: bool = flags.flag(False, "write into --out even if it already holds files (e.g. another dataset): its "
                                        "data.jsonl is replaced, and the old set's images the new one lacks removed")


def main(argv: Sequence[str] | None = None) -> Path:
    parser = flags.config_parser(DataConfig, __doc__)
    args = flags.parse_config(DataConfig, argv, parser)
    if args.families and not set(flags.names(args.kinds)) <= set(PAGE_KINDS):
        parser.error(f"argument --families: layout families draw the pocket kinds ({','.join(PAGE_KINDS)}) only")
    if blocker := next((p for p in (Path(args.out), *Path(args.out).parents) if p.is_file()), None):
        parser.error(f"argument --out: {args.out} cannot be a folder: {blocker} is a file")
    flags.check_fresh_folder(parser, args.out, args.overwrite)

    kinds = tuple(flags.names(args.kinds))
    counts: Counter[str] = Counter()

    def counted(samples: Iterable[Sample]) -> Iterator[Sample]:
        for sample in samples:
            counts[sample.kind] += 1
            yield sample

    path = save_jsonl(counted(iter_dataset(args.n, kinds, args.seed, args.size, families=args.families)), args.out)
    remove_stale_images(path)
    summary = ", ".join(f"{k}={v}" for k, v in counts.items()) or "nothing"
    print(f"wrote {sum(counts.values())} samples ({summary}) at {args.size}px to {path}")
    return path


if __name__ == "__main__":
    main()
