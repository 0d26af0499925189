"""
ARR's two-scale look (arr_coc/pipelines/two_scale.py, ARR's Options.look "two_scale"): the crop's rectangle around the
relevance peak (clamped in-bounds), the crop's tokens against the stock Qwen2-VL processor and vision tower on the
same cropped image, the selection the crop's prior makes (exactly the budget's unique cells, a cell the crop's gaze
points at chosen), and the crop's tokens in ARR's visual-token count (tiny Qwen2-VL, random weights: the counts are
real); the flags and the rows of evaluate.

    .venv/bin/python -m pytest -q tests/pipelines/test_two_scale.py
"""

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from arr_coc import evaluate, run
from arr_coc.errors import InputError
from arr_coc.eval.rows import row_look, split_row
from arr_coc.vlm.flops import vision_gflops
from arr_coc.pipelines import arr_scene
from arr_coc.pipelines.arr_options import Options as ArrOptions, arr_options
from arr_coc.pipelines.request import Request
from arr_coc.pipelines.steps import views_of
from arr_coc.pipelines.two_scale import crop_rect, look_closer
from arr_coc.runtime.timing import Stopwatch

QUESTION = "What is written in the box?"
RUN = ["--image", "assets/chelsea.png", "--question", "hi"]  # the flags run requires


def peaked(grid: tuple[int, int], row: int, col: int) -> torch.Tensor:
    """[GH, GW] of 0.1 with 1.0 at (row, col)."""
    m = torch.full(grid, 0.1)
    m[row, col] = 1.0
    return m


@pytest.mark.parametrize("grid, tokens, peak, rect", [
    ((64, 64), 256, (30, 40), (22, 32, 16, 16)),  # 16 x 16 cells, the peak at (8, 8) of the rectangle
    ((64, 64), 256, (0, 63), (0, 48, 16, 16)),  # the top-right corner: clamped to the grid's last 16 columns
    ((64, 64), 256, (63, 0), (48, 0, 16, 16)),  # the bottom-left corner
    ((64, 64), 64, (5, 5), (1, 1, 8, 8)),  # 64 tokens: 8 x 8 cells, not at an edge
    ((32, 64), 256, (31, 63), (16, 48, 16, 16)),  # a 2:1 page: the same square, in its bottom-right corner
    ((64, 64), 200, (30, 40), (23, 33, 14, 14)),  # 200 tokens: 14 x 14 = 196 cells
    ((10, 64), 256, (5, 5), (0, 0, 10, 16)),  # a grid 10 rows high: the square's rows cut to 10
    ((8, 8), 256, (3, 4), (0, 0, 8, 8)),  # a crop over the whole grid is the grid
])
def test_the_crop_is_centred_on_the_peak_and_kept_in_bounds(grid, tokens, peak, rect):
    assert crop_rect(peaked(grid, *peak), tokens) == rect


def test_a_nan_cell_never_peaks():
    m = peaked((64, 64), 40, 40)
    m[2, 2] = float("nan")
    assert crop_rect(m, 256) == (32, 32, 16, 16)


def photo(side: int = 1792) -> Image.Image:
    """Noise at 64 x 64 cells of 28 px: every crop's tokens differ."""
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (side, side, 3), dtype=np.uint8))


def test_the_crops_tokens_are_the_stock_towers_on_that_crop(arr_model):
    vlm = arr_model.vlm
    image = photo()
    views = views_of(arr_model.parts, image)
    relevance = peaked((64, 64), 10, 50)[None]  # [1, 64, 64]: the crop is cells (2..17, 42..57)
    crop = look_closer(arr_model.parts, views, QUESTION, relevance, 256, Stopwatch(vlm.device))
    assert crop.rect == (2, 42, 16, 16)
    cropped = image.crop((42 * 28, 2 * 28, 58 * 28, 18 * 28))  # the same 448 x 448 px of the page (native already)
    stock = vlm.image_processor(images=[cropped], return_tensors="pt")  # the processor's own conversion, resize on
    assert stock["image_grid_thw"].tolist() == [[1, 32, 32]]  # 32 x 32 patches of 14 px: 16 x 16 tokens
    with torch.no_grad():
        tower = vlm.visual(stock["pixel_values"].to(vlm.device),
                           grid_thw=stock["image_grid_thw"].to(vlm.device)).pooler_output  # [256, D]
    assert tower.std() > 1e-3 and crop.tokens.grid == (16, 16) and len(crop.tokens) == 256
    torch.testing.assert_close(crop.tokens.features, tower, atol=1e-5, rtol=0)
    assert tuple(crop.prior.shape) == (1, 16, 16) and float(crop.prior.min()) == 0 and float(crop.prior.max()) == 1


def page() -> Image.Image:
    """A 1792 px page of even print (the same letters every 56 px): the textures are alike everywhere, so the
    prior decides where ARR looks."""
    image = Image.new("RGB", (1792, 1792), "white")
    draw = ImageDraw.Draw(image)
    for y in range(8, 1792, 56):
        for x in range(6, 1792, 56):
            draw.text((x, y), "ab", fill="black")
    return image


def gazes(vlm, monkeypatch, crop_cell: tuple[int, int], gestalt_tokens: list[int] = (8 * 16 + 8,)):
    """The prior pass's attention made 1 on some tokens, 0 elsewhere: on the gestalt (256 tokens) at gestalt_tokens
    (default token (8, 8)), on a crop of 64 tokens (8 x 8) at crop_cell alone."""
    prior_pass = vlm.prior_pass

    def pointed(question, gestalt, *args, **kwargs):
        out = prior_pass(question, gestalt, *args, **kwargs)
        at = {256: list(gestalt_tokens), 64: [crop_cell[0] * 8 + crop_cell[1]]}[len(gestalt)]
        out.attention = torch.zeros_like(out.attention).index_fill_(0, torch.tensor(at).to(out.attention.device), 1)
        return out

    monkeypatch.setattr(vlm, "prior_pass", pointed)


def test_the_crops_gaze_chooses_the_cells_inside_it(arr_model, monkeypatch):
    """The gestalt points at token (8, 8) (cells 32..35 on the 64 x 64 grid), the crop of 8 x 8 cells around that peak
    at its own cell (0, 7): the cell (top, left + 7) of the page. One look never reads it (the gestalt's gaze does
    not reach it); the two-scale look reads it, among exactly 16 unique cells on the grid."""
    gazes(arr_model.vlm, monkeypatch, (0, 7))
    one = arr_model.answer(page(), QUESTION, "arr", max_new_tokens=1, budget=16, strategy="topk")
    two = arr_model.answer(page(), QUESTION, "arr", max_new_tokens=1, budget=16, strategy="topk", look="two_scale",
                           crop_tokens=64)
    crop = two.observation.crop
    assert (crop.height, crop.width) == (8, 8) and 28 <= crop.top <= 32 and 28 <= crop.left <= 32
    pointed = (crop.top, crop.left + 7)
    cells = [tuple(p) for p in two.arr.positions[0].tolist()]
    assert len(cells) == len(set(cells)) == 16 and all(0 <= r < 64 and 0 <= c < 64 for r, c in cells)
    assert two.arr.fallback[0] is None and pointed in cells
    assert pointed not in [tuple(p) for p in one.arr.positions[0].tolist()]


def test_the_crop_takes_the_budget_first(arr_model, monkeypatch):
    """The gestalt's gaze on its tokens (6..10, 6..10): 20 x 20 cells of a high page prior around the 8 x 8 crop,
    whose own gaze is on one cell. The 16 saccades are all the crop's (its cells lifted above the page's: crop_first),
    the cell it points at among them, though the page's prior stays higher than most of the crop's outside it."""
    gazes(arr_model.vlm, monkeypatch, (3, 3), [r * 16 + c for r in range(6, 11) for c in range(6, 11)])
    two = arr_model.answer(page(), QUESTION, "arr", max_new_tokens=1, budget=16, strategy="topk", look="two_scale",
                           crop_tokens=64)
    crop = two.observation.crop
    cells = [tuple(p) for p in two.arr.positions[0].tolist()]
    assert len(set(cells)) == 16 and (crop.top + 3, crop.left + 3) in cells
    assert all(crop.top <= r < crop.top + 8 and crop.left <= c < crop.left + 8 for r, c in cells), (crop.rect, cells)


def test_the_crops_tokens_count_in_arrs_visual_tokens(arr_model):
    """1792 px: the gestalt's 256 + 64 saccades + the crop's 16 x 16 = 576 (one look: 320); a reducer at ARR's count
    reads as many; the crop's vision pass is counted in the GFLOPs."""
    image = page()
    views = views_of(arr_model.parts, image)
    assert arr_scene.arr_visual_tokens(arr_model.parts, views, Request(budget=64, options=(ArrOptions(look="two_scale"),))) == 576
    assert arr_scene.arr_visual_tokens(arr_model.parts, views, Request(
        budget=64, options=(ArrOptions(look="two_scale", crop_tokens=64),))) == 384
    assert arr_scene.arr_visual_tokens(arr_model.parts, views, Request(budget=64)) == 320
    one = arr_model.answer(views, QUESTION, "arr", max_new_tokens=1, budget=64)
    two = arr_model.answer(views, QUESTION, "arr", max_new_tokens=1, budget=64, look="two_scale")
    t = two.tokens
    assert (t.gestalt, t.saccade, t.crop, t.total_visual, t.text) == (256, 64, 256, 576, one.tokens.text)
    assert two.prefilled == one.prefilled  # the crop is not in the answer's prompt
    reducer = arr_model.answer(views, QUESTION, "divprune", max_new_tokens=1, budget=64, look="two_scale")
    assert reducer.tokens.total_visual == 576
    crop_vision = vision_gflops(arr_model.vlm.model.config.vision_config, 4 * 256)  # 1024 patches
    assert two.compute.vision - one.compute.vision == pytest.approx(crop_vision, rel=1e-6)
    assert two.compute.prefill > one.compute.prefill  # its prior pass


def test_a_bad_look_or_crop_is_refused(arr_model):
    with pytest.raises(InputError, match="look must be one of one, two_scale, got 'three'"):
        arr_model.answer(page(), QUESTION, "arr", max_new_tokens=1, look="three")
    with pytest.raises(InputError, match="crop_tokens .* between 4 and 16384, got 2"):
        arr_model.answer(page(), QUESTION, "arr", max_new_tokens=1, look="two_scale", crop_tokens=2)


def test_evaluate_runs_a_row_per_look():
    args = evaluate.parse_args(["--baselines", "full", "--strategies", "topk", "--looks", "one,two_scale",
                                "--no-oracle"])
    assert evaluate.row_names(args) == ["full", "arr:topk", "arr+two_scale:topk"]
    assert split_row("arr+two_scale:topk") == ("arr", "topk", None, False)
    assert split_row("arr+two_scale+refix:topk") == ("arr", "topk", None, True)
    assert [row_look(r) for r in ("arr:topk", "arr+two_scale:topk", "full")] == ["one", "two_scale", "one"]
    assert [evaluate.look_of(r, args) for r in ("arr:topk", "full", "pixelprune_n")] == ["one", "two_scale",
                                                                                      "two_scale"]


@pytest.mark.parametrize("parse, argv, message", [
    (evaluate.parse_args, ["--crop-tokens", "64"], "argument --crop-tokens: only used with the two_scale look"),
    (evaluate.parse_args, ["--looks", "two_scale", "--strategies", ""], "argument --looks: needs an ARR row"),
    (evaluate.parse_args, ["--looks", "three"], "argument --looks"),
    (run.parse_args, [*RUN, "--crop-tokens", "64"], "argument --crop-tokens: only used with the two_scale look"),
    (run.parse_args, [*RUN, "--look", "two_scale", "--crop-tokens", "2"], "argument --crop-tokens"),
    (run.parse_args, [*RUN, "--look", "two_scale", "--crop-tokens", "2048", "--max-cells", "1024"],
     "argument --crop-tokens: 2048 exceeds --max-cells 1024"),
])
def test_the_flags_are_checked_at_parse_time(parse, argv, message, capsys):
    with pytest.raises(SystemExit) as exit:
        parse(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2 and len(err) == 1 and message in err[0], err


def test_a_request_of_the_flags_carries_the_look():
    from arr_coc.commands import cli

    request = cli.request(run.parse_args([*RUN, "--look", "two_scale", "--crop-tokens", "64"]))
    assert (arr_options(request).look, arr_options(request).crop_tokens) == ("two_scale", 64)
    default = arr_options(cli.request(run.parse_args(RUN)))
    assert (default.look, default.crop_tokens) == ("one", 256)
