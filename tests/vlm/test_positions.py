"""M-RoPE positions of ARR's prompt (arr_coc.vlm.positions), written out by hand on tiny grids: the gestalt block,
the sparse saccade block at its cells' true (row, col), and where the text resumes after each. The grids are
taller than wide and wider than tall, so that a swap of rows and columns, or text resuming after rows or columns
instead of their maximum (as stock get_rope_index does), changes a number below."""

import torch

from arr_coc.vlm.positions import ImageBlock, mrope_position_ids, raster_block

PAD, VS, VE = 9, 7, 8  # image pad, <|vision_start|>, <|vision_end|>


def test_the_gestalt_block_the_saccade_block_and_the_text_after_each():
    gestalt = raster_block((3, 2))  # 3 rows, 2 columns: text resumes 3 after its start
    saccades = ImageBlock((4, 6), torch.tensor([[3, 5], [0, 0], [2, 1]]))  # 4 x 6 grid: text resumes 6 after
    # text(2) <vs> 6 gestalt <ve> <vs> 3 saccades <ve> text(2)
    ids = torch.tensor([[1, 2, VS] + [PAD] * 6 + [VE, VS] + [PAD] * 3 + [VE, 5, 6]])
    t, h, w = mrope_position_ids(ids, PAD, [gestalt, saccades])[:, 0].tolist()
    assert t == [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 8, 8, 14, 15, 16]
    assert h == [0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 7, 11, 8, 10, 14, 15, 16]
    assert w == [0, 1, 2, 3, 4, 3, 4, 3, 4, 6, 7, 13, 8, 9, 14, 15, 16]


def test_a_raster_block_lists_its_cells_row_by_row():
    assert raster_block((2, 3)).positions.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]


def test_text_alone_counts_up_on_all_three_axes():
    assert mrope_position_ids(torch.tensor([[4, 5, 6]]), PAD, []).tolist() == [[[0, 1, 2]]] * 3
