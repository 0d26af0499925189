"""Glances (issue #65): pocket training shows a share of its pages whole at the gestalt's size, with the questions that
view answers, targets only for what it can see.

    python -m pytest -q tests/pocket/test_glance.py
"""

import random

import numpy as np
import pytest

from arr_coc.pocket import data
from arr_coc.pocket.binding import CHANNELS, CLASSES
from arr_coc.synth.fineprint import Mark


def test_where_names_a_box_by_the_third_its_centre_is_in():
    cases = {(0, 0, 10, 10): "top left", (45, 0, 55, 10): "top", (90, 0, 100, 10): "top right",
             (0, 30, 10, 40): "left", (45, 45, 55, 55): "centre", (90, 45, 99, 55): "right",
             (0, 90, 10, 100): "bottom left", (40, 80, 60, 100): "bottom", (70, 70, 100, 100): "bottom right"}
    assert {box: data.where(box, 100, 100) for box in cases} == cases


def test_a_glance_asks_only_what_a_coarse_view_answers_and_nothing_two_marks_share():
    marks = [Mark("box", (0, 0, 300, 100), colour="red", border=8, text="lemon"),
             Mark("box", (1500, 1500, 1700, 1600), colour="blue", border=8, text="plum"),
             Mark("box", (900, 100, 1100, 200), colour="blue", border=8, text="fig"),
             Mark("shape", (800, 800, 1000, 1000), colour="green", shape="circle"),
             Mark("shape", (200, 1200, 300, 1300), colour="green", shape="square"),
             Mark("field", (10, 500, 200, 520), key="LIMIT", text="1234")]
    assert data.glance_questions(marks, 1792, 1792) == [
        ("Where is the red box?", "top left"),
        ("What colour is the circle?", "green"), ("What colour is the square?", "green")]


def test_a_glance_binds_the_scaled_marks_and_leaves_print_untargeted():
    """A 1792 px page shown at 448 px: a box at (896, 896)-(1344, 1120), border 8 px, becomes (224, 224)-(336, 280),
    border 2 px: the cells of rows 8-9, columns 8-11 (28 px cells, 16 a row), every one's centre inside it."""
    marks = [Mark("box", (896, 896, 1344, 1120), colour="red", border=8, text="lemon"),
             Mark("field", (0, 0, 400, 40), key="LIMIT", text="1234")]
    targets = data.glance_bindings(marks, 1792, 1792, (448, 448))  # [256, channels]
    ink = targets[:, CHANNELS.index("ink")].reshape(16, 16)
    red = CLASSES["ink"].index("red")
    assert np.argwhere(ink == red).tolist() == [[8, c] for c in range(8, 12)] + [[9, c] for c in range(8, 12)]
    inside = targets[:, CHANNELS.index("inside")].reshape(16, 16)
    assert np.argwhere(inside == CLASSES["inside"].index("red")).tolist() == np.argwhere(ink == red).tolist()
    for channel in data.UNSEEN:  # the word, the key and the digits: unseen at this size
        assert (targets[:, CHANNELS.index(channel)] == data.IGNORE).all(), channel


def test_a_glance_batch_is_arr_s_gestalt_view_of_each_page_with_no_print_targets():
    from arr_coc.vlm.views import make_views

    pages = []
    real = data.draw_page
    drawn = lambda *a, **k: pages.append(real(*a, **k)) or pages[-1]  # noqa: E731
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(data, "draw_page", drawn)
        images, conversations, readings, gestalt_first, bindings, values = data.glance_pages(
            random.Random(3), data.CURRICULUM[5], None, 1792, 1344, 2048, 4)
    assert len(images) == 4 and not gestalt_first and values == [{}] * 4
    asked = [p for p in pages if data.glance_questions(p.marks, 1792, 1344)]  # pages with nothing to ask: redrawn
    assert len(asked) == 4 and {p.kind for p in pages} <= set(data.GLANCE_KINDS)
    assert all(im.size == (504, 392) for im in images)  # fit_grid(1792, 1344, 256): 14 x 18 tokens of 28 px
    view = make_views(asked[0].image).tensor("gestalt")[0]  # [3, 392, 504]: what ARR's gestalt shows
    assert np.array_equal(np.asarray(images[0]), (view.permute(1, 2, 0) * 255).round().byte().numpy())
    assert all((r == data.IGNORE).all() and r.shape[0] == 14 * 18 for r in readings)
    for questions, page in zip(conversations, asked):
        assert set(questions) <= set(data.glance_questions(page.marks, 1792, 1344))


def test_glances_are_a_share_of_the_last_stages_batches_only():
    def glances(stage, batches):
        return sum((data.batch_pages(i, 0, stage, 2048, 4)[2][0] == data.IGNORE).all() for i in range(batches))

    assert glances(3, 40) == 0
    assert 4 <= glances(5, 60) <= 20  # GLANCE_SHARE of 0.8 + REVIEW's share at stage 4: ~0.13, 8 of 60


def test_the_answer_to_where_a_box_is_points_at_its_border_or_interior():
    """pointing_targets: "Where is the red box?" targets the cells whose ink or interior is red."""
    import torch

    from arr_coc.pocket.pointing import pointing_targets

    binding = np.zeros((4, len(CHANNELS)), dtype=np.int64)  # a 2 x 2 page
    binding[0, CHANNELS.index("ink")] = CLASSES["ink"].index("red")
    binding[3, CHANNELS.index("inside")] = CLASSES["inside"].index("red")
    binding[2, CHANNELS.index("ink")] = CLASSES["ink"].index("blue")
    ids = torch.tensor([[7, 9, 9, 9, 9, 5, 6]])  # 9: the image token, 4 of them; the answer at position 5-6
    labels = torch.tensor([[-100, -100, -100, -100, -100, 5, 6]])
    point_at = pointing_targets([[("Where is the red box?", "top left")]], labels, ids, 9, [binding])
    assert point_at.queries.tolist() == [[0, 4]]
    assert point_at.targets[0].nonzero()[:, 0].tolist() == [1, 4]  # the image tokens at positions 1 and 4


def test_a_glance_batch_holds_at_most_eight_pages():
    """Each glance page is drawn whole before it is shrunk: 8192 image tokens would be 32 pages of 256 tokens."""
    images = data.glance_pages(random.Random(0), data.CURRICULUM[5], None, 896, 896, 8192, 96)[0]
    assert len(images) == 8
