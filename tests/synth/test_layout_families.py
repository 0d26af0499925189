"""Layout families (arr_coc.synth.families): every answer box holds its answer's ink, one fixed page a family pinned
as written out, dense families dense, the held-out families never drawn by a training stream, and the shipped
pocket model reading held-out-family pages."""

import random

import numpy as np
import pytest

from arr_coc.pocket import data
from arr_coc.pocket.reading import ALPHABET
from arr_coc.synth.families import (DENSE_SHARE, FAMILIES, HELD_OUT, TRAINED, family_size, ink_cells,
                                    make_family_page)

# one page a family, seed 0, about 896^2 px: (family, kind, width, height, questions, first question, answer, box),
# read off the drawn pages by eye (the answer's ink inside the box) when the families were written
PINNED = [
    ("scattered", "fine_print", 840, 952, 23, "What is the value of CODE?", "9942", (214, 929, 310, 941)),
    ("form", "fine_print", 784, 1008, 36, "What is the value of BASE ORDER?", "8378", (27, 58, 95, 82)),
    ("table", "fine_print", 924, 868, 27, "What is the value of DATE?", "5858", (256, 38, 362, 46)),
    ("receipt", "fine_print", 560, 1428, 42, "What is the value of SUB LIMIT?", "3817", (22, 115, 539, 124)),
    ("slide", "fine_print", 1176, 672, 4, "What is the value of MAIN CLASS?", "2073", (352, 115, 574, 132)),
    ("ledger", "fine_print", 896, 896, 50, "What is the value of OLD RANK?", "0176", (9, 9, 126, 19)),
    ("body_text", "fine_print", 784, 1008, 14, "What is the value of MAIN TOTAL?", "0510", (13, 55, 110, 63)),
    ("print_shapes", "fine_print", 1008, 784, 10, "What is the value of NET POWER?", "7652", (230, 38, 348, 48)),
    ("box_grid", "box_word", 868, 924, 4, "What word is in the orange box?", "meadow", (185, 166, 338, 199)),
]
CASES = [(f, k) for f, family in FAMILIES.items() for k in family.kinds]


def test_nine_families_four_dense_two_held_out_one_of_them_dense():
    assert len(FAMILIES) >= 8
    assert sum(f.dense for f in FAMILIES.values()) >= 3
    assert set(HELD_OUT) == {"slide", "box_grid"} and any(FAMILIES[f].dense for f in HELD_OUT)
    assert not set(HELD_OUT) & set(TRAINED) and set(HELD_OUT) | set(TRAINED) == set(FAMILIES)


@pytest.mark.parametrize("family, kind, width, height, count, question, answer, box", PINNED)
def test_one_fixed_page_a_family_is_pinned(family, kind, width, height, count, question, answer, box):
    assert family_size(family, 0, 896) == (width, height)
    page = make_family_page(family, kind, 0, width, height)
    assert page.image.size == (width, height) and len(page.questions) == count
    first = page.questions[0]
    assert (first.question, first.answer, first.box) == (question, answer, box)


def _ink(image, box) -> int:
    """Pixels of the crop at least 64 levels from the page's paper (its median colour) in some channel."""
    rgb = np.asarray(image, dtype=np.int16)
    paper = np.median(rgb.reshape(-1, 3), axis=0)
    x0, y0, x1, y1 = box
    return int((np.abs(rgb[y0:y1, x0:x1] - paper) >= 64).any(-1).sum())


@pytest.mark.parametrize("family, kind", CASES)
def test_every_answer_box_holds_ink_and_each_question_is_asked_once(family, kind):
    for seed in range(3):
        w, h = family_size(family, seed, 672)
        page = make_family_page(family, kind, seed, w, h)
        questions = [q.question for q in page.questions]
        assert len(set(questions)) == len(questions)
        for q in page.questions:
            assert _ink(page.image, q.box) >= 20, (family, seed, q.question, q.box)
        assert {g.char for g in page.glyphs} <= set(ALPHABET)  # every glyph a class of the reading head


def test_a_fields_box_holds_its_values_digits_in_order():
    """The pointing head's targets: inside each field's box, the digits drawn are its value (a key has none)."""
    from arr_coc.pocket.pointing import value_cells

    for family in ("form", "table", "receipt", "ledger", "box_grid"):
        w, h = family_size(family, 1, 896)
        page = make_family_page(family, "fine_print", 1, w, h)
        assert set(value_cells(page.marks, page.glyphs, w)) == {m.key for m in page.marks}


@pytest.mark.parametrize("family", [f for f, family in FAMILIES.items() if family.dense])
def test_dense_families_ink_at_least_1200_cells_at_1792(family):
    for seed in (0, 1):
        w, h = family_size(family, seed, 1792)
        page = make_family_page(family, FAMILIES[family].kinds[0], seed, w, h)
        cells = (w // 28) * (h // 28)
        assert ink_cells(page.image) >= max(1200, DENSE_SHARE * cells), (family, seed)


def test_ink_cells_counts_cells_with_ink_and_not_faint_rules():
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (112, 56), (250, 250, 250))  # 4 x 2 cells
    draw = ImageDraw.Draw(image)
    draw.line([(0, 5), (111, 5)], fill=(225, 225, 225))  # a faint rule through the top row: not ink
    draw.rectangle([30, 30, 40, 40], fill=(20, 20, 20))  # ink in cell (row 1, col 1)
    draw.rectangle([84, 0, 86, 2], fill=(20, 20, 20))  # 9 px in cell (0, 3): ink
    draw.point((60, 40), fill=(20, 20, 20))  # one pixel in cell (1, 2): too little
    assert ink_cells(image) == 2


def test_no_training_stream_draws_a_held_out_family(monkeypatch):
    drawn = []
    real = data.make_family_page

    def spy(family, kind, seed, w, h):
        drawn.append(family)
        return real(family, kind, seed, w, h)
    monkeypatch.setattr(data, "make_family_page", spy)
    for stage in (4, 5):
        for index in range(40):
            data.batch_pages(index, 0, stage, image_tokens=1200, max_pages=2)
    assert drawn and not set(drawn) & set(HELD_OUT)
    assert len(set(drawn)) >= 5  # the trained families are drawn (the test could see a held-out one)
    with pytest.raises(AssertionError):
        data.draw_page(random.Random(0), data.CURRICULUM[5], "box_grid", 448, 448)


# the shipped model on 24 fresh held-out-family pages a kind at 896^2 px (`full`: the whole page at its native view,
# teacher-forced exact match, which is exactly greedy decoding's). The bar is 20 of 24 (0.80); where run 36
# (step 75135) is short of it, the row is a strict xfail with its measured rate on 96 pages, so it turns red the day
# the model clears the bar and the mark must go.
SHORT = {("held-out sparse", "fine_print"): "0.61 [0.51, 0.71] on 96 pages (run 36)",
         ("held-out dense", "fine_print"): "0.46 [0.36, 0.56] on 96 pages (run 36)",
         ("held-out dense", "box_word"): "0.68 [0.58, 0.76] on 96 pages (run 36)"}
SHIPPED_ROWS = [pytest.param(group, kind, marks=pytest.mark.xfail(strict=True, reason=SHORT[group, kind])
                             if (group, kind) in SHORT else ())
                for group, families in (("held-out sparse", ("slide",)), ("held-out dense", ("box_grid",)))
                for kind in sorted({k for f in families for k in FAMILIES[f].kinds})]


@pytest.mark.parametrize("group, kind", SHIPPED_ROWS)
def test_the_shipped_model_reads_20_of_24_fresh_held_out_family_pages(group, kind):
    import torch
    from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

    from arr_coc.checkpoints import POCKET_FOLDER
    from arr_coc.pocket.heldout import GROUPS, correct_count
    from arr_coc.pocket.model import image_processor

    (family,) = GROUPS[group]
    items = []
    for i in range(24):
        seed = 2 * 10**9 + i  # beyond every training and evaluation seed
        page = make_family_page(family, kind, seed, *family_size(family, seed, 896))
        q = random.Random(seed).choice(page.questions)
        items.append((page.image, q.question, q.answer))
    model = Qwen2VLForConditionalGeneration.from_pretrained(POCKET_FOLDER, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(POCKET_FOLDER)
    correct, n = correct_count(model, tokenizer, image_processor(), items, torch.device("cpu"), batch=4)
    assert n == 24 and correct >= 20, f"{group} {kind}: {correct} of 24"
