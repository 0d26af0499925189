"""
Layout families: nine distinct ways of drawing a page, each carrying the suite's questions (fineprint.PAGE_KINDS)
with their answer boxes, every drawn glyph and every target mark, as fineprint's pages do.

    family         dense  held out  aspect (w/h)  kinds                       what the page looks like
    scattered      -      -         3:4..4:3      fine_print box_word shape   fineprint's own pages (SPEC)
    form           -      -         0.7..0.8      fine_print box_word         titled sections of labelled fields in columns
    table          -      -         0.7..1.4      fine_print                  a ruled table with a bold header row
    receipt        -      -         0.30..0.45    fine_print                  narrow and long: KEY left, NNNN right
    slide          -      yes       1.6..1.8      fine_print box_word shape   large title, bullets, callouts, small footer
    ledger         yes    -         0.7..1.0      fine_print                  60-120 fields, a line of body text under each row
    body_text      yes    -         0.7..0.8      fine_print box_word         full pages of text, inline fields and boxed words
    print_shapes   yes    -         0.8..1.25     fine_print shape            dense print with shapes painted over it
    box_grid       yes    yes       0.8..1.25     fine_print box_word         30-60 grey boxes, 3-8 coloured, text between

Dense families put ink in >= 30% of the 28 px cells of a page of 1792^2 px area (ink_cells, >= 1200 of 4096), so no
few-hundred-token selection can keep all of it. HELD_OUT families are never drawn by training
(arr_coc.pocket.data draws TRAINED only; a test pins it): generalisation is reported on them alone.

Pages vary what real pages vary: fonts (Pillow's Aileron and the DejaVu faces shipped beside this file, regular and
bold), 9-24 px print, ink and paper colours and contrast, turned blocks of filler, aspect ratios, up to 120 fields
and 60 boxes, and distractors: keys that share the asked key's stem ("SPEED", "MAX SPEED"), boxes in a paler shade
of the asked colour, grey boxes holding words. Every character drawn is in pocket.reading's ALPHABET.

    page = make_family_page("receipt", "fine_print", seed=3, width=616, height=1624)
    w, h = family_size("slide", seed=3, size=896)   # the family's aspect at about 896^2 px, multiples of 28
    python -m arr_coc.synth.families --family ledger --kind fine_print --seed 0 --size 1792 --out /tmp/page.png
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from arr_coc import flags

from arr_coc.synth.fineprint import (BOX_WORDS, COLOURS, FILLER, KEYS, PAGE_KINDS, SHAPES, SPEC, Box, Canvas, Glyph,
                                     Mark, Page, PageStyle, Question, _grow, draw_shape, make_page)

CELL = 28  # px a merged token covers (Qwen2-VL): ink_cells counts these
DENSE_SHARE = 0.30  # a dense family inks at least this share of a page's cells (at 1792^2 px area)
FONT_DIR = Path(__file__).resolve().parent / "fonts"
FACES = ("aileron", "DejaVuSans", "DejaVuSans-Bold", "DejaVuSerif", "DejaVuSansMono")  # Aileron: Pillow's own

# qualifiers that make compound keys ("MAX SPEED") and stem distractors of a plain key ("SPEED")
QUALIFIERS = ("MAX", "MIN", "NET", "BASE", "OLD", "NEW", "AUTO", "MAIN", "SUB", "TOP")
COMPOUND_KEYS = tuple(f"{q} {k}" for q in QUALIFIERS for k in KEYS)
# body text: common words and the suite's filler, every letter (also upper-cased) in pocket.reading's ALPHABET
FILLER_WORDS = tuple(w for w in ("the of and to in is for on with as at by from this that be are was it an or not all can "
                          "will one has more their which about when other into some time these two may then do "
                          "first new been its also after made did down only most used use work part over such our "
                          "each even well back much good through where own same high long must make under large "
                          "small set since both while total order rate sent note form line item unit per hour "
                          "paid due date name plan list open held kept three four five seven nine ten").split() + list(FILLER)
              if not set(w) & set("jqxy"))
SHADES = 0.45  # a shade distractor mixes its colour this far towards mid grey


@dataclass(frozen=True)
class Family:
    """One way of drawing a page."""
    name: str  # e.g. "receipt"
    kinds: tuple[str, ...]  # the question kinds (fineprint.PAGE_KINDS) its pages can carry
    aspect: tuple[float, float]  # width / height range of its pages
    dense: bool  # inks >= DENSE_SHARE of the cells at 1792^2 px area
    held_out: bool  # never drawn by training; generalisation is reported on these alone
    draw: Callable[[random.Random, int, int, str], Page]  # (rng, width, height, kind) -> Page


# -----------------------------------------------------------------------------
# the sheet: fineprint's Canvas with fonts, ink and paper that vary


@lru_cache(maxsize=256)
def face(name: str, px: int) -> ImageFont.FreeTypeFont:
    """One of FACES at `px` pixels."""
    if name == "aileron":
        return ImageFont.load_default(size=px)
    return ImageFont.truetype(str(FONT_DIR / f"{name}.ttf"), px)


@lru_cache(maxsize=4096)
def _advance(name: str, px: int, ch: str) -> float:
    return face(name, px).getlength(ch)


class Sheet(Canvas):
    """A Canvas whose paper, ink and faces vary by page; `write` records glyphs in O(len) for long lines."""

    def __init__(self, rng: random.Random, width: int, height: int, clutter: float = 0.5):
        super().__init__(rng, width, height, PageStyle(clutter=clutter))
        if rng.random() < 0.5:  # tinted paper (cream, grey, blue, green), redrawn before anything is on it
            tint = rng.choice(((250, 244, 225), (232, 232, 232), (228, 238, 250), (232, 246, 232)))
            self.background = tuple(max(200, c - rng.randint(0, 12)) for c in tint)
            self.image.paste(self.background, (0, 0, width, height))
            self.rules(clutter)
        self.ink = tuple(min(120, c + rng.choice((0, 0, 30, 60))) for c in self.ink)  # contrast varies
        self.faces = (rng.choice(FACES), rng.choice(FACES))  # (body, emphasis)

    def write(self, text: str, name: str, px: int, left: int, top: int, fill) -> Box:
        """Draw text in face `name` with its ink box's top-left at (left, top); record its glyphs; the ink box."""
        f = face(name, px)
        l, t, _, _ = self.draw.textbbox((0, 0), text, font=f)
        xy = (left - l, top - t)
        self.draw.text(xy, text, font=f, fill=fill)
        x0, y0, x1, y1 = self.draw.textbbox(xy, text, font=f)
        self.taken.append((int(x0) - 2, int(y0) - 2, int(x1) + 3, int(y1) + 3))  # clutter keeps off it
        at = xy[0]
        for ch in text:  # advances summed: kerning (< 1 px) ignored, so a 200-glyph line costs 200 look-ups
            step = _advance(name, px, ch)
            if ch != " ":
                self.glyphs.append(Glyph(at + step / 2, (y0 + y1) / 2, ch))
            at += step
        return (max(0, int(x0)), max(0, int(y0)), min(self.width, int(x1) + 1), min(self.height, int(y1) + 1))

    def size(self, text: str, name: str, px: int) -> tuple[int, int]:
        l, t, r, b = self.draw.textbbox((0, 0), text, font=face(name, px))
        return r - l, b - t

    def field(self, key: str, value: str, name: str, px: int, left: int, top: int, questions: list) -> Box:
        """A "KEY: NNNN" field, recorded as a fine_print target."""
        box = self.write(f"{key}: {value}", name, px, left, top, self.ink)
        self.target_field(key, value, box, questions)
        return box

    def target_field(self, key: str, value: str, box: Box, questions: list):
        self.taken.append(_grow(box, 3))  # a field set apart (KEY ... NNNN) keeps the clutter out of its gap
        self.marks.append(Mark("field", box, key=key, text=value))
        questions.append(Question(f"What is the value of {key}?", value, box, f"{key}: {value}"))

    def word_box(self, word: str, colour: str, name: str, px: int, left: int, top: int, border: int,
                 pad: tuple[int, int], questions: list | None) -> Box:
        """A word inside a rectangle bordered in `colour` (a COLOURS key, or an RGB for a distractor); a
        box_word target when `questions` is given. The rectangle's outer box."""
        w, h = self.size(word, name, px)
        box = (left, top, left + w + 2 * (pad[0] + border), top + h + 2 * (pad[1] + border))
        rgb = COLOURS[colour] if isinstance(colour, str) else colour
        self.draw.rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=self.background, outline=rgb, width=border)
        self.taken.append(_grow(box, 3))
        self.write(word, name, px, left + border + pad[0], top + border + pad[1], self.ink)
        if questions is not None:
            self.marks.append(Mark("box", box, colour=colour, border=border, text=word))
            questions.append(Question(f"What word is in the {colour} box?", word, box, f"{colour}: {word}"))
        return box

    def body_line(self, rng: random.Random, name: str, px: int, left: int, top: int, width: int, fill) -> Box:
        """One line of body text filling `width` px from (left, top)."""
        words, used = [], 0
        space = _advance(name, px, " ")
        while True:
            word = rng.choice(FILLER_WORDS)
            step = sum(_advance(name, px, c) for c in word) + space
            if used + step > width:
                break
            words.append(word)
            used += step
        return self.write(" ".join(words), name, px, left, top, fill) if words else (left, top, left, top)

    def page(self, kind: str, questions: list[Question], rotated: float = 0.3) -> Page:
        self.rotated_blocks(rotated)
        self.clutter(self.style.clutter)
        return Page(self.image, kind, questions, self.glyphs, self.marks)


def shade(colour: str) -> tuple[int, int, int]:
    """`colour` mixed SHADES of the way to mid grey: the asked colour in another shade, a distractor."""
    return tuple(int(c + SHADES * (128 - c)) for c in COLOURS[colour])


def keys_for(rng: random.Random, n: int, stems: float = 0.3) -> list[str]:
    """n distinct keys; a `stems` share of them come with their stem or a sibling compound (SPEED, MAX SPEED)."""
    pool = list(KEYS) + list(COMPOUND_KEYS)
    rng.shuffle(pool)
    out: list[str] = []
    for key in pool:
        if len(out) >= n:
            break
        if key in out:
            continue
        out.append(key)
        if rng.random() < stems and len(out) < n:
            stem = key.split()[-1]
            sibling = stem if key != stem else f"{rng.choice(QUALIFIERS)} {stem}"
            if sibling not in out:
                out.append(sibling)
    rng.shuffle(out)
    return out[:n]


def value(rng: random.Random) -> str:
    return f"{rng.randrange(10000):04d}"


def distinct_colours(rng: random.Random, n: int) -> list[str]:
    return rng.sample(sorted(COLOURS), min(n, len(COLOURS)))


# -----------------------------------------------------------------------------
# sparse families


def scattered(rng: random.Random, width: int, height: int, kind: str) -> Page:
    """fineprint's own pages, as specified (SPEC)."""
    return make_page(kind, rng.getrandbits(40), width, height, SPEC)


def form(rng: random.Random, width: int, height: int, kind: str) -> Page:
    """A title, then sections of labelled fields in 2-3 columns (inline "KEY: NNNN", or the label over its value on
    an underline); box_word pages add a row of stamps (coloured and grey outlined boxes) under the fields."""
    s = Sheet(rng, width, height, clutter=rng.uniform(0.0, 0.6))
    body, bold = s.faces
    margin = rng.randint(12, 40)
    px = rng.randint(10, 18)
    top = s.write(" ".join(rng.choice(FILLER_WORDS) for _ in range(rng.randint(2, 4))).upper(), bold,
                  rng.randint(18, 30), margin, margin, s.ink)[3] + rng.randint(10, 24)
    s.draw.line([(margin, top - 6), (width - margin, top - 6)], fill=s.ink, width=2)
    cols = rng.randint(2, 3) if width >= 560 else 1
    pitch_x = (width - 2 * margin) // cols
    stacked = rng.random() < 0.5  # the label over its value, on an underline
    stamps = kind == "box_word"
    bottom = height - margin - (int(px * 4) if stamps else 0)
    keys = keys_for(rng, rng.randint(8, 40))
    section = cols * rng.randint(2, 5)  # fields a section
    rows = -(-len(keys) // cols) + 2 * (len(keys) // section)  # rows of fields and of section headers
    pitch_y = max(int(px * (3.2 if stacked else 2.0)), min(int(px * 6), (bottom - top) // max(1, rows)))
    questions: list[Question] = []
    for i, key in enumerate(keys):
        if i and i % section == 0:  # a section header, full width, after the last row
            top += pitch_y // 2 + (pitch_y if i % cols else 0)
            if top + 2 * pitch_y > bottom:
                break
            s.write(" ".join(rng.choice(FILLER_WORDS) for _ in range(2)).upper(), bold, px, margin, top, s.ink)
            top += pitch_y
        col = (i % section) % cols
        y = top
        if y + pitch_y > bottom:
            break
        x = margin + col * pitch_x
        v = value(rng)
        if stacked:
            label = s.write(key, body, max(9, px - 3), x, y, s.ink)
            ink = s.write(v, body, px, x + 4, label[3] + 4, s.ink)
            s.draw.line([(x, ink[3] + 3), (x + pitch_x - 16, ink[3] + 3)], fill=s.ink, width=1)
            if kind == "fine_print":
                s.target_field(key, v, (label[0], label[1], max(label[2], ink[2]), ink[3]), questions)
        elif kind == "fine_print":
            s.field(key, v, body, px, x, y, questions)
        else:
            s.write(f"{key}: {v}", body, px, x, y, s.ink)
        if col == cols - 1 or (i + 1) % section == 0:
            top += pitch_y
    if stamps:
        _stamp_row(s, rng, margin, max(top, bottom + 8), questions)
    return s.page(kind, questions)


def _stamp_row(s: Sheet, rng: random.Random, left: int, top: int, questions: list):
    """3-8 outlined boxes in a row, each holding a word: 2-5 in distinct colours (targets), the rest grey or in a
    target's paler shade."""
    colours = distinct_colours(rng, rng.randint(2, 5))
    words = rng.sample(BOX_WORDS, 8)
    kinds = colours + [None] * rng.randint(1, 3)
    rng.shuffle(kinds)
    x = left
    for colour, word in zip(kinds, words):
        px, border = rng.randint(11, 18), rng.randint(3, 6)
        w, h = s.size(word, s.faces[0], px)
        pad = (rng.randint(4, 12), rng.randint(3, 8))
        full = w + 2 * (pad[0] + border)
        if x + full > s.width - 8 or top + h + 2 * (pad[1] + border) > s.height - 4:
            break
        if colour is None:
            rgb = shade(rng.choice(colours)) if rng.random() < 0.5 else (rng.randint(90, 150),) * 3
            s.word_box(word, rgb, s.faces[0], px, x, top, border, pad, None)
        else:
            s.word_box(word, colour, s.faces[0], px, x, top, border, pad, questions)
        x += full + rng.randint(8, 30)


def table(rng: random.Random, width: int, height: int, kind: str) -> Page:
    """A ruled table: a bold header row on a grey band, then rows of KEY | NNNN | a note | a quantity."""
    s = Sheet(rng, width, height, clutter=rng.uniform(0.0, 0.5))
    body, bold = s.faces
    px = rng.randint(9, 18)
    margin = rng.randint(8, 60)
    row_h = int(px * rng.uniform(1.7, 2.4))
    rows = max(1, min(rng.randint(8, 40), (height - 2 * margin) // row_h - 1))
    keys = keys_for(rng, rows)
    key_w = max(s.size(k, body, px)[0] for k in keys + ["ITEM"]) + px
    val_w = s.size("VALUE", bold, px)[0] + px
    room = int((width - 2 * margin) * rng.uniform(0.6, 1.0)) - key_w - val_w
    cols = [key_w, val_w] + ([room - px * 5, px * 5] if room > px * 14 else [room] if room > px * 6 else [])
    left = margin if rng.random() < 0.6 else rng.randint(margin, max(margin, width - margin - sum(cols)))
    top = rng.randint(margin, max(margin, height - margin - (rows + 1) * row_h))
    right, bottom = left + sum(cols), top + (rows + 1) * row_h
    s.draw.rectangle([left, top, right, top + row_h], fill=tuple(max(0, c - 40) for c in s.background))
    x = left
    for c, name in zip(cols, ("ITEM", "VALUE", "NOTE", "UNITS")):
        s.write(name, bold, px, x + px // 2, top + (row_h - px) // 2, s.ink)
        x += c
    questions: list[Question] = []
    for r, key in enumerate(keys):
        y = top + (r + 1) * row_h + (row_h - px) // 2
        k = s.write(key, body, px, left + px // 2, y, s.ink)
        v_text = value(rng)
        v = s.write(v_text, body, px, left + cols[0] + px // 2, y, s.ink)
        if kind == "fine_print":
            s.target_field(key, v_text, (k[0], min(k[1], v[1]), v[2], max(k[3], v[3])), questions)
        if len(cols) > 2:
            s.write(" ".join(rng.choice(FILLER_WORDS) for _ in range(rng.randint(1, 3))), body, max(9, px - 2),
                    left + cols[0] + cols[1] + px // 2, y, s.ink)
        if len(cols) > 3:
            s.write(str(rng.randint(1, 99)), body, px, left + sum(cols[:3]) + px // 2, y, s.ink)
    for r in range(rows + 2):  # the rules
        s.draw.line([(left, top + r * row_h), (right, top + r * row_h)], fill=s.ink, width=1)
    x = left
    for c in [0] + cols:
        x += c
        s.draw.line([(x, top), (x, bottom)], fill=s.ink, width=1)
    s.taken.append((left - 4, top - 4, right + 4, bottom + 4))  # the rules too
    return s.page(kind, questions)


def receipt(rng: random.Random, width: int, height: int, kind: str) -> Page:
    """Narrow and long: a shop's name, then lines of KEY on the left and NNNN on the right, items between,
    dashed rules, a total."""
    s = Sheet(rng, width, height, clutter=rng.uniform(0.0, 0.3))
    body, bold = s.faces
    px = rng.randint(9, 16)
    margin = rng.randint(8, 24)
    name = " ".join(rng.choice(FILLER_WORDS) for _ in range(2)).upper()
    tw = s.size(name, bold, px + 6)[0]
    top = s.write(name, bold, px + 6, max(margin, (width - tw) // 2), margin, s.ink)[3] + px
    pitch = int(px * rng.uniform(1.4, 2.0))
    questions: list[Question] = []
    keys = iter(keys_for(rng, 60))
    while top + 2 * pitch < height - margin:
        roll = rng.random()
        if roll < 0.08:  # a dashed rule
            for x in range(margin, width - margin, 8):
                s.draw.line([(x, top + pitch // 2), (x + 4, top + pitch // 2)], fill=s.ink, width=1)
        elif roll < 0.5 or kind != "fine_print":  # an item: words left, a number right
            s.write(" ".join(rng.choice(FILLER_WORDS) for _ in range(rng.randint(1, 3))), body, px, margin, top, s.ink)
            amount = str(rng.randint(1, 999))
            s.write(amount, body, px, width - margin - s.size(amount, body, px)[0], top, s.ink)
        else:  # a field: KEY left, NNNN right
            key, v = next(keys, None), value(rng)
            if key is None:
                break
            k = s.write(key, body, px, margin, top, s.ink)
            r = s.write(v, body, px, width - margin - s.size(v, body, px)[0], top, s.ink)
            s.target_field(key, v, (k[0], min(k[1], r[1]), r[2], max(k[3], r[3])), questions)
        top += pitch
    return s.page(kind, questions, rotated=0.0)


def slide(rng: random.Random, width: int, height: int, kind: str) -> Page:
    """A large title over an accent bar, 3-6 bullets (some ending in a field), callout boxes and shapes at the
    right, a small footer field. Held out: training never draws it."""
    s = Sheet(rng, width, height, clutter=rng.uniform(0.0, 0.2))
    body, bold = s.faces
    m = width // rng.randint(14, 24)
    title_px = max(18, min(48, height // rng.randint(10, 16)))
    title = s.write(" ".join(rng.choice(FILLER_WORDS) for _ in range(rng.randint(2, 5))).title(), bold, title_px, m, m, s.ink)
    s.draw.rectangle([m, title[3] + 6, width - m, title[3] + 10], fill=(70, 80, 100))
    px = rng.randint(12, 24)
    split = int(width * rng.uniform(0.55, 0.65))
    questions: list[Question] = []
    top, keys = title[3] + 24, keys_for(rng, 8)
    for i in range(rng.randint(3, 6)):
        if top + 2 * px > height - 3 * m:
            break
        s.draw.ellipse([m, top + px // 3, m + px // 2, top + px // 3 + px // 2], fill=s.ink)
        x = m + px
        text = " ".join(rng.choice(FILLER_WORDS) for _ in range(rng.randint(2, 6)))
        box = s.write(text, body, px, x, top, s.ink)
        if i < len(keys) and rng.random() < 0.7 and box[2] + s.size(f"{keys[i]}: 0000", body, px)[0] + px < split:
            v = value(rng)
            if kind == "fine_print":
                s.field(keys[i], v, body, px, box[2] + px, top, questions)
            else:
                s.write(f"{keys[i]}: {v}", body, px, box[2] + px, top, s.ink)
        top += int(px * 2.2)
    side = _slide_side(s, rng, split, title[3] + 24, kind, questions)
    fpx = rng.randint(9, 11)
    footer_key, v = rng.choice(("PAGE", "LINE", "CODE", "TRACK")), value(rng)
    if kind == "fine_print" and footer_key not in keys:
        s.field(footer_key, v, body, fpx, width - m - s.size(f"{footer_key}: 0000", body, fpx)[0], height - m, questions)
    s.write(" ".join(rng.choice(FILLER_WORDS) for _ in range(4)), body, fpx, m, height - m, s.ink)
    s.taken.append((split - 4, title[3], width, side))  # the callouts' and shapes' column
    return s.page(kind, questions, rotated=0.0)


def _slide_side(s: Sheet, rng: random.Random, left: int, top: int, kind: str, questions: list) -> int:
    """The slide's right part: 2-4 callout boxes (box_word's targets) and 1-3 shapes (shape_colour's). Its bottom."""
    colours = distinct_colours(rng, 7)
    y = top
    for colour in colours[:rng.randint(2, 4)]:
        px, border = rng.randint(12, 20), rng.randint(3, 6)
        word = rng.choice(BOX_WORDS)
        w, h = s.size(word, s.faces[1], px)
        if y + h + 30 > s.height * 0.55 or left + w + 40 > s.width:
            break
        box = s.word_box(word, colour, s.faces[1], px, left, y, border, (10, 6),
                         questions if kind == "box_word" else None)
        y = box[3] + rng.randint(8, 20)
    shapes = rng.sample(SHAPES, rng.randint(1, 3))
    x, side = left, int(min(s.width - left, s.height) * rng.uniform(0.14, 0.22))
    for shape, colour in zip(shapes, reversed(colours)):
        box = (x, y + 8, x + side, y + 8 + side)
        if box[2] > s.width - 4 or box[3] > s.height - 30:
            break
        draw_shape(s.draw, shape, box, COLOURS[colour])
        if kind == "shape_colour":
            s.marks.append(Mark("shape", box, colour=colour, shape=shape))
            questions.append(Question(f"What colour is the {shape}?", colour, box, f"{colour} {shape}"))
        x += side + 12
    return y + side + 12


# -----------------------------------------------------------------------------
# dense families: ink in >= DENSE_SHARE of the cells


def ledger(rng: random.Random, width: int, height: int, kind: str) -> Page:
    """60-120 "KEY: NNNN" fields in 2-4 columns, a line of body text under every row of fields."""
    s = Sheet(rng, width, height, clutter=0.0)
    body, _ = s.faces
    margin, px = rng.randint(8, 24), rng.randint(9, 13)
    cols = max(1, min(rng.randint(2, 4), (width - 2 * margin) // (s.size("MAX WEIGHT: 0000", body, px)[0] + px)))
    pitch_x = (width - 2 * margin) // cols
    note_px = max(9, px - rng.randint(0, 2))
    pitch_y = int(px * rng.uniform(1.3, 1.6)) + int(note_px * rng.uniform(1.3, 1.6))
    rows = min(-(-rng.randint(60, 120) // cols), (height - 2 * margin) // pitch_y)
    keys = keys_for(rng, rows * cols, stems=0.4)
    questions: list[Question] = []
    for r in range(rows):
        top = margin + r * pitch_y
        for c in range(cols):
            if r * cols + c < len(keys):
                s.field(keys[r * cols + c], value(rng), body, px, margin + c * pitch_x, top, questions)
        s.body_line(rng, body, note_px, margin, top + int(px * rng.uniform(1.3, 1.6)), width - 2 * margin,
                    s.ink if rng.random() < 0.5 else (110, 110, 110))
    return s.page(kind, questions, rotated=0.0)


def _text_lines(s: Sheet, rng: random.Random, px: int, inline: Callable[[int, int], Box | None],
                share: float) -> None:
    """Fill the page with lines of body text in 1-2 columns; a `share` of lines carry one inline item, drawn by
    inline(left, top) between two runs of words (it returns its box, or None if it drew nothing)."""
    body = s.faces[0]
    margin = rng.randint(10, 30)
    cols = 2 if s.width >= 900 and rng.random() < 0.5 else 1
    col_w = (s.width - 2 * margin - (cols - 1) * 24) // cols
    pitch = int(px * rng.uniform(1.35, 1.7))
    for c in range(cols):
        left, top = margin + c * (col_w + 24), margin
        while top + 3 * pitch < s.height - margin:
            if rng.random() < 0.06:  # a paragraph break
                top += pitch
                continue
            if rng.random() < share:
                head = int(col_w * rng.uniform(0.0, 0.5))
                end = s.body_line(rng, body, px, left, top, head, s.ink)[2] if head > 40 else left
                item = inline(end + (px // 2 if end > left else 0), top)
                rest = (item[2] if item else end) + px // 2
                s.body_line(rng, body, px, rest, top, left + col_w - rest, s.ink)
                top += max(pitch, item[3] - top + 4) if item else pitch
                continue
            s.body_line(rng, body, px, left, top, col_w, s.ink)
            top += pitch


def body_text(rng: random.Random, width: int, height: int, kind: str) -> Page:
    """Full pages of body text; some lines hold a "KEY: NNNN" field (fine_print) or a word in a coloured, grey or
    paler-shaded box (box_word) inline."""
    s = Sheet(rng, width, height, clutter=0.0)
    px = rng.randint(9, 14)
    questions: list[Question] = []
    if kind == "fine_print":
        keys = iter(keys_for(rng, 120, stems=0.4))

        def inline(left, top):
            key = next(keys, None)
            if key is None or left + s.size(f"{key}: 0000", s.faces[0], px)[0] > width - 8:
                return None
            return s.field(key, value(rng), s.faces[1] if rng.random() < 0.5 else s.faces[0], px, left, top,
                           questions)
        share = rng.uniform(0.1, 0.3)
    else:
        colours = iter(distinct_colours(rng, rng.randint(3, 8)))
        words = iter(rng.sample(BOX_WORDS, 40))

        def inline(left, top):
            word, roll = next(words, None), rng.random()
            colour = next(colours, None) if roll < 0.5 else (shade(rng.choice(sorted(COLOURS))) if roll < 0.7
                                                            else (rng.randint(90, 150),) * 3)
            if word is None or colour is None or left + s.size(word, s.faces[0], px)[0] + 20 > width - 8:
                return None
            return s.word_box(word, colour, s.faces[0], px, left, top, rng.randint(2, 4), (4, 3),
                              questions if isinstance(colour, str) else None)
        share = rng.uniform(0.1, 0.25)
    _text_lines(s, rng, px, inline, share)
    return s.page(kind, questions, rotated=0.0)


def print_shapes(rng: random.Random, width: int, height: int, kind: str) -> Page:
    """Dense print with inline fields, 2-4 filled shapes painted over it; a glyph under a shape is gone, and so is
    every field a shape touches."""
    s = Sheet(rng, width, height, clutter=0.0)
    px = rng.randint(9, 14)
    fields: list[Question] = []
    keys = iter(keys_for(rng, 80, stems=0.3))

    def inline(left, top):
        key = next(keys, None)
        if key is None or left + s.size(f"{key}: 0000", s.faces[0], px)[0] > width - 8:
            return None
        return s.field(key, value(rng), s.faces[0], px, left, top, fields)
    _text_lines(s, rng, px, inline, rng.uniform(0.1, 0.3))
    covered = Image.new("1", (width, height), 0)
    shapes: list[Question] = []
    for shape, colour in zip(rng.sample(SHAPES, rng.randint(2, 4)), distinct_colours(rng, 4)):
        side = int(rng.uniform(0.12, 0.25) * min(width, height))
        left, top = rng.randint(0, width - side), rng.randint(0, height - side)
        box = (left, top, left + side, top + side)
        if any(_overlap(box, q.box) for q in shapes):
            continue
        draw_shape(s.draw, shape, box, COLOURS[colour])
        draw_shape(ImageDraw.Draw(covered), shape, box, 1)
        shapes.append(Question(f"What colour is the {shape}?", colour, box, f"{colour} {shape}"))
        s.marks.append(Mark("shape", box, colour=colour, shape=shape))
    mask = np.asarray(covered)
    s.glyphs = [g for g in s.glyphs if not mask[min(int(g.y), height - 1), min(int(g.x), width - 1)]]
    if kind == "shape_colour":
        s.marks = [m for m in s.marks if m.kind == "shape"]
        return s.page(kind, shapes, rotated=0.0)
    kept = [q for q in fields if not mask[q.box[1]:q.box[3], q.box[0]:q.box[2]].any()]  # no shape touches it
    boxes = {q.box for q in kept}
    s.marks = [m for m in s.marks if m.kind == "field" and m.box in boxes]
    return s.page(kind, kept, rotated=0.0)


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def box_grid(rng: random.Random, width: int, height: int, kind: str) -> Page:
    """30-60 boxes in a grid, a line or two of body text between the rows; most boxes grey-bordered (some filled,
    some in a paler shade of a target's colour), 3-8 in distinct colours. box_word asks for a coloured box's word,
    fine_print for a field in any box. Held out: training never draws it."""
    s = Sheet(rng, width, height, clutter=0.0)
    body, bold = s.faces
    margin, px = rng.randint(8, 24), rng.randint(10, 15)
    n = rng.randint(30, 60)
    widest = s.size("MAX WEIGHT: 0000", body, px)[0] + 24
    cols = max(2, min(round(math.sqrt(n * width / height)), (width - 2 * margin) // widest))
    cell_w = (width - 2 * margin) // cols
    box_h, line_h = int(px * rng.uniform(2.0, 2.8)), int(px * 1.5)
    rows = max(1, min(-(-n // cols), (height - 2 * margin) // (box_h + line_h + 8)))
    pitch = (height - 2 * margin) // rows
    text_lines = max(1, (pitch - box_h - 8) // line_h)  # body text fills the space between rows of boxes
    slots = [(r, c) for r in range(rows) for c in range(cols)]
    coloured = set(rng.sample(range(len(slots)), min(len(slots), rng.randint(3, 8))))
    colours = iter(distinct_colours(rng, len(coloured)))
    words, keys = iter(rng.sample(BOX_WORDS, len(BOX_WORDS))), iter(keys_for(rng, len(slots), stems=0.4))
    questions: list[Question] = []
    for i, (r, c) in enumerate(slots):
        left, top = margin + c * cell_w, margin + r * pitch
        box = (left, top, left + cell_w - 12, top + box_h)
        border = rng.randint(2, 5)
        target = i in coloured and kind == "box_word"
        rgb = COLOURS[colour] if (colour := next(colours) if i in coloured else None) else (
            shade(rng.choice(sorted(COLOURS))) if rng.random() < 0.15 else (rng.randint(90, 160),) * 3)
        fill = s.background if colour or rng.random() < 0.6 else tuple(max(0, ch - 18) for ch in s.background)
        s.draw.rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=fill, outline=rgb, width=border)
        inner_top = top + (box_h - px) // 2
        if kind == "fine_print":
            s.field(next(keys), value(rng), body, px, left + border + 6, inner_top, questions)
        else:
            word = next(words, None) or rng.choice(BOX_WORDS)
            s.write(word, bold if target else body, px, left + border + 6, inner_top, s.ink)
            if target:
                s.marks.append(Mark("box", box, colour=colour, border=border, text=word))
                questions.append(Question(f"What word is in the {colour} box?", word, box, f"{colour}: {word}"))
        if c == cols - 1:
            for line in range(text_lines):
                s.body_line(rng, body, max(9, px - 2), margin, top + box_h + 6 + line * line_h,
                            width - 2 * margin, s.ink)
    return s.page(kind, questions, rotated=0.0)


# -----------------------------------------------------------------------------
# the families, and pages of them


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("scattered", PAGE_KINDS, (0.75, 4 / 3), False, False, scattered),
    Family("form", ("fine_print", "box_word"), (0.7, 0.8), False, False, form),
    Family("table", ("fine_print",), (0.7, 1.4), False, False, table),
    Family("receipt", ("fine_print",), (0.30, 0.45), False, False, receipt),
    Family("slide", PAGE_KINDS, (1.6, 1.8), False, True, slide),
    Family("ledger", ("fine_print",), (0.7, 1.0), True, False, ledger),
    Family("body_text", ("fine_print", "box_word"), (0.7, 0.8), True, False, body_text),
    Family("print_shapes", ("fine_print", "shape_colour"), (0.8, 1.25), True, False, print_shapes),
    Family("box_grid", ("fine_print", "box_word"), (0.8, 1.25), True, True, box_grid),
)}
HELD_OUT = tuple(name for name, f in FAMILIES.items() if f.held_out)  # never drawn by training
TRAINED = tuple(name for name, f in FAMILIES.items() if not f.held_out)


def family_size(family: str, seed: int, size: int, aspect: float | None = None) -> tuple[int, int]:
    """A (width, height) in multiples of CELL px of about size^2 px area in the family's aspect (drawn from the
    seed unless given), never more cells than a size x size page."""
    lo, hi = FAMILIES[family].aspect
    a = aspect or random.Random(f"arr_coc:families:size:{family}:{seed}").uniform(lo, hi)
    cells = (size // CELL) ** 2
    w = max(4, round(size * math.sqrt(a) / CELL))
    h = max(4, min(cells // w, round(size / math.sqrt(a) / CELL)))
    return w * CELL, h * CELL


def make_family_page(family: str, kind: str, seed: int, width: int, height: int | None = None) -> Page:
    """One page of `family` carrying `kind`'s questions: a pure function of its arguments. Redrawn (next sub-seed)
    if no target fit."""
    if family not in FAMILIES:
        raise ValueError(f"unknown layout family {family!r}; expected one of {', '.join(FAMILIES)}")
    if kind not in FAMILIES[family].kinds:
        raise ValueError(f"family {family!r} carries {', '.join(FAMILIES[family].kinds)}, not {kind!r}")
    height = width if height is None else height
    for attempt in range(100):
        rng = random.Random(f"arr_coc:families:{family}:{kind}:{int(seed)}:{attempt}")
        page = FAMILIES[family].draw(rng, width, height, kind)
        if page.questions:
            return page
    raise ValueError(f"no {kind} target fits on a {width}x{height} {family} page")


def ink_cells(image: Image.Image, cell: int = CELL, min_pixels: int = 8) -> int:
    """How many cell x cell px cells hold ink: >= min_pixels pixels at least 64 levels from the paper (the page's
    median colour) in some channel. Faint rules (~25 levels) are not ink."""
    rgb = np.asarray(image.convert("RGB"), dtype=np.int16)  # [H, W, 3]
    paper = np.median(rgb.reshape(-1, 3), axis=0)
    inked = (np.abs(rgb - paper) >= 64).any(-1)  # [H, W]
    gh, gw = rgb.shape[0] // cell, rgb.shape[1] // cell
    counts = inked[:gh * cell, :gw * cell].reshape(gh, cell, gw, cell).sum((1, 3))  # [gh, gw]
    return int((counts >= min_pixels).sum())


def family_pages(families: tuple, n: int, size: int, seed: int, tag: str) -> list[tuple]:
    """n pages of the layout families in turn (each kind they carry in turn), each with one of its questions:
    [(item id, image, question, answer, box)]."""
    pages = []
    for i in range(n):
        family = families[i % len(families)]
        kinds = FAMILIES[family].kinds
        kind, page_seed = kinds[(i // len(families)) % len(kinds)], seed + size * 1000 + i
        page = make_family_page(family, kind, page_seed, *family_size(family, page_seed, size))
        q = random.Random(f"arr_coc:teacher:{tag}:{family}:{kind}:{page_seed}").choice(page.questions)
        pages.append((f"{family}:{kind}:{page_seed}", page.image, q.question, q.answer, q.box))
    return pages


@dataclass
class FamilyPageConfig:
    """`python -m arr_coc.synth.families`'s flags, each field one (arr_coc.flags.flag)."""
    family: str = flags.flag("ledger", "which layout family", flags.one_of(tuple(FAMILIES)))
    kind: str = flags.flag("fine_print", "which questions the page carries", flags.one_of(PAGE_KINDS))
    seed: int = flags.seed_flag(0, "the page")
    size: int = flags.flag(896, "the page's area is about size^2 px, in its aspect", flags.bounded_int(64, 8192))
    out: str = flags.flag("page.png", "where to write the PNG")


def main(argv=None) -> None:
    args = flags.parse_config(FamilyPageConfig, argv, flags.config_parser(FamilyPageConfig, __doc__))
    w, h = family_size(args.family, args.seed, args.size)
    page = make_family_page(args.family, args.kind, args.seed, w, h)
    page.image.save(args.out)
    print(f"{args.family} {w}x{h}: {ink_cells(page.image)} of {(w // CELL) * (h // CELL)} cells inked")
    for q in page.questions:
        print(f"{q.question}  ->  {q.answer}  at {list(q.box)}")


if __name__ == "__main__":
    main()
