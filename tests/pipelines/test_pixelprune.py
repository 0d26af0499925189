"""
PixelPrune and pixelprune_n (arr_coc/pipelines/pixelprune.py): on hand-made pages whose duplicate cells are known,
it keeps exactly the cells worked out by hand below, at their true places; the tokens its LLM reads equal stock
transformers' vision tower run on those cells' own patches at their true rotary positions, and sit at the full
view's M-RoPE places; tau > 0 compares with the reconstruction (no drift); at ARR's count it keeps the most unique.

    python -m pytest -x -q tests/pipelines/test_pixelprune.py
"""

import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.pipelines import pixelprune
from arr_coc.pipelines.request import Request
from arr_coc.pipelines.steps import views_of

QUESTION = "What is written here?"
CELL = 28
# A 4 x 5 page of 28 px cells, each one of five patterns. A cell is dropped when it equals its left or its upper
# neighbour; a duplicate elsewhere (row 0's third A, row 3's A under C) is kept: the coder predicts from neighbours.
PAGE = ["AABBA",
        "ACBCC",
        "DCCCA",
        "DDEAA"]
KEPT = [(0, 0), (0, 2), (0, 4),  # A, B, A (not next to the first A)
        (1, 1), (1, 3),  # C under A; C after B under B (the other B and C: duplicates of their neighbours)
        (2, 0), (2, 4),  # D under A; A after C under C
        (3, 2), (3, 3)]  # E; A after E under C (the last A: its left's duplicate)


def page(layout=PAGE, seed=0) -> Image.Image:
    """The layout drawn with one random 28 x 28 RGB pattern per letter, exactly 28 px a cell (no resize)."""
    rng = np.random.default_rng(seed)
    patterns = {letter: rng.integers(0, 256, (CELL, CELL, 3), dtype=np.uint8) for letter in sorted(set("".join(layout)))}
    rows = [np.concatenate([patterns[letter] for letter in line], axis=1) for line in layout]
    return Image.fromarray(np.concatenate(rows, axis=0))


def read_tokens(model, monkeypatch):
    """Record the image blocks the pipeline hands the LLM (VLM.prompt's images)."""
    seen = []
    prompt = model.vlm.prompt

    def recording(question, images, *args, **kwargs):
        seen.append(images)
        return prompt(question, images, *args, **kwargs)

    monkeypatch.setattr(model.vlm, "prompt", recording)
    return seen


def test_it_keeps_exactly_the_cells_no_neighbour_duplicates(arr_model, monkeypatch):
    views = views_of(arr_model.parts, page())
    assert views.native_grid == (4, 5)  # 112 x 140 px: the native view is the page, cell for cell
    seen = read_tokens(arr_model, monkeypatch)
    answer = arr_model.answer(views, QUESTION, "pixelprune", max_new_tokens=1)
    assert answer.kept.tolist() == [list(c) for c in KEPT]  # raster order, their true (row, col)
    (tokens,), = seen
    assert tokens.positions.tolist() == [list(c) for c in KEPT] and tokens.grid == (4, 5)
    assert answer.tokens.total_visual == len(KEPT) == 9 and answer.pipeline == "pixelprune"


def test_its_tokens_are_the_stock_towers_on_those_cells_at_their_true_places(arr_model, monkeypatch):
    vlm = arr_model.vlm
    views = views_of(arr_model.parts, page())
    seen = read_tokens(arr_model, monkeypatch)
    arr_model.answer(views, QUESTION, "pixelprune", max_new_tokens=1)
    (tokens,), = seen
    stock_in = vlm.image_processor(images=[views.native], do_resize=False, return_tensors="pt")  # 80 patches
    cells = torch.tensor([r * 5 + c for r, c in KEPT])  # raster cell indices; 4 patches each in the stock layout
    patches = stock_in["pixel_values"][(cells[:, None] * 4 + torch.arange(4)).flatten()]  # [36, 1176]
    places = torch.tensor([[2 * r + i, 2 * c + j] for r, c in KEPT for i in (0, 1) for j in (0, 1)])  # [36, 2] (h, w)
    with torch.no_grad():  # the stock tower over these 36 patches as one sequence, rotary at their true places
        stock = vlm.visual(patches.to(vlm.device), grid_thw=torch.tensor([[1, 2, 2 * len(KEPT)]], device=vlm.device),
                           position_ids=places.to(vlm.device)).pooler_output
    assert stock.std() > 1e-3  # not a vacuous comparison
    torch.testing.assert_close(tokens.features, stock, atol=1e-5, rtol=0)
    with torch.no_grad():  # and the LLM reads them at the full view's M-RoPE places for those cells
        full = vlm.prompt(QUESTION, [vlm.encode_view(views.tensor("native"))])
        ours = vlm.prompt(QUESTION, [tokens])
    image = lambda p: p.position_ids[:, 0, p.ids[0] == vlm.image_token_id]  # noqa: E731  [3, K]
    assert torch.equal(image(ours), image(full)[:, cells])


def test_tau_compares_with_the_reconstruction_so_errors_cannot_drift():
    """Flat cells, by hand (levels; "copies" = the kept cell a dropped one is reconstructed from), tau = 4:
    row 0: 100 kept; 103 is 3 from 100: dropped, copies 100; 106 is 6 from that copy (only 3 from 103's own
    pixels): kept; 109 is 3 from 106: dropped; 150 kept.
    row 1: 102 is 2 from the 100 above: dropped; 105 is 5 from both the left's copy (100) and the one above (100):
    kept; 108 is 3 from its left (105): dropped; 111 is 6 from its left's copy (105) and 5 from the one above's
    (106): kept; 152 is 2 from the 150 above: dropped. Comparing with the neighbours' own pixels instead would drop
    106 (3 from 103) and let the error drift along the row. tau = 0: no two cells are equal, every one is kept."""
    levels = torch.tensor([[100, 103, 106, 109, 150], [102, 105, 108, 111, 152]], dtype=torch.float)  # [2, 5]
    pixels = levels[..., None].expand(2, 5, 12)  # [2, 5, P]: flat cells
    assert pixelprune.unique_cells(pixels, 4.0).int().tolist() == [[1, 0, 1, 0, 1],
                                                                   [0, 1, 0, 1, 0]]
    assert pixelprune.unique_cells(pixels, 0.0).all()


def test_tau_reaches_the_pipeline(arr_model):
    """The page with its second A made 3 levels brighter: a near duplicate of its left neighbour. tau = 0 keeps it
    (10 cells), tau = 3 drops it again (the 9 of KEPT), --pixelprune-tau's Request field."""
    pixels = np.asarray(page()).copy()
    pixels[0:CELL, CELL:2 * CELL] = np.clip(pixels[0:CELL, CELL:2 * CELL].astype(int) + 3, 0, 255)  # cell (0, 1)
    image = Image.fromarray(pixels)
    exact = arr_model.answer(image, QUESTION, "pixelprune", max_new_tokens=1, pixelprune_tau=0)
    near = arr_model.answer(image, QUESTION, "pixelprune", max_new_tokens=1, pixelprune_tau=3)
    assert exact.kept.tolist() == sorted([list(c) for c in KEPT] + [[0, 1]]) and len(exact.kept) == 10
    assert near.kept.tolist() == [list(c) for c in KEPT]


def test_the_most_unique_are_those_farthest_from_their_nearest_other_kept_cell():
    """Flat cells at 0, 10, 12, 50, 200 levels: each one's nearest other is 10, 2, 2, 38 and 150 levels away (the
    RMS of a flat difference is the difference); the 3 most unique are 200, 50 and 0: indices 0, 3, 4, ascending.
    With n at least M every cell is kept."""
    pixels = torch.tensor([0.0, 10, 12, 50, 200])[:, None].expand(5, 7)  # [M = 5, P = 7]
    assert pixelprune.most_unique(pixels, 3).tolist() == [0, 3, 4]
    assert pixelprune.most_unique(pixels, 1).tolist() == [4]
    assert pixelprune.most_unique(pixels, 9).tolist() == [0, 1, 2, 3, 4]


def test_at_arrs_count_it_keeps_as_many_as_arr_reads(arr_model):
    """A page of 400 distinct cells (20 x 20 of noise): pixelprune keeps all 400; pixelprune_n keeps ARR's
    visual-token count at the budget, gestalt + budget cells, when that is fewer, and every unique cell when not."""
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (20 * CELL, 20 * CELL, 3), dtype=np.uint8))
    views = views_of(arr_model.parts, image)
    gestalt = views.gestalt_grid[0] * views.gestalt_grid[1]
    assert views.native_grid == (20, 20) and gestalt + 3 < 400
    every = arr_model.answer(views, QUESTION, "pixelprune", max_new_tokens=1, budget=3)
    some = arr_model.answer(views, QUESTION, "pixelprune_n", max_new_tokens=1, budget=3)
    most = arr_model.answer(views, QUESTION, "pixelprune_n", max_new_tokens=1, budget=200)
    assert len(every.kept) == 400 and len(some.kept) == some.tokens.total_visual == gestalt + 3
    assert len(most.kept) == 400 and some.pipeline == "pixelprune_n"
