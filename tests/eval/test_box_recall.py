"""
Box recall for every row of evaluate (arr_coc/eval/metrics.py cells_on_grid, arr_coc/evaluate.py cells_read): a
reducer's kept tokens, (row, col) on the native grid, become candidate cells (one for one when the grids agree;
by cell centre when they do not), VisionZip's merged context tokens do not count as their cell, a stock view reads
every cell, ARR its saccades. Expected cells and scores worked out by hand.

    python -m pytest -x -q tests/eval/test_box_recall.py
"""

from types import SimpleNamespace

import torch

from arr_coc import evaluate
from arr_coc.eval.metrics import box_recall_precision, cells_on_grid


def test_kept_tokens_on_an_agreeing_grid_are_the_same_cells():
    kept = torch.tensor([[0, 1], [2, 3], [1, 0]])  # (row, col) on a 3 x 4 grid: raster 1, 11, 4
    assert cells_on_grid(kept, (3, 4), (3, 4)).tolist() == [1, 4, 11]


def test_kept_tokens_on_a_coarser_grid_cover_the_candidate_cells_whose_centres_they_hold():
    # 2 x 3 -> 4 x 6: each native cell is a 2 x 2 block of candidate cells
    assert cells_on_grid(torch.tensor([[0, 0], [1, 2]]), (2, 3), (4, 6)).tolist() == [0, 1, 6, 7, 16, 17, 22, 23]
    # 3 x 3 -> 4 x 4: candidate row (col) centres at 1/8, 3/8, 5/8, 7/8 of the side fall in native rows 0, 1, 1, 2
    assert cells_on_grid(torch.tensor([[1, 1]]), (3, 3), (4, 4)).tolist() == [5, 6, 9, 10]
    assert cells_on_grid(torch.tensor([[0, 2]]), (3, 3), (4, 4)).tolist() == [3]


def test_a_reducers_recall_and_precision_on_the_candidate_grid():
    """The asked box covers candidate cells 4, 5, 8, 9 of a 4 x 4 grid (rows 1-2, cols 0-1). The reducer kept native
    cells (1, 1) and (0, 2) of a 3 x 3 grid: candidate cells 5, 6, 9, 10 and 3. On the box: 5 and 9, so recall
    2 / 4 and precision 2 / 5."""
    coverage = torch.zeros(4, 4)
    coverage[1:3, 0:2] = 1.0
    read = cells_on_grid(torch.tensor([[1, 1], [0, 2]]), (3, 3), (4, 4))
    assert box_recall_precision(coverage, read) == (0.5, 0.4)


def test_each_row_reads_its_own_cells():
    views = SimpleNamespace(native_grid=(2, 2), candidate_grid=(2, 2))
    visionzip = SimpleNamespace(arr=None, views=views, kept=torch.tensor([[0, 0], [0, 1], [1, 1]]),
                                merged=torch.tensor([[0, 1]]))  # (0, 1) holds merged context, not its own cell
    divprune = SimpleNamespace(arr=None, views=views, kept=torch.tensor([[0, 1], [1, 0]]), merged=None)
    full = SimpleNamespace(arr=None, views=views, kept=None, merged=None)
    arr = SimpleNamespace(arr=SimpleNamespace(indices=torch.tensor([[3, 1]])), fixations=[], views=views)
    assert evaluate.cells_read(visionzip).tolist() == [0, 3]
    assert evaluate.cells_read(divprune).tolist() == [1, 2]
    assert evaluate.cells_read(full).tolist() == [0, 1, 2, 3]  # a stock view reads every cell: recall 1
    assert evaluate.cells_read(arr).tolist() == [3, 1]


def test_the_prior_peaks_on_the_box_only_where_its_highest_cell_touches_it():
    from arr_coc.eval.metrics import peak_on_box
    from arr_coc.vlm.views import box_coverage

    coverage = box_coverage((40, 40, 80, 80), (100, 100), (4, 4))  # a 100 px image, 25 px cells: rows/cols 1-3
    prior = torch.zeros(4, 4)
    prior[0, 0] = 1.0
    assert not peak_on_box(coverage, prior)  # the top-left cell: off the box
    prior[3, 3] = 2.0
    assert peak_on_box(coverage, prior)  # (3, 3) holds a corner of the box (75-80 px)
    assert not peak_on_box(coverage, torch.zeros(4, 4))  # a flat map's first cell, (0, 0): off it
