"""The arr pipeline's own bookkeeping (arr_coc.pipelines.arr), with its expectations written out: the saccades as the
app lists them (most relevant first, boxes in the original image), an image block's prompt tokens, and the second
look's size after a fixed or an adaptive first look."""

from types import SimpleNamespace

import torch
from PIL import Image

from arr_coc.pipelines.arr_options import Options as ArrOptions
from arr_coc.pipelines.request import Request
from arr_coc.pipelines.arr_layout import block_tokens
from arr_coc.pipelines.arr_scene import Saccade, saccade_list
from arr_coc.pipelines.refixation import second_look_budget
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
    assert second_look_budget(Request(options=(ArrOptions(refixate_budget=40),)), fixed) == 40  # fixed: the allocator says if it cannot fit
    assert second_look_budget(Request(options=(ArrOptions(refixate_budget=40),)), adaptive) == 24
    assert second_look_budget(Request(), adaptive) == 24  # half of 1000, capped


def test_cells_forced_in_are_read_and_a_wrong_grid_or_another_pipeline_is_refused(arr_model):
    """ARR's Options.include on the tiny model: the box's cells (on the views' candidate grid: 32 x 32 of 14 px at 448²,
    the box [98, 112, 140, 140] covering rows 8-9, columns 7-9) are among ARR's 40 saccades, which stay unique;
    include on another grid, or for a pipeline without saccades, is refused in one line (also where ARR would read
    the native view whole: the tiny model's 448² holds 16 x 16 cells, fewer than its gestalt plus 40)."""
    import pytest

    from arr_coc.errors import InputError

    image = Image.fromarray((torch.arange(448 * 448 * 3) % 251).to(torch.uint8).view(448, 448, 3).numpy())
    views = arr_model.views(image)
    assert views.candidate_grid == (32, 32)
    box = views.box_coverage([98, 112, 140, 140]) > 0  # [32, 32]
    assert box.nonzero().tolist() == [[8, 7], [8, 8], [8, 9], [9, 7], [9, 8], [9, 9]]
    request = Request(budget=40, max_new_tokens=1,
                      options=(ArrOptions(include=box, upsample=True),))  # choose: its 16x16 native cells
    a = arr_model.answer(views, "What is here?", "arr", request)  # ARR would read whole
    read = a.arr.indices[0].tolist()
    assert len(read) == len(set(read)) == 40 and {8 * 32 + 7, 8 * 32 + 8, 8 * 32 + 9, 9 * 32 + 7, 9 * 32 + 8,
                                                  9 * 32 + 9} <= set(read)
    with pytest.raises(InputError, match="include marks cells of a 16x16 grid; this image's candidate grid is 32x32"):
        arr_model.answer(views, "What is here?", "arr",
                         Request(options=(ArrOptions(include=torch.ones(16, 16, dtype=torch.bool)),)))
    with pytest.raises(InputError, match="need the arr pipeline, not full"):
        arr_model.answer(views, "What is here?", "full", Request(options=(ArrOptions(include=box),)))
