"""The fine-print suite: exact question/answer formats, seeded pages, targets that are where their boxes say, and
print sized to be readable at native resolution and unreadable at the gestalt's view of a 1792 px page."""

import re

import numpy as np
import pytest

from arr_coc.synth.fineprint import BOX_WORDS, COLOURS, KEYS, PAGE_KINDS, SHAPES, SPEC, PageStyle, font, make_page

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
