"""The fine-print suite: exact question/answer formats, seeded pages, targets that are where their boxes say, and
print sized to be readable at native resolution and unreadable at the gestalt's view of a 1792 px page; the
held-out layouts (turned filler, boxes in rows, print under shapes)."""

import hashlib
import math

import re

import numpy as np
import PIL
import pytest

from arr_coc.synth.fineprint import (BOX_WORDS, COLOURS, KEYS, PAGE_KINDS, SHAPES, SPEC, PageStyle, font, make_page,
                                     rotated_text)

FORMATS = {  # the exact formats
    "fine_print": (rf"What is the value of ({'|'.join(KEYS)})\?", r"\d{4}"),
    "box_word": (rf"What word is in the ({'|'.join(COLOURS)}) box\?", "|".join(BOX_WORDS)),
    "shape_colour": (rf"What colour is the ({'|'.join(SHAPES)})\?", "|".join(COLOURS)),
}


@pytest.mark.parametrize("kind", PAGE_KINDS)
def test_questions_and_answers_have_the_exact_formats(kind):
    question, answer = FORMATS[kind]
    for seed in range(6):
        page = make_page(kind, seed, 896)
        assert page.kind == kind and page.questions
        subjects = [re.fullmatch(question, q.question).group(1) for q in page.questions]
        assert len(set(subjects)) == len(subjects)  # each question has one target on the page
        assert all(re.fullmatch(answer, q.answer) for q in page.questions)


def test_pages_are_seeded_and_vary():
    a, b = make_page("fine_print", 7, 700, 900), make_page("fine_print", 7, 700, 900)
    assert a.image.size == (700, 900) and np.array_equal(np.asarray(a.image), np.asarray(b.image))
    assert [q.answer for q in a.questions] == [q.answer for q in b.questions]
    c = make_page("fine_print", 8, 700, 900)
    assert not np.array_equal(np.asarray(a.image), np.asarray(c.image))


def test_fine_print_fields_are_within_the_specified_ranges():
    counts = [len(make_page("fine_print", seed, 1792).questions) for seed in range(8)]
    assert all(SPEC.fields[0] <= n <= SPEC.fields[1] for n in counts) and len(set(counts)) > 2


@pytest.mark.parametrize("kind", PAGE_KINDS)
def test_every_target_is_inked_inside_its_box_and_nothing_else_is_dark(kind):
    """Targets are dark ink or saturated colour (a channel < 120); clutter and rules are light gray (>= 150)."""
    page = make_page(kind, 3, 896)
    dark = np.asarray(page.image).min(axis=-1) < 120  # [H, W]
    covered = np.zeros_like(dark)
    for x0, y0, x1, y1 in (q.box for q in page.questions):
        assert dark[y0:y1, x0:x1].any()
        assert not covered[y0:y1, x0:x1].any()  # boxes do not overlap
        covered[y0:y1, x0:x1] = True
    assert not (dark & ~covered).any()


def test_print_is_readable_at_native_resolution_and_not_at_the_gestalt_of_a_1792_page():
    """Cap height of the digits at the suite's font sizes: 7-12 px native, under 3.5 px at the gestalt (1792 -> 448)."""
    def cap_height(px: int) -> int:
        _, top, _, bottom = font(px).getbbox("0123456789")
        return bottom - top

    smallest, largest = cap_height(SPEC.field_font[0]), cap_height(SPEC.field_font[1])
    assert 7 <= smallest and largest <= 13
    assert largest * 448 / 1792 < 3.5


def test_the_transcript_reads_every_target_top_to_bottom():
    page = make_page("fine_print", 2, 896, style=PageStyle(fields=(6, 6)))
    lines = page.transcript.splitlines()
    assert sorted(lines) == sorted(q.text for q in page.questions)
    rows = [next(q.box for q in page.questions if q.text == line)[1] for line in lines]
    assert all((b - a) > -28 for a, b in zip(rows, rows[1:]))  # never more than a text row back up the page


def test_every_drawn_character_is_recorded_where_it_was_drawn():
    """Page.glyphs (the reading targets of pocket training): each field's characters, left to right on one line,
    inside its ink box; nothing but ink is recorded (no spaces)."""
    page = make_page("fine_print", 4, 448)
    glyphs = iter(page.glyphs)
    for q in page.questions:  # targets are drawn first, in the questions' order; clutter follows
        field = [next(glyphs) for _ in q.text.replace(" ", "")]
        assert "".join(g.char for g in field) == q.text.replace(" ", "")
        assert len({g.y for g in field}) == 1 and [g.x for g in field] == sorted(g.x for g in field)
        x0, y0, x1, y1 = q.box
        assert all(x0 <= g.x <= x1 and y0 <= g.y <= y1 for g in field)
    assert len(page.glyphs) > sum(len(q.text) for q in page.questions)  # the clutter's characters too
    assert " " not in {g.char for g in page.glyphs}


@pytest.mark.parametrize("angle", [30.0, -60.0])
def test_turned_filler_runs_at_its_angle(angle):
    """One long line turned by `angle` (counter-clockwise): its ink's principal axis, from the pixels' second
    moments, points along (cos a, -sin a) in image coordinates (y down)."""
    mask = np.asarray(rotated_text(["lorem ipsum dolor sit amet memo item note copy"], 12, angle)) > 127
    ys, xs = np.nonzero(mask)
    cov = np.cov(np.stack([xs, ys]))
    vx, vy = np.linalg.eigh(cov)[1][:, -1]  # the axis of largest spread
    measured = math.degrees(math.atan2(-vy, vx))
    assert min(abs(measured - angle), abs(measured - angle - 180), abs(measured - angle + 180)) < 3


def test_boxes_in_rows_share_top_edges_and_wear_their_colours():
    style = PageStyle(boxes=(6, 8), box_rows=1.0, rotated=1.0)
    for seed in range(4):
        page = make_page("box_word", seed, 896, style=style)
        pixels = np.asarray(page.image)
        tops = [m.box[1] for m in page.marks]
        assert len(set(tops)) <= math.ceil(len(tops) / 2)  # at least two boxes a row
        for m in page.marks:  # the left border, half way down, is the box's colour
            x0, y0, x1, y1 = m.box
            assert tuple(pixels[(y0 + y1) // 2, x0 + 1]) == COLOURS[m.colour]


@pytest.mark.parametrize("style", [PageStyle(print_under_shapes=1.0), PageStyle(fields_under_shapes=1.0)],
                         ids=["lines (held out)", "fields (trained)"])
def test_print_under_shapes_records_only_the_glyphs_left_visible(style):
    """Print in the page's ink and the shapes over part of it: no recorded glyph's centre is painted in a shape's
    colour, and the print runs right up to the shapes."""
    for seed in range(3):
        page = make_page("shape_colour", seed, 896, style=style)
        pixels = np.asarray(page.image)
        colours = {COLOURS[m.colour] for m in page.marks}
        assert (pixels.max(axis=-1) < 115).mean() > 0.0005  # dark ink: neither the clutter's gray nor a shape
        assert len(page.glyphs) > 100
        assert not [g for g in page.glyphs if tuple(pixels[int(g.y), int(g.x)]) in colours]
        near = [g for g in page.glyphs for m in page.marks
                if m.box[0] - 30 <= g.x <= m.box[2] + 30 and m.box[1] - 30 <= g.y <= m.box[3] + 30]
        assert near


def test_the_held_out_layouts_leave_spec_pages_as_they_were():
    """Off (SPEC), the new layouts draw no random number: these pages are, pixel for pixel, the ones drawn before
    the layouts existed (commit 52e998d's generator: their answers and the first 16 hex digits of the SHA-256 of
    their pixels)."""
    pages = [make_page(kind, 11, 448) for kind in PAGE_KINDS]
    assert [[q.answer for q in page.questions] for page in pages] == [
        ["5475", "9956", "7177", "3766", "1654", "0912", "1896", "5523", "1688"],
        ["bridge", "cabin", "pepper", "feather", "tunnel", "garden", "harbor", "mirror"], ["green", "orange"]]
    if PIL.__version__ == "12.3.0":  # the pixels are Pillow's rendering: pinned for the version that drew them
        assert [hashlib.sha256(page.image.tobytes()).hexdigest()[:16] for page in pages] == [
            "0ac8bac76d16c95b", "c7ba017014ccca7e", "1953fcbdf0e74d36"]
