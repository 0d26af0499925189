"""The fine-print suite: exact question/answer formats, seeded pages, targets that are where their boxes say, and
print sized to be readable at native resolution and unreadable at the gestalt's view of a 1792 px page."""

import re

import numpy as np
import pytest

from arr_coc.eval.fineprint import BOX_WORDS, COLOURS, KEYS, PAGE_KINDS, SHAPES, SPEC, PageStyle, font, make_page

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


def _text_offsets(style: PageStyle) -> set[tuple[int, int]]:
    """(x mod 14, y mod 14) of every fine_print field's ink box top-left, over a few pages."""
    pages = [make_page("fine_print", seed, 448, style=style) for seed in range(12)]
    return {(q.box[0] % 14, q.box[1] % 14) for page in pages for q in page.questions}


def test_jitter_puts_the_targets_text_on_the_patch_lattice_plus_at_most_jitter_px():
    """The training curriculum's pages: a field's ink starts on the ViT's 14 px lattice (plus 0..jitter px);
    the suite's own pages (jitter None) put it at every sub-patch offset."""
    assert _text_offsets(PageStyle(jitter=0)) == {(0, 0)}
    three = _text_offsets(PageStyle(jitter=3))
    assert max(max(offset) for offset in three) == 3 and len(three) > 4
    assert max(max(offset) for offset in _text_offsets(SPEC)) >= 10
