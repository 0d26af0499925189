"""
Dense binding targets (arr_coc.pocket.binding), pinned by what was drawn: a cell named after a colour holds that colour's
pixels; the cells of a box's word name that box's colour and word; the cells of a field's digits name its key and
value. The expectations come from the page's pixels, its questions and its glyphs, never from binding_targets.
"""

import numpy as np
import pytest
import torch

from arr_coc.synth.fineprint import COLOURS, make_page
from arr_coc.pocket.binding import CHANNELS, CLASSES, BindingHead, binding_targets

SIZE = 448
CELL = 28


def _label(targets, channel, cell):
    return CLASSES[channel][targets[cell, CHANNELS.index(channel)]]


def _cell(x, y, width=SIZE):
    return int(y // CELL) * (width // CELL) + int(x // CELL)


def _colour_pixels(page) -> dict[str, np.ndarray]:
    """Per colour, how many of each cell's pixels are exactly that colour (shapes and borders are drawn unblended)."""
    pixels = np.asarray(page.image).reshape(SIZE // CELL, CELL, SIZE // CELL, CELL, 3).transpose(0, 2, 1, 3, 4)
    pixels = pixels.reshape(-1, CELL * CELL, 3)  # [cells, 784, 3]
    return {name: (pixels == np.array(rgb)).all(-1).sum(1) for name, rgb in COLOURS.items()}  # name -> [cells]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_cell_named_after_a_shape_holds_its_colour_and_the_shape_is_the_one_asked_about(seed):
    page = make_page("shape_colour", seed, SIZE)
    targets = binding_targets(page.marks, SIZE, SIZE)
    counts = _colour_pixels(page)
    shape_of = {q.answer: q.question.split()[-1].rstrip("?") for q in page.questions}  # colour -> its shape
    named = 0
    for cell in range(targets.shape[0]):
        ink = _label(targets, "ink", cell)
        drawn = [c for c, n in counts.items() if n[cell] >= 8]  # the colours drawn in this cell
        if ink == "none":
            assert not drawn, (cell, drawn)
            continue
        named += 1
        assert ink in drawn and _label(targets, "shape", cell) == shape_of[ink]
    assert named >= 4 * len(page.questions)  # every shape spans several cells


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_cells_of_a_boxs_word_name_its_colour_and_word_and_its_border_cells_its_colour(seed):
    page = make_page("box_word", seed, SIZE)
    targets = binding_targets(page.marks, SIZE, SIZE)
    glyphs = iter(page.glyphs)  # drawn in order: each box's word, then the clutter
    for q in page.questions:
        colour = q.question.split()[-2]
        for char in q.answer:
            g = next(glyphs)
            assert g.char == char
            cell = _cell(g.x, g.y)
            assert (_label(targets, "inside", cell), _label(targets, "word", cell)) == (colour, q.answer)
    counts = _colour_pixels(page)
    for cell in range(targets.shape[0]):
        ink = _label(targets, "ink", cell)
        assert ink == "none" or counts[ink][cell] >= 8


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_cells_of_a_fields_print_name_its_key_and_value(seed):
    """A cell holding one field's print names that field; a cell shared by two rows of a tight table names one of
    them (the one it holds more of), with that field's value."""
    page = make_page("fine_print", seed, SIZE)
    targets = binding_targets(page.marks, SIZE, SIZE)
    value_of = {q.question.split()[-1].rstrip("?"): q.answer for q in page.questions}

    def fields_in(cell):  # the keys whose ink box overlaps this cell
        x0, y0 = cell % (SIZE // CELL) * CELL, cell // (SIZE // CELL) * CELL
        return {q.question.split()[-1].rstrip("?") for q in page.questions
                if q.box[0] < x0 + CELL and x0 < q.box[2] and q.box[1] < y0 + CELL and y0 < q.box[3]}

    glyphs, alone = iter(page.glyphs), 0  # drawn in order: each field "KEY: NNNN", then the clutter
    for q in page.questions:
        for char in q.text.replace(" ", ""):
            g = next(glyphs)
            assert g.char == char
            cell = _cell(g.x, g.y)
            key, sharing = _label(targets, "key", cell), fields_in(cell)
            assert key in sharing and [_label(targets, f"digit{i}", cell) for i in range(1, 5)] == list(value_of[key])
            if len(sharing) == 1:
                alone += 1
                assert key == q.question.split()[-1].rstrip("?")
    assert alone >= len(page.glyphs) // 4  # most print is not shared


def test_nothing_is_named_on_an_empty_page_and_the_loss_ignores_gestalt_rows():
    assert binding_targets([], 56, 84).tolist() == [[0] * len(CHANNELS)] * 6
    head = BindingHead(8)
    tokens, targets = torch.randn(3, 8), torch.tensor([[1] * len(CHANNELS), [-100] * len(CHANNELS), [0] * len(CHANNELS)])
    with torch.no_grad():
        torch.testing.assert_close(head(tokens, targets), head(tokens[[0, 2]], targets[[0, 2]]))
        torch.testing.assert_close(head(tokens, targets, reduction="sum") / (2 * len(CHANNELS)), head(tokens, targets))


def test_aligned_loss_is_the_cross_entropy_of_scaled_cosines_to_the_names_embeddings_on_marked_cells():
    from arr_coc.pocket.binding import aligned_count, aligned_loss

    embeddings = torch.tensor([[9.0, 9.0], [2.0, 0.0], [0.0, 3.0]])  # [V, H]: token 1 and token 2 name the classes
    ids = {"inside": torch.tensor([1, 2])}  # inside's classes 1 and 2 are tokens 1 and 2
    tokens = torch.tensor([[5.0, 0.0], [1.0, 1.0], [0.0, 7.0], [4.0, 4.0]])  # [N, H]
    targets = torch.zeros(4, len(CHANNELS), dtype=torch.int64)
    targets[:, CHANNELS.index("inside")] = torch.tensor([1, 0, 2, -100])  # row 1: nothing; row 3: a gestalt token
    targets[:, CHANNELS.index("word")] = torch.tensor([3, 0, 0, -100])  # not in ids: not summed here
    # rows 0 and 2 point exactly at their class (cosines 1 and 0): log(1 + e^-10) each
    assert float(aligned_loss(tokens, targets, embeddings, ids)) == pytest.approx(2 * 4.5398899e-05, rel=1e-3)  # fp32
    targets[0, CHANNELS.index("inside")] = 2  # row 0 now names the other class: log(1 + e^10) = 10.0000454
    assert float(aligned_loss(tokens, targets, embeddings, ids)) == pytest.approx(10.0000454 + 4.5398899e-05, rel=1e-6)
    assert int(aligned_count(targets)) == 3  # the marked inside (2) and word (1) labels; key has none


def test_the_aligned_names_are_the_words_as_the_questions_and_answers_write_them():
    from transformers import AutoTokenizer

    from arr_coc.pocket.binding import aligned_ids
    from arr_coc.checkpoints import POCKET_FOLDER

    tokenizer = AutoTokenizer.from_pretrained(POCKET_FOLDER)
    ids = aligned_ids(tokenizer)
    names = {channel: [tokenizer.decode([i]) for i in ids[channel].tolist()] for channel in ids}
    assert names["inside"] == [" blue", " brown", " cyan", " green", " orange", " pink", " purple", " red"]
    assert names["word"][:3] == ["apple", "river", "stone"] and len(names["word"]) == 48
    assert names["key"][0] == " " + CLASSES["key"][1] and len(names["key"]) == 32
