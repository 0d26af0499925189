"""
The fine-print suite: procedural pages on which detail matters, for training and testing the pocket model.

Three kinds of page, each a pure function of (kind, seed, width, height, style), drawn with Pillow's bundled
font (`ImageFont.load_default(size=...)`) so every machine renders the same pixels:

    fine_print    8-32 fields "KEY: NNNN" in dark ink, font 10-17 px.  Q: What is the value of KEY?   A: NNNN
    box_word      3-8 rectangles with thick coloured borders, one small word in each.
                                                                      Q: What word is in the COLOUR box?  A: the word
    shape_colour  2-4 large filled shapes in distinct colours.        Q: What colour is the SHAPE?    A: the colour

Pages sit on a light background with faint rules and small gray filler text as clutter. The layouts vary
(scattered, tabular, columns, anywhere on the page) so that a model learns to read, not to memorise places.
Three more layouts are off in SPEC and on in LAYOUTS, the held-out style pocket training never draws: blocks of
filler turned by 15-90 degrees (stamps, margin notes), boxes standing in rows and grids, and lines of print
running under the shapes (the glyphs a shape covers are not recorded). Training draws its own variant of the
last: scattered KEY: NNNN fields under the shapes (`fields_under_shapes`).
A page carries every question it can answer (`Page.questions`), each with the box of its target; a Sample
(arr_coc.eval.data) is one of them. The print of the first two kinds is unreadable at the gestalt's view of a
1792 px page (a quarter of the native resolution: 2.5-4 px glyphs) and readable at native resolution.

`PageStyle` holds the ranges; `SPEC` is the suite as specified, and arr_coc.pocket.train trains through easier
styles first (larger glyphs, fewer fields, less clutter).

    python -m arr_coc.synth.fineprint --kind fine_print --seed 3 --size 896 --out /tmp/page.png   # draw one page
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache

from PIL import Image, ImageDraw, ImageFont

from arr_coc import flags

Box = tuple[int, int, int, int]

PAGE_KINDS = ("fine_print", "box_word", "shape_colour")

KEYS = ("TOTAL TAX DATE CODE ROOM GATE SEAT FLOOR PRICE WEIGHT HEIGHT WIDTH DEPTH SPEED POWER VOLTS ORDER BATCH "
        "SERIAL MODEL PAGE LINE ZONE UNIT LEVEL SCORE RANK COUNT LIMIT RATE CLASS TRACK").split()

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 160, 50), "blue": (30, 70, 220), "orange": (245, 140, 20),
    "purple": (140, 50, 180), "pink": (240, 100, 180), "brown": (130, 80, 30), "cyan": (20, 190, 210),
}

BOX_WORDS = ("apple river stone cloud tiger piano lemon cabin ocean maple robot candle garden rocket violet silver "
             "planet forest bridge castle dragon falcon harbor island jungle kettle ladder meadow needle orange "
             "pepper quartz saddle tunnel velvet walnut yellow zebra anchor basket copper desert engine feather "
             "glacier hammer mirror puzzle").split()

SHAPES = ("circle", "square", "triangle", "diamond")

# filler for the clutter: short lowercase syllables and numbers, never a KEY nor a box word
FILLER = ("lorem ipsum dolor sit amet ref no per via qty net sub memo item note copy rev ok see ps id acct "
          "misc ctr vol est tbd n/a dept attn").split()


@dataclass(frozen=True)
class PageStyle:
    """The ranges a page is drawn from (inclusive). SPEC is the suite as specified; training starts easier."""
    fields: tuple[int, int] = (8, 32)  # fine_print: how many "KEY: NNNN" fields
    field_font: tuple[int, int] = (10, 17)  # fine_print: font size in px (cap height ~7-12 px)
    boxes: tuple[int, int] = (3, 8)  # box_word: how many coloured boxes
    word_font: tuple[int, int] = (11, 17)  # box_word: font size of the word in a box
    border: tuple[int, int] = (4, 8)  # box_word: border width in px
    shapes: tuple[int, int] = (2, 4)  # shape_colour: how many shapes
    shape_size: tuple[float, float] = (0.15, 0.28)  # shape_colour: extent as a fraction of the page's short side
    clutter: float = 1.0  # density of filler text and rules (0 = a clean page)
    rotated: float = 0.0  # chance of 1-3 blocks of filler turned by 15-90 degrees (not recorded as glyphs)
    box_rows: float = 0.0  # box_word: chance that the boxes stand in rows (a grid) instead of scattered
    print_under_shapes: float = 0.0  # shape_colour: chance of lines of print under the shapes (held out)
    fields_under_shapes: float = 0.0  # shape_colour: chance of scattered KEY: NNNN fields under the shapes (trained)


SPEC = PageStyle()
LAYOUTS = PageStyle(rotated=0.7, box_rows=0.7, print_under_shapes=0.7)  # SPEC in the layouts training never draws


@dataclass
class Question:
    question: str  # e.g. "What is the value of TOTAL?"
    answer: str  # e.g. "0427"
    box: Box  # half-open pixel box of the target: (x0, y0, x1, y1)
    text: str  # the target as a reader would transcribe it, e.g. "TOTAL: 0427", "red: tiger", "red circle"


@dataclass(frozen=True)
class Glyph:
    """One drawn character: the dense reading target of pocket training (arr_coc.pocket.reading)."""
    x: float  # centre of its advance, px from the page's left
    y: float  # centre of its line's ink box, px from the top (every glyph of a line has the same y)
    char: str  # the character (never a space)


@dataclass(frozen=True)
class Mark:
    """One drawn target: what pocket training's binding head learns to tie to its cells (arr_coc.pocket.binding)."""
    kind: str  # "field" (KEY: NNNN), "box" (a coloured border around a word) or "shape" (a filled shape)
    box: Box  # half-open pixel box: the field's ink box, the box's outer edge, the shape's extent
    colour: str = ""  # box and shape: its colour (a COLOURS key)
    shape: str = ""  # shape: one of SHAPES
    border: int = 0  # box: border width in px
    key: str = ""  # field: its KEY
    text: str = ""  # field: its value (NNNN); box: the word in it


@dataclass
class Page:
    image: Image.Image  # RGB, width x height
    kind: str  # one of PAGE_KINDS
    questions: list[Question]  # every question the page answers, in drawing order
    glyphs: list[Glyph]  # every character drawn on it (targets and clutter), in drawing order
    marks: list[Mark] = field(default_factory=list)  # every target drawn on it, in drawing order

    @property
    def transcript(self) -> str:
        """Every target's text in reading order (rows of 28 px, top to bottom, then left to right)."""
        ordered = sorted(self.questions, key=lambda q: ((q.box[1] + q.box[3]) // 56, q.box[0]))
        return "\n".join(q.text for q in ordered)


@lru_cache(maxsize=64)
def font(px: int) -> ImageFont.FreeTypeFont:
    """Pillow's bundled scalable font (Aileron) at `px` pixels."""
    return ImageFont.load_default(size=px)


def rotated_text(lines: list[str], px: int, angle: float) -> Image.Image:
    """Lines of text turned by `angle` degrees (counter-clockwise) -> an "L" mask, 255 where the ink is."""
    f = font(px)
    pitch = int(px * 1.3)
    width = max(int(f.getlength(line)) for line in lines) + 2
    block = Image.new("L", (width, pitch * len(lines) + 2), 0)
    draw = ImageDraw.Draw(block)
    for i, line in enumerate(lines):
        draw.text((1, 1 + i * pitch), line, font=f, fill=255)
    return block.rotate(angle, expand=True, resample=Image.BICUBIC)


def _grow(box: Box, gap: int) -> Box:
    return (box[0] - gap, box[1] - gap, box[2] + gap, box[3] + gap)


def _free(box: Box, taken: list[Box], width: int, height: int) -> bool:
    """True if box lies inside the page and overlaps none of `taken`."""
    if box[0] < 0 or box[1] < 0 or box[2] > width or box[3] > height:
        return False
    return not any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3] for t in taken)


class Canvas:
    """A light page with its occupied boxes: faint rules first (under everything), then the targets, then clutter
    fills what is left."""

    def __init__(self, rng: random.Random, width: int, height: int, style: PageStyle):
        self.rng, self.width, self.height, self.style = rng, width, height, style
        self.background = tuple(rng.randint(238, 255) for _ in range(3))
        self.image = Image.new("RGB", (width, height), self.background)
        self.draw = ImageDraw.Draw(self.image)
        self.taken: list[Box] = []  # target boxes, grown by a gap: clutter stays out of them
        self.glyphs: list[Glyph] = []  # every character drawn, where it was drawn
        self.marks: list[Mark] = []  # every target drawn, where and how
        gray = rng.random() < 0.7  # dark gray ink mostly, else dark blue
        self.ink = tuple([rng.randint(0, 60)] * 3) if gray else (rng.randint(0, 40), rng.randint(0, 40),
                                                                  rng.randint(60, 110))
        self.rules(style.clutter)

    def text_size(self, text: str, px: int) -> tuple[int, int, int, int]:
        return self.draw.textbbox((0, 0), text, font=font(px))

    def text(self, text: str, px: int, left: int, top: int, fill) -> Box:
        """Draw text with its ink box's top-left at (left, top); record its glyphs and return the ink box."""
        f = font(px)
        l, t, _, _ = self.text_size(text, px)
        xy = (left - l, top - t)
        self.draw.text(xy, text, font=f, fill=fill)
        x0, y0, x1, y1 = self.draw.textbbox(xy, text, font=f)
        self.glyphs += [Glyph(xy[0] + f.getlength(text[:i]) + f.getlength(ch) / 2, (y0 + y1) / 2, ch)
                        for i, ch in enumerate(text) if ch != " "]
        return (max(0, int(x0)), max(0, int(y0)), min(self.width, int(x1) + 1), min(self.height, int(y1) + 1))

    def spot(self, w: int, h: int, gap: int, region: Box | None = None, tries: int = 200) -> Box | None:
        """A free w x h box (at least `gap` from every target) inside `region`, or None."""
        x0, y0, x1, y1 = region or (0, 0, self.width, self.height)
        for _ in range(tries):
            if x1 - x0 - w < 0 or y1 - y0 - h < 0:
                return None
            left, top = self.rng.randint(x0, x1 - w), self.rng.randint(y0, y1 - h)
            box = (left, top, left + w, top + h)
            if _free(_grow(box, gap), self.taken, self.width, self.height) or (
                    gap and _free(box, [_grow(t, gap) for t in self.taken], self.width, self.height)):
                return box
        return None

    def rules(self, density: float):
        """Faint horizontal (and sometimes vertical) rules behind everything, as on forms and ledgers."""
        rng = self.rng
        if rng.random() > 0.8 * density:
            return
        pitch = rng.randint(22, 60)
        gray = rng.randint(212, 232)
        for y in range(rng.randint(0, pitch), self.height, pitch):
            self.draw.line([(0, y), (self.width, y)], fill=(gray, gray, gray), width=1)
        if rng.random() < 0.3:
            for x in range(rng.randint(0, 4 * pitch), self.width, 4 * pitch):
                self.draw.line([(x, 0), (x, self.height)], fill=(gray, gray, gray), width=1)

    def clutter(self, density: float):
        """Small gray filler words wherever no target is, up to ~density x 1 word per 9000 px^2."""
        rng = self.rng
        n = int(density * self.width * self.height / 9000 * rng.uniform(0.3, 1.0))
        for _ in range(n):
            px = rng.randint(7, 10)
            words = " ".join(rng.choice(FILLER) if rng.random() < 0.8 else str(rng.randint(1, 99))
                             for _ in range(rng.randint(1, 4)))
            l, t, r, b = self.text_size(words, px)
            box = self.spot(r - l, b - t, 3, tries=3)
            if box is not None:
                gray = rng.randint(150, 195)
                self.text(words, px, box[0], box[1], (gray, gray, gray))

    def rotated_blocks(self, chance: float):
        """With this chance, 1-3 blocks of gray filler lines turned by 15-90 degrees, in free space."""
        rng = self.rng
        if not chance or rng.random() >= chance:  # no draw at all when off: SPEC's pages stay as they were
            return
        for _ in range(rng.randint(1, 3)):
            lines = [" ".join(rng.choice(FILLER) for _ in range(rng.randint(2, 5))) for _ in range(rng.randint(2, 5))]
            mask = rotated_text(lines, rng.randint(8, 12), rng.choice((-1, 1)) * rng.uniform(15, 90))
            box = self.spot(mask.width, mask.height, 4, tries=20)
            if box is not None:
                gray = rng.randint(110, 170)
                self.image.paste((gray, gray, gray), box[:2], mask)
                self.taken.append(box)

    def finish(self, kind: str, questions: list[Question]) -> Page:
        self.rotated_blocks(self.style.rotated)
        self.clutter(self.style.clutter)
        return Page(self.image, kind, questions, self.glyphs, self.marks)


# -----------------------------------------------------------------------------
# the three kinds


def _field_slots(canvas: Canvas, n: int, w: int, h: int, layout: str) -> list[Box]:
    """Up to n free w x h slots for fields, in the page's layout."""
    rng, W, H = canvas.rng, canvas.width, canvas.height
    gap = max(4, h // 2)
    if layout == "scattered":
        slots = []
        for _ in range(n):
            box = canvas.spot(w, h, gap)
            if box is not None:
                slots.append(box)
                canvas.taken.append(_grow(box, gap))
        return slots
    # tabular or columns: a grid of cols x rows over a random sub-rectangle of the page
    cols = rng.randint(1, max(1, min(4, W // (w + 2 * gap)))) if layout == "table" else rng.randint(1, max(1, min(3, W // (w + 3 * gap))))
    pitch_x = w + rng.randint(2 * gap, 6 * gap)
    pitch_y = int(h * rng.uniform(1.6, 2.6))
    rows = max(1, -(-n // cols))
    rows = min(rows, max(1, (H - 2 * gap) // pitch_y))
    left = rng.randint(gap, max(gap, W - cols * pitch_x))
    top = rng.randint(gap, max(gap, H - rows * pitch_y))
    slots = []
    for r in range(rows):
        for c in range(cols):
            x, y = left + c * pitch_x, top + r * pitch_y
            box = (x, y, x + w, y + h)
            if len(slots) < n and _free(box, canvas.taken, W, H):
                slots.append(box)
                canvas.taken.append(_grow(box, gap))
    rng.shuffle(slots)
    return slots


def fine_print(rng: random.Random, width: int, height: int, style: PageStyle) -> Page:
    canvas = Canvas(rng, width, height, style)
    px = rng.randint(*style.field_font)
    keys = rng.sample(KEYS, min(len(KEYS), rng.randint(*style.fields)))
    l, t, r, b = canvas.text_size("WEIGHT: 0000", px)  # the widest field (pads every slot alike)
    while px > 8 and r - l > width - 16:  # a narrow page gets a smaller font rather than no field
        px -= 1
        l, t, r, b = canvas.text_size("WEIGHT: 0000", px)
    layout = rng.choice(("scattered", "scattered", "table", "columns"))
    slots = _field_slots(canvas, len(keys), r - l, b - t, layout)
    questions = []
    for key, slot in zip(keys, slots):
        value = f"{rng.randrange(10000):04d}"
        box = canvas.text(f"{key}: {value}", px, slot[0], slot[1], canvas.ink)
        canvas.marks.append(Mark("field", box, key=key, text=value))
        questions.append(Question(f"What is the value of {key}?", value, box, f"{key}: {value}"))
    return canvas.finish("fine_print", questions)


def box_word(rng: random.Random, width: int, height: int, style: PageStyle) -> Page:
    canvas = Canvas(rng, width, height, style)
    n = rng.randint(*style.boxes)
    colours = rng.sample(sorted(COLOURS), min(n, len(COLOURS)))
    words = rng.sample(BOX_WORDS, len(colours))
    rows = bool(style.box_rows) and rng.random() < style.box_rows  # no draw when off: SPEC's pages stay as they were
    cols = rng.randint(2, 4) if rows else 0
    x = x0 = y = gap = row_height = 0  # rows: where the next box goes, and the tallest box of the row so far
    questions = []
    for i, (colour, word) in enumerate(zip(colours, words)):
        px, border = rng.randint(*style.word_font), rng.randint(*style.border)
        l, t, r, b = canvas.text_size(word, px)
        pad_x, pad_y = int(px * rng.uniform(0.5, 2.5)), int(px * rng.uniform(0.4, 1.5))
        w, h = r - l + 2 * (pad_x + border), b - t + 2 * (pad_y + border)
        if rows:  # left to right, `cols` a row, every box of a row on one top edge
            if i == 0:
                gap = rng.randint(10, 40)
                x = x0 = rng.randint(8, max(8, width // 4))
                y = rng.randint(8, max(8, height // 3))
            elif i % cols == 0:
                x, y, row_height = x0, y + row_height + gap, 0
            box = (x, y, x + w, y + h)
            x += w + gap
            row_height = max(row_height, h)
            if not _free(_grow(box, 8), canvas.taken, width, height):
                continue
        else:
            box = canvas.spot(w, h, 8)
        if box is None:
            continue
        canvas.taken.append(_grow(box, 8))
        canvas.draw.rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=canvas.background,
                              outline=COLOURS[colour], width=border)
        canvas.marks.append(Mark("box", box, colour=colour, border=border, text=word))
        jx = rng.randint(-pad_x // 2, pad_x // 2)
        jy = rng.randint(-pad_y // 2, pad_y // 2)
        canvas.text(word, px, box[0] + border + pad_x + jx, box[1] + border + pad_y + jy, canvas.ink)
        questions.append(Question(f"What word is in the {colour} box?", word, box, f"{colour}: {word}"))
    return canvas.finish("box_word", questions)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: Box, fill):
    x0, y0, x1, y1 = box[0], box[1], box[2] - 1, box[3] - 1
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    if shape == "circle":
        draw.ellipse([x0, y0, x1, y1], fill=fill)
    elif shape == "square":
        draw.rectangle([x0, y0, x1, y1], fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, y0), (x1, y1), (x0, y1)], fill=fill)
    else:  # diamond
        draw.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=fill)


def shape_colour(rng: random.Random, width: int, height: int, style: PageStyle) -> Page:
    canvas = Canvas(rng, width, height, style)
    n = rng.randint(*style.shapes)
    shapes, colours = rng.sample(SHAPES, n), rng.sample(sorted(COLOURS), n)
    under = bool(style.print_under_shapes) and rng.random() < style.print_under_shapes  # no draw when off
    fields = bool(style.fields_under_shapes) and rng.random() < style.fields_under_shapes
    printed: list[Box] = []  # the print the shapes go over, in the page's ink
    if under:  # lines of filler over most of the page (LAYOUTS: held out)
        px = rng.randint(9, 13)
        printed = [canvas.text(" ".join(rng.choice(FILLER) for _ in range(width // (3 * px))), px, rng.randint(4, 20),
                               top, canvas.ink)
                   for top in range(rng.randint(4, 20), height - 2 * px, int(px * rng.uniform(1.5, 2.2)))]
    elif fields:  # scattered fields, as on a fine_print page (training's own variant)
        px = rng.randint(*style.field_font)
        for key in rng.sample(KEYS, rng.randint(8, 24)):
            text = f"{key}: {rng.randrange(10000):04d}"
            l, t, r, b = canvas.text_size(text, px)
            left, top = rng.randint(0, max(0, width - (r - l))), rng.randint(0, max(0, height - (b - t)))
            if _free(_grow((left, top, left + r - l, top + b - t), 4), printed, width, height):
                printed.append(canvas.text(text, px, left, top, canvas.ink))
    covered = Image.new("1", (width, height), 0)  # where a shape is painted
    questions = []
    for shape, colour in zip(shapes, colours):
        side = int(rng.uniform(*style.shape_size) * min(width, height))
        box = canvas.spot(side, side, max(4, side // 10))
        if box is None:
            continue
        canvas.taken.append(_grow(box, 4))
        draw_shape(canvas.draw, shape, box, COLOURS[colour])
        draw_shape(ImageDraw.Draw(covered), shape, box, 1)
        canvas.marks.append(Mark("shape", box, colour=colour, shape=shape))
        questions.append(Question(f"What colour is the {shape}?", colour, box, f"{colour} {shape}"))
    if printed:  # a glyph under a shape is no longer there to be read; the clutter keeps off the print
        canvas.taken += printed
        canvas.glyphs = [g for g in canvas.glyphs
                         if not covered.getpixel((min(int(g.x), width - 1), min(int(g.y), height - 1)))]
    return canvas.finish("shape_colour", questions)


_KINDS = {"fine_print": fine_print, "box_word": box_word, "shape_colour": shape_colour}
assert tuple(_KINDS) == PAGE_KINDS


def make_page(kind: str, seed: int, width: int, height: int | None = None, style: PageStyle = SPEC) -> Page:
    """One page of `kind`: a pure function of its arguments. Redrawn (next sub-seed) if nothing fit on it."""
    if kind not in _KINDS:
        raise ValueError(f"unknown page kind {kind!r}; expected one of {', '.join(PAGE_KINDS)}")
    height = width if height is None else height
    for attempt in range(100):
        page = _KINDS[kind](random.Random(f"arr_coc:fineprint:{kind}:{int(seed)}:{attempt}"), width, height, style)
        if page.questions:
            return page
    raise ValueError(f"no {kind} target fits on a {width}x{height} page")


@dataclass
class PageConfig:
    """`python -m arr_coc.synth.fineprint`'s flags, each field one (arr_coc.flags.flag)."""
    kind: str = flags.flag("fine_print", "which kind of page to draw", flags.one_of(PAGE_KINDS))
    seed: int = flags.seed_flag(0, "the page")
    size: int = flags.flag(896, "page side in px (square)", flags.bounded_int(64, 8192))
    out: str = flags.flag("page.png", "where to write the PNG")


def main(argv=None) -> None:
    args = flags.parse_config(PageConfig, argv, flags.config_parser(PageConfig, __doc__))
    page = make_page(args.kind, args.seed, args.size)
    page.image.save(args.out)
    for q in page.questions:
        print(f"{q.question}  ->  {q.answer}  at {list(q.box)}")


if __name__ == "__main__":
    main()
