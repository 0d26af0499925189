"""The arr pipeline's own bookkeeping (arr_coc.pipelines.arr), with its expectations written out: the saccades as the
app lists them (most relevant first, boxes in the original image), an image block's prompt tokens, and the second
look's size after a fixed or an adaptive first look."""

from types import SimpleNamespace

import torch
from PIL import Image

from arr_coc.pipelines.request import Request
from arr_coc.pipelines.arr import Saccade, block_tokens, saccade_list, second_look_budget
from arr_coc.vlm.views import Views


class Picked(SimpleNamespace):
    """An ARRCOCOutput's fields that saccade_list reads, already in relevance order."""

    def in_order(self, order):
        assert order == "relevance"
        return self


def test_saccades_are_listed_most_relevant_first_with_their_boxes_in_the_image():
    views = Views(Image.new("RGB", (100, 50)), torch.zeros(1, 3, 50, 100, dtype=torch.uint8), (1, 2), (2, 4), (2, 4),
                  (1, 2))  # 2 x 4 candidate cells of 25 px
    out = Picked(positions=torch.tensor([[[1, 3], [0, 1]]]), scores=torch.tensor([[0.75, 0.5]]))
    assert saccade_list(SimpleNamespace(views=views), out, round=2) == [
        Saccade(rank=1, row=1, col=3, score=0.75, box=[75, 25, 100, 50], round=2),
        Saccade(rank=2, row=0, col=1, score=0.5, box=[25, 0, 50, 25], round=2)]


def test_an_image_block_adds_its_start_and_end_tokens_and_an_empty_one_nothing():
    assert block_tokens(273) == 275 and block_tokens(0) == 0


def test_the_second_look_after_an_adaptive_first_is_capped_by_the_cells_left():
    fixed = SimpleNamespace(indices=torch.zeros(1, 273), grid=(32, 32), auto_budget=False)
    adaptive = SimpleNamespace(indices=torch.zeros(1, 1000), grid=(32, 32), auto_budget=True)  # 24 of 1024 left
    assert second_look_budget(Request(), fixed) == 136  # half of 273
    assert second_look_budget(Request(refixate_budget=40), fixed) == 40  # fixed: the allocator says if it cannot fit
    assert second_look_budget(Request(refixate_budget=40), adaptive) == 24
    assert second_look_budget(Request(), adaptive) == 24  # half of 1000, capped
