"""
Behaviour of arr_coc/viz.py: what each drawing shows where, and the two agreement measures.

    .venv/bin/python -m pytest tests/test_viz.py -q
"""


import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgb as hex_to_rgb
from PIL import Image, ImageDraw

from arr_coc import viz
from arr_coc.model import Saccade
from arr_coc.relevance.config import ARRCOCConfig
from arr_coc.relevance.layer import ARRCOCLayer
from arr_coc.relevance.texture import generate_texture_array

CYAN, MAGENTA, WHITE = (0, 255, 255), (255, 0, 255), (255, 255, 255)  # rank 1 and last of RANK_CMAP; labels


def pixel(image: Image.Image, xy) -> tuple:
    return image.getpixel((int(xy[0]), int(xy[1])))


def cell_centre(row, col, grid, size):
    x0, y0, x1, y1 = viz.cell_rect(row, col, grid, size)
    return (x0 + x1) / 2, (y0 + y1) / 2


def has_white(image: Image.Image, rect) -> bool:
    return bool((np.asarray(image.crop((rect[0], rect[1], rect[2] + 1, rect[3] + 1))) == 255).all(-1).any())


def as_saccades(positions: torch.Tensor) -> list[Saccade]:
    return [Saccade(rank=i + 1, row=r, col=c, score=0.0, box=[0, 0, 1, 1])
            for i, (r, c) in enumerate(positions.tolist())]


def layer_output(grid=(8, 8), prior: bool = True):
    """A real ARRCOCOutput from an untrained layer on random pixels (no VLM needed)."""
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=16, budget=10)).eval()
    images = torch.rand(1, 3, grid[0] * 28, grid[1] * 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        maps = layer(generate_texture_array(images, grid), torch.randn(1, 5, 16),
                     participatory_prior=torch.rand(1, *grid) if prior else None)
        return layer.select(maps, grid)


# ----------------------------------------------------------------------------- heatmap


def test_heatmap_is_hotter_where_relevance_is_high():
    image = Image.new("RGB", (512, 512), (128, 128, 128))
    relevance = torch.zeros(8, 8)
    relevance[2, 5] = 1.0
    out = viz.heatmap_overlay(image, relevance)
    hot = np.asarray(pixel(out, cell_centre(2, 5, (8, 8), out.size)), dtype=float)
    cold = np.asarray(pixel(out, cell_centre(6, 1, (8, 8), out.size)), dtype=float)
    assert hot.sum() > cold.sum() + 150
    assert hot[0] > hot[2]  # inferno's hot end is yellow-orange: red over blue


@pytest.mark.parametrize("size, expected", [((451, 300), (768, 511)), ((1000, 500), (1000, 500)),
                                            ((1792, 1792), (1792, 1792)), ((4000, 2000), (2048, 1024)),
                                            ((1, 1), (768, 768))])
def test_heatmap_follows_the_image_within_the_canvas_limits(size, expected):
    out = viz.heatmap_overlay(Image.new("RGB", size), torch.rand(32, 32), key=False)
    assert out.size == expected and out.mode == "RGB"


INFERNO = {0.0: (0, 0, 4), 0.5: (188, 55, 84), 1.0: (252, 255, 164)}  # matplotlib's inferno at 0, 0.5 and 1
COOL_ENDS = ((0, 255, 255), (255, 0, 255))  # and cool's ends: rank 1 cyan, the last rank magenta


def test_the_heatmap_has_its_colour_bar_and_the_ranks_key_below():
    """Issue 67: the Compare heatmap had no colour bar and its cyan / magenta boxes were not explained. A 768 px
    image: the map keeps 768 x 768, a 55 px strip below (16 px text, a 19 px bar 26 px down) holds inferno's bar
    from x = 92 (12% of the width) for 230 px (30%) and the rank colours' bar from x = 422 (55%)."""
    out = viz.heatmap_overlay(Image.new("RGB", (768, 768)), torch.zeros(8, 8), torch.tensor([[1, 1], [2, 2]]))
    assert out.size == (768, 768 + 55)
    y = 768 + 26 + 9  # the bars' middle row
    assert [pixel(out, (x, y)) for x in (92, 92 + 115, 92 + 229)] == [INFERNO[0.0], INFERNO[0.5], INFERNO[1.0]]
    assert (pixel(out, (422, y)), pixel(out, (422 + 229, y))) == COOL_ENDS
    assert pixel(out, (92, 768 + 2)) == WHITE == pixel(out, (92 + 230 + 2, 768 + 26 + 1))  # the strip's white
    no_saccades = viz.heatmap_overlay(Image.new("RGB", (768, 768)), torch.zeros(8, 8))
    assert no_saccades.size == out.size and pixel(no_saccades, (422, y)) == WHITE  # no boxes: no rank bar


def test_rank_one_box_is_drawn_at_its_cell_and_on_top():
    image = Image.new("RGB", (512, 512), (40, 40, 40))
    relevance = torch.rand(8, 8, generator=torch.Generator().manual_seed(0))
    out = viz.heatmap_overlay(image, relevance, torch.tensor([[3, 6], [0, 0]]), key=False)
    x0, y0, x1, y1 = viz.cell_rect(3, 6, (8, 8), out.size)
    assert pixel(out, (x0 + 1, y0 + 1)) == CYAN  # inside the thick rank-1 box
    assert pixel(out, (x1 - 1, y1 - 1)) == CYAN
    assert pixel(out, (x0 - 2, y0 - 2)) == WHITE  # its white ring
    assert pixel(out, (0, 0)) == MAGENTA  # rank 2 of 2: the other end of the rank colormap
    unselected = viz.cell_rect(5, 2, (8, 8), out.size)
    assert pixel(out, unselected[:2]) not in (CYAN, MAGENTA, WHITE)
    assert has_white(out, (x0 + 4, y0 + 4, x1 - 4, y1 - 4))  # the "1" label
    assert not has_white(out, unselected)


def test_saccade_objects_and_positions_draw_the_same():
    image = Image.new("RGB", (300, 200), (90, 120, 30))
    relevance = torch.rand(16, 24)
    positions = torch.tensor([[4, 7], [10, 2], [0, 23]])
    a = viz.heatmap_overlay(image, relevance, positions)
    b = viz.heatmap_overlay(image, relevance.unsqueeze(0), as_saccades(positions))
    assert np.array_equal(np.asarray(a), np.asarray(b))


def lattice(grid, step: int, k: int) -> torch.Tensor:
    """k cells `step` apart in a random order: labels that overflow their cell cannot reach another selected one."""
    rows, cols = torch.meshgrid(torch.arange(0, grid[0], step), torch.arange(0, grid[1], step), indexing="ij")
    cells = torch.stack([rows.flatten(), cols.flatten()], dim=-1)
    return cells[torch.randperm(len(cells), generator=torch.Generator().manual_seed(1))[:k]]


@pytest.mark.parametrize("grid, side, step", [((32, 32), 896, 2), ((64, 64), 1792, 2), ((128, 128), 1792, 4)])
@pytest.mark.parametrize("numbered", [0, None, 100])
def test_every_saccade_gets_a_box_and_only_the_top_n_a_number(grid, side, step, numbered):
    positions = lattice(grid, step, 273)
    kwargs = {} if numbered is None else {"numbered": numbered}
    out = viz.heatmap_overlay(Image.new("RGB", (side, side)), torch.zeros(grid), positions, key=False, **kwargs)
    numbered = viz.TOP_LABELS if numbered is None else numbered
    rects = [viz.cell_rect(r, c, grid, out.size) for r, c in positions.tolist()]
    inset = max(2, (rects[0][2] - rects[0][0]) // 5)  # clear of the boxes and of rank 1's white ring
    labelled = [has_white(out, (x0 + inset, y0 + inset, x1 - inset, y1 - inset)) for x0, y0, x1, y1 in rects]
    assert sum(labelled) == numbered and labelled[:numbered] == [True] * numbered
    colours = viz.rank_colours(len(rects))
    for rank, (x0, y0, x1, y1) in enumerate(rects[1:], start=2):  # every box, in its rank's colour
        if rank > numbered:  # (a number may be wider than a fine grid's cell and cover its box's edge)
            assert pixel(out, (x0, (y0 + y1) / 2)) == colours[rank - 1]


def test_the_two_looks_draw_in_two_colours():
    """A second fixation's boxes are SECOND_LOOK green, the first look's keep their rank colours, a legend says
    which is which; without a second look the drawing is the one-look drawing."""
    grid, first, second = (8, 8), torch.tensor([[1, 1], [2, 5], [6, 2]]), torch.tensor([[4, 4], [0, 7]])
    image, relevance = Image.new("RGB", (768, 768)), torch.zeros(grid)
    one = viz.heatmap_overlay(image, relevance, first, numbered=0, key=False)
    two = viz.heatmap_overlay(image, relevance, first, numbered=0, second=second, key=False)
    assert two.width == one.width and two.height > one.height  # the legend strip below
    colours = viz.rank_colours(len(first))
    for rank, (r, c) in enumerate(first.tolist()[1:], start=2):  # (rank 1 has its white ring)
        x0, y0, x1, y1 = viz.cell_rect(r, c, grid, one.size)
        assert pixel(two, (x0, (y0 + y1) / 2)) == colours[rank - 1] != viz.SECOND_LOOK
    for r, c in second.tolist():
        x0, y0, x1, y1 = viz.cell_rect(r, c, grid, one.size)
        assert pixel(two, (x0, (y0 + y1) / 2)) == viz.SECOND_LOOK == pixel(two, ((x0 + x1) / 2, y1 - 1))
        assert pixel(one, (x0, (y0 + y1) / 2)) != viz.SECOND_LOOK
    assert np.array_equal(np.asarray(viz.heatmap_overlay(image, relevance, first, numbered=0, second=(), key=False)),
                          np.asarray(one))


# ----------------------------------------------------------------------------- saccade mosaic


def noise_view(grid) -> Image.Image:
    """A high-res view of random pixels, grid * 28 px: every cell's crop is unique."""
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (grid[0] * 28, grid[1] * 28, 3), dtype=np.uint8))


def mosaic_tiles(mosaic: Image.Image, k: int, cols: int, tile: int) -> list[np.ndarray]:
    a = np.asarray(mosaic)
    origins = [viz.mosaic_origin(i, cols, (tile, tile), viz.MOSAIC_GAP) for i in range(k)]
    return [a[y:y + tile, x:x + tile] for x, y in origins]


def cell_crop(view: Image.Image, row: int, col: int, scale: int = viz.MOSAIC_SCALE) -> np.ndarray:
    crop = np.asarray(view)[row * 28:(row + 1) * 28, col * 28:(col + 1) * 28]
    return crop.repeat(scale, axis=0).repeat(scale, axis=1)  # nearest-neighbour upscale


def test_mosaic_tile_k_is_the_kth_saccades_cell_in_rank_order():
    grid = (12, 20)  # non-square, as a wide image's native grid is
    view = noise_view(grid)
    positions = lattice(grid, 1, 30)
    out = viz.saccade_mosaic(view, grid, positions, numbered=0)
    cols, tile = 6, 28 * viz.MOSAIC_SCALE  # ceil(sqrt(30)) columns, 5 rows
    gap = viz.MOSAIC_GAP
    assert out.size == (cols * tile + (cols + 1) * gap, 5 * tile + 6 * gap)
    for k, (t, (r, c)) in enumerate(zip(mosaic_tiles(out, 30, cols, tile), positions.tolist())):
        assert np.array_equal(t, cell_crop(view, r, c)), f"tile {k} is not saccade {k + 1}'s cell ({r}, {c})"
    corners = (0, 0), (out.width - 1, out.height - 1)  # a gap, and the empty place at the end of the last row
    assert all(pixel(out, xy) == viz.MOSAIC_BACKGROUND for xy in corners)


@pytest.mark.parametrize("numbered", [0, 7, 30])
def test_mosaic_numbers_exactly_the_first_n_tiles(numbered):
    grid = (8, 8)
    view, positions = noise_view(grid), lattice(grid, 1, 30)
    out = viz.saccade_mosaic(view, grid, as_saccades(positions), numbered=numbered, cols=10)
    tile, gap, band = 28 * viz.MOSAIC_SCALE, viz.MOSAIC_GAP, 26  # band: 0.28 of an 84 px tile, + 2
    banded = {0: 0, 7: 1, 30: 3}[numbered]  # the rows of 10 tiles that hold a numbered one
    assert out.height == 3 * tile + 4 * gap + banded * band
    a = np.asarray(out)
    for k, (r, c) in enumerate(positions.tolist()):  # issue 67: no number covers a tile, each is its cell's pixels
        row, col = divmod(k, 10)
        x, y = gap + col * (tile + gap), gap + row * (tile + gap) + band * min(row + 1, banded)
        assert np.array_equal(a[y:y + tile, x:x + tile], cell_crop(view, r, c)), k
        above = a[y - band:y, x:x + tile] if row < banded else a[y - gap:y, x:x + tile]  # its band, or the gap
        assert bool((above == 255).all(-1).any()) == (k < numbered), k  # white digits on the band: the first n


def test_mosaic_of_no_saccades_is_an_empty_tile():
    out = viz.saccade_mosaic(noise_view((4, 4)), (4, 4), [])
    assert out.size == (28 * viz.MOSAIC_SCALE + 2 * viz.MOSAIC_GAP,) * 2
    assert colour_count(out, viz.MOSAIC_BACKGROUND, 0) == out.width * out.height


# ----------------------------------------------------------------------------- charts


def colour_count(image: Image.Image, rgb, tolerance: int = 2) -> int:
    return int((np.abs(np.asarray(image, dtype=int) - np.asarray(rgb)) <= tolerance).all(-1).sum())


def test_channel_grid_shows_all_13_channels_on_one_scale():
    values = np.arange(13) / 12
    textures = torch.from_numpy(values).view(13, 1, 1).expand(13, 6, 9).float()
    out = viz.channel_grid(textures.unsqueeze(0))
    for v in values:  # every channel is a solid panel in the colour of its own value on the [0, 1] scale
        colour = (np.asarray(plt.get_cmap("viridis")(v)[:3]) * 255).round()
        assert colour_count(out, colour) > 1000, f"no panel for value {v:.2f}"
    with pytest.raises(ValueError, match="13"):
        viz.channel_grid(textures[:12])


@pytest.mark.parametrize("prior", [True, False])
def test_scorer_panels_title_each_map_with_its_weight(prior):
    out = layer_output(prior=prior)
    panels = viz.scorer_panels(out)
    titles = [title for title, _ in panels]
    w = out.weights[0].tolist()
    assert titles[:3] == [f"information (w={w[0]:.2f})", f"perspectival (w={w[1]:.2f})",
                          f"participatory (w={w[2]:.2f})"]
    assert titles[-1] == "balanced relevance" and torch.equal(panels[-1][1], out.relevance[0])
    assert len(panels) == (5 if prior else 4)
    assert ("gestalt attention" in titles[3]) == prior
    image = viz.scorer_maps(out)
    assert image.width > 3 * image.height  # one row of panels


def test_weights_bar_lengths_follow_the_weights():
    weights = [0.8, 0.2, 0.5]
    out = viz.weights_bar(torch.tensor(weights))
    counts = [colour_count(out, np.asarray(hex_to_rgb(c)) * 255, tolerance=1) for c in viz.SCORER_COLOURS]
    assert np.allclose(np.asarray(counts) / counts[0], np.asarray(weights) / weights[0], rtol=0.08)
    with pytest.raises(ValueError, match="3 weights"):
        viz.weights_bar([0.5, 0.5])


def test_weights_bar_draws_each_maps_share_beside_equal_weights():
    """Item 2: weights of 1.00 / 1.00 / 1.00 (the pocket checkpoint's) tell the scorers nothing; the chart beside
    them, each map's share of the saccades' relevance, does (a negative share: a map that held them back)."""
    def bars(image):
        return np.asarray([colour_count(image, np.asarray(hex_to_rgb(c)) * 255, tolerance=1)
                           for c in viz.SCORER_COLOURS], dtype=float)

    shares = np.asarray([0.15, 0.3, 0.55])
    out = viz.weights_bar(torch.ones(3), torch.tensor(shares), 0.4)
    weights, share_bars = bars(out.crop((0, 0, out.width // 2, out.height))), bars(out.crop((out.width // 2, 0,
                                                                                               *out.size)))
    assert np.allclose(weights / weights[0], 1, rtol=0.05)  # equal weights: equal bars
    assert np.allclose(share_bars / share_bars[2], shares / shares[2], rtol=0.08)  # the shares tell them apart
    assert out.width > viz.weights_bar(torch.ones(3)).width
    assert min(viz.weights_bar([0.5, 0.5, 0.5], [-0.2, 0.4, 0.8]).size) > 50
    with pytest.raises(ValueError, match="3 shares"):
        viz.weights_bar([0.5] * 3, [0.5, 0.5])


def test_difference_map_is_red_where_b_is_more_relevant_and_marks_both_sets():
    a, b = torch.zeros(4, 4), torch.zeros(4, 4)
    a[1, 1], b[2, 2] = 1.0, 1.0
    out = viz.difference_map(a, b, [(1, 1)], torch.tensor([[2, 2]]))
    size = viz.canvas_size(4, 4)
    red = pixel(out, viz.cell_rect(2, 2, (4, 4), size)[:2])
    blue = pixel(out, viz.cell_rect(1, 1, (4, 4), size)[:2])
    neutral = pixel(out, cell_centre(0, 3, (4, 4), size))
    assert red[0] > red[2] + 50 and blue[2] > blue[0] + 50 and min(neutral) > 230  # RdBu_r ends: dark red, dark blue
    assert pixel(out, cell_centre(2, 2, (4, 4), size)) == viz.B_MARK
    x0, y0, x1, y1 = viz.cell_rect(1, 1, (4, 4), size)
    assert colour_count(out.crop((x0, y0, x1 + 1, y1 + 1)), viz.A_MARK, tolerance=0) > 100
    assert out.height > size[1]  # the legend strip
    with pytest.raises(ValueError, match="different grids"):
        viz.difference_map(a, torch.zeros(4, 5))


def test_drawings_are_images_and_leave_no_figures():
    out = layer_output(grid=(32, 32))
    image = Image.new("RGB", (900, 700), (50, 100, 150))
    drawings = [lambda: viz.heatmap_overlay(image, out.relevance[0], out.positions[0]),
                lambda: viz.saccade_mosaic(noise_view((32, 32)), (32, 32), out.positions[0]),
                lambda: viz.channel_grid(out.textures[0]), lambda: viz.scorer_maps(out),
                lambda: viz.weights_bar(out.weights[0]),
                lambda: viz.difference_map(out.relevance[0], out.information[0], out.positions[0], out.positions[0])]
    for draw in drawings:
        drawn = draw()
        assert isinstance(drawn, Image.Image) and drawn.mode == "RGB" and min(drawn.size) > 50
        assert len(np.unique(np.asarray(drawn).reshape(-1, 3), axis=0)) > 3  # something drawn, not a blank canvas
    assert plt.get_fignums() == []  # matplotlib figures are closed: a long-running app does not leak them


# ----------------------------------------------------------------------------- agreement


def test_saccade_overlap_is_intersection_over_union():
    cells = torch.tensor([[0, 0], [1, 2], [3, 3]])
    assert viz.saccade_overlap(cells, cells.flip(0)) == 1.0  # order does not matter
    assert viz.saccade_overlap(cells, cells + 10) == 0.0
    assert viz.saccade_overlap(cells, [(1, 2), (3, 3), (5, 5)]) == 0.5  # 2 shared of 4 distinct
    assert viz.saccade_overlap(as_saccades(cells), cells.unsqueeze(0)) == 1.0


def test_average_ranks_share_ties():
    assert viz.average_ranks(np.array([10.0, 20.0, 20.0, 5.0])).tolist() == [2.0, 3.5, 3.5, 1.0]


def test_rank_correlation_is_spearman():
    m = torch.randn(32, 32, generator=torch.Generator().manual_seed(0))
    assert viz.rank_correlation(m, m) == pytest.approx(1.0)
    assert viz.rank_correlation(m, -m) == pytest.approx(-1.0)
    assert viz.rank_correlation(m, torch.exp(3 * m) + m**3) == pytest.approx(1.0)  # monotone: ranks unchanged
    assert viz.rank_correlation(m, m.T) == pytest.approx(viz.rank_correlation(m.T, m))
    # with ties: ranks [1, 2.5, 2.5, 4] against [1, 2, 3, 4] -> 4.5 / sqrt(4.5 * 5) (scipy's spearmanr agrees)
    tied = viz.rank_correlation(np.array([[1, 2, 2, 3]]), np.array([[1, 2, 3, 4]]))
    assert tied == pytest.approx(4.5 / np.sqrt(22.5))
    assert np.isnan(viz.rank_correlation(torch.ones(4, 4), m[:4, :4]))  # a flat map has no ranking


# ----------------------------------------------------------------------------- files


PAGE = "assets/hubble_deep_field.jpg"  # 31x36 native cells, more than ARR reads: it chooses (the 600x400 coffee it
# reads whole, as full does, and has nothing to draw)


def test_save_all_writes_the_four_drawings(arr_model, tmp_path):
    image = Image.open(PAGE)
    answer = arr_model.answer(image, "What is on the saucer?", "arr", max_new_tokens=1)
    paths = viz.save_all(answer, tmp_path / "run")
    assert [p.name for p in paths] == ["heatmap.png", "mosaic.png", "channels.png", "scorers.png"]
    assert Image.open(paths[0]).size == (1000, 872 + 68)  # the page's canvas (1000 x 872, its own size), and its key
    mosaic = Image.open(paths[1]).convert("RGB")
    expected = viz.saccade_mosaic(answer.views.highres, answer.views.candidate_grid, answer.saccades)
    assert np.array_equal(np.asarray(mosaic), np.asarray(expected))
    assert all(Image.open(p).width > 400 for p in paths)
    baseline = arr_model.answer(image, "What is on the saucer?", "gestalt", max_new_tokens=1)
    with pytest.raises(ValueError, match="gestalt pipeline has no ARR output"):
        viz.save_all(baseline, tmp_path / "baseline")


def test_save_all_numbers_a_raster_fed_answer_most_relevant_first(arr_model, tmp_path):
    """`run --save-dir` under a layer that feeds its saccades row by row (as pocket-fineprint does): the heatmap's
    and the mosaic's numbers follow relevance, as `run --json`'s saccades do, not the feed order."""
    from arr_coc.model import ARRCOCQwen

    model = ARRCOCQwen(arr_model.vlm)
    model.layer.config.saccade_order = "raster"
    image = Image.open(PAGE)
    answer = model.answer(image, "What is on the saucer?", "arr", max_new_tokens=1)
    assert answer.arr.saccade_order == "raster" and [s.rank for s in answer.saccades[:3]] == [1, 2, 3]
    heatmap, mosaic = (Image.open(p).convert("RGB") for p in viz.save_all(answer, tmp_path)[:2])
    expected = viz.heatmap_overlay(answer.views.image, answer.arr.relevance[0], answer.saccades)
    assert np.array_equal(np.asarray(heatmap), np.asarray(expected))
    expected = viz.saccade_mosaic(answer.views.highres, answer.views.candidate_grid, answer.saccades)
    assert np.array_equal(np.asarray(mosaic), np.asarray(expected))


def test_rank_numbers_of_clustered_saccades_never_overlap_and_skipped_ones_are_said():
    """A tight 6x6 cluster on a fine grid ("1720", "136103 7" before): numbers move aside, never overlap."""
    grid, canvas = (64, 64), Image.new("RGB", (1792, 1792))
    cells = [(30 + r, 30 + c) for r in range(6) for c in range(6)]
    draw = ImageDraw.Draw(canvas)
    rects = [viz.cell_rect(*c, grid, canvas.size) for c in cells]
    centres = [((x0 + x1) / 2, (y0 + y1) / 2) for x0, y0, x1, y1 in rects]
    typeface = viz.label_font(28, canvas)
    sizes = [viz.label_size(draw, str(rank), typeface) for rank in range(1, len(cells) + 1)]
    assert sizes[0][0] > 28 / 2 and any(viz.overlaps(*pair) for pair in [  # at their centres, numbers would collide
        ((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), (dx - v / 2, dy - g / 2, dx + v / 2, dy + g / 2))
        for (cx, cy), (w, h), (dx, dy), (v, g) in zip(centres, sizes, centres[1:], sizes[1:])])
    spots = viz.place_labels(centres, sizes, canvas.size)
    boxes = [(x - w / 2, y - h / 2, x + w / 2, y + h / 2) for (x, y), (w, h) in
             ((spot, size) for spot, size in zip(spots, sizes) if spot is not None)]
    assert spots[0] == centres[0] and len(boxes) >= 12  # rank 1 keeps its cell; most find a spot nearby
    assert not any(viz.overlaps(a, b, gap=0) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert all(0 <= x0 and 0 <= y0 and x1 <= 1792 and y1 <= 1792 for x0, y0, x1, y1 in boxes)

    skipped = viz.draw_saccades(canvas, cells, grid, numbered=36)
    assert skipped == [rank for rank, spot in enumerate(spots, start=1) if spot is None] and skipped
    noted = viz.heatmap_overlay(Image.new("RGB", (1792, 1792)), torch.zeros(grid), cells, numbered=36, key=False)
    plain = viz.heatmap_overlay(Image.new("RGB", (1792, 1792)), torch.zeros(grid), cells[:1], numbered=1, key=False)
    corner = (0, 1792 - 40, 900, 1792)  # the note says so at the bottom left
    assert has_white(noted, corner) and not has_white(plain, corner)


def test_a_portrait_difference_maps_legend_wraps_inside_it():
    """A narrow (portrait) map: the legend wraps onto more lines instead of running off the right edge."""
    tall = viz.difference_map(torch.rand(60, 20), torch.rand(60, 20))
    wide = viz.difference_map(torch.rand(20, 60), torch.rand(20, 60))
    for out, gh, gw in ((tall, 60, 20), (wide, 20, 60)):
        strip = np.asarray(out)[viz.canvas_size(gw, gh)[1]:]  # the legend under the map
        dark = np.nonzero((strip < 100).all(-1).any(0))[0]
        assert dark.size and dark.max() < out.width - 4, (out.size, dark.max())  # nothing cut at the edge
    assert tall.height - viz.canvas_size(20, 60)[1] > wide.height - viz.canvas_size(60, 20)[1]  # more lines


def test_kept_overlay_boxes_exactly_the_kept_cells_and_shades_only_the_merged_ones():
    grey = Image.new("RGB", (280, 280), (128, 128, 128))  # a 10 x 10 grid of 28 px cells
    drawing = viz.kept_overlay(grey, (10, 10), torch.tensor([[0, 0], [5, 5]]), torch.tensor([[5, 5]]), name="visionzip")
    size = viz.canvas_size(280, 280)
    assert drawing.width == size[0] and drawing.height > size[1]  # the heatmap's canvas, a legend underneath

    def at(image, row, col, where):
        pixels = np.asarray(image).astype(int)
        x0, y0, x1, y1 = viz.cell_rect(row, col, (10, 10), size)
        return tuple(pixels[y0, x0]) if where == "edge" else tuple(pixels[(y0 + y1) // 2, (x0 + x1) // 2])

    assert at(drawing, 0, 0, "edge") == at(drawing, 5, 5, "edge") == viz.KEPT_COLOUR  # both kept cells boxed
    assert at(drawing, 0, 0, "inside") == at(drawing, 3, 7, "inside") == at(drawing, 3, 7, "edge") == (128, 128, 128)
    red, green, blue = at(drawing, 5, 5, "inside")
    assert red > 128 > blue  # the merged cell shaded orange
    other = viz.kept_overlay(grey, (10, 10), torch.tensor([[0, 0], [5, 6]]), torch.tensor([[5, 6]]), name="visionzip")
    assert not np.array_equal(np.asarray(other), np.asarray(drawing))  # another kept set, another drawing
    plain = viz.kept_overlay(grey, (10, 10), torch.tensor([[0, 0], [5, 5]]), name="divprune")  # nothing merged
    assert at(plain, 5, 5, "edge") == viz.KEPT_COLOUR and at(plain, 5, 5, "inside") == (128, 128, 128)


def test_kept_overlay_over_a_relevance_map_shows_the_map():
    grey = Image.new("RGB", (280, 280), (128, 128, 128))
    relevance = torch.zeros(20, 20)
    relevance[:10] = 1.0  # the top half relevant (a finer grid than the reducer's, as ARR's candidate grid is)
    drawing = np.asarray(viz.kept_overlay(grey, (10, 10), torch.tensor([[9, 9]]), relevance=relevance)).astype(int)
    assert drawing[100, 100].sum() > drawing[600, 100].sum()  # hotter where ARR finds more relevance
