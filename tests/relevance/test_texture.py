"""Behaviour of the 13-channel texture array (docs/ARCHITECTURE.md §1)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from arr_coc.relevance.texture import CHANNEL_NAMES, CHANNELS, generate_texture_array

GRID = (32, 32)


def channel(tex, name):
    return tex[:, CHANNEL_NAMES.index(name)]


def test_channels_are_named_and_unique():
    assert len(CHANNELS) == 13 and len(set(CHANNEL_NAMES)) == 13
    assert all(meaning for _, meaning in CHANNELS)


@pytest.mark.parametrize("shape, grid, work", [
    ((2, 3, 896, 896), (32, 32), (448, 448)),  # the working image divides the view and the grid divides it
    ((1, 3, 1792, 1792), (64, 64), (896, 896)),  # Qwen2-VL's native view at the cap: twice the working image
    ((1, 3, 1344, 1800), (32, 32), (448, 448)),  # a view the working image does not divide
    ((1, 3, 250, 640), (5, 13), (70, 182)),  # neither divides
])
def test_rgb_is_an_area_downsample(shape, grid, work):
    """The colour channels are stock adaptive pooling to the working image (DETAIL_PX a cell), then to the grid."""
    images = torch.rand(*shape)
    expected = F.adaptive_avg_pool2d(F.adaptive_avg_pool2d(images, work), grid)
    torch.testing.assert_close(generate_texture_array(images, grid)[:, :3], expected, atol=1e-5, rtol=0)


def test_colour_variance_is_the_cells_pixel_variance():
    """Two colours in alternate 7 px columns inside each 14 px cell: variance 0.0625 a channel on the red and green,
    none on the blue; the channel is sqrt(4 * mean over RGB) = sqrt(4 * 0.125 / 3)."""
    stripes = (torch.arange(448) // 7 % 2).float()  # [448]: 0, 1 in 7 px runs
    image = torch.stack([stripes * 0.5, 0.5 - stripes * 0.5, torch.full((448,), 0.3)]).view(1, 3, 1, 448)
    tex = generate_texture_array(image.expand(1, 3, 448, 448), GRID)
    torch.testing.assert_close(channel(tex, "colour_variance"), torch.full((1, 32, 32), (0.5 / 3) ** 0.5))


def test_position_channels_run_zero_to_one():
    tex = generate_texture_array(torch.rand(1, 3, 224, 448), (8, 16))
    y, x = channel(tex, "pos_y")[0], channel(tex, "pos_x")[0]
    assert torch.allclose(y[:, 0], torch.linspace(0, 1, 8)) and torch.allclose(x[0], torch.linspace(0, 1, 16))
    assert (y[:, 0] == y[:, -1]).all() and (x[0] == x[-1]).all()


def test_edges_zero_on_flat_and_high_on_checkerboard():
    flat = torch.full((1, 3, 448, 448), 0.5)
    yy, xx = torch.meshgrid(torch.arange(448), torch.arange(448), indexing="ij")
    checker = (((yy // 7) + (xx // 7)) % 2).float().expand(1, 3, -1, -1)  # finer than a cell
    t_flat, t_check = generate_texture_array(flat, GRID), generate_texture_array(checker, GRID)
    for name in ("sobel_x", "sobel_y", "edge_magnitude", "highpass_energy", "colour_variance"):
        assert channel(t_flat, name).max() < 1e-4, name
        assert channel(t_check, name).mean() > 0.2, name


def test_sobel_channels_see_orientation():
    stripes = (torch.arange(448) // 14 % 2).float()
    vertical = stripes.view(1, 1, 1, -1).expand(1, 3, 448, -1)  # columns alternate: vertical edges
    tex = generate_texture_array(vertical, GRID)
    assert channel(tex, "sobel_x").mean() > 0.3 and channel(tex, "sobel_y").max() < 1e-4


def lone_red_disc(size=448, radius=40, centre=(300, 120)):
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    disc = ((yy - centre[0]) ** 2 + (xx - centre[1]) ** 2) <= radius**2
    img = torch.full((1, 3, size, size), 0.5)
    img[0, 0][disc], img[0, 1][disc], img[0, 2][disc] = 1.0, 0.0, 0.0
    return img, centre, radius


@pytest.mark.parametrize("name", ["spectral_saliency", "colour_contrast", "colour_rarity"])
def test_saliency_peaks_on_a_lone_red_disc(name):
    img, (cy, cx), r = lone_red_disc()
    sal = channel(generate_texture_array(img, GRID), name)[0]  # [32, 32]
    row, col = divmod(int(sal.argmax()), 32)
    cell = 448 / 32
    dist = (((row + 0.5) * cell - cy) ** 2 + ((col + 0.5) * cell - cx) ** 2) ** 0.5
    assert dist <= r + cell, f"{name} peaks at cell {(row, col)}, {dist:.0f}px from the disc centre"


@pytest.mark.parametrize("kind", ["black", "white", "noise", "one_pixel", "non_square_grid"])
def test_every_channel_stays_in_range(kind):
    images = {"black": torch.zeros(1, 3, 448, 448), "white": torch.ones(1, 3, 448, 448),
              "noise": torch.rand(2, 3, 300, 500), "one_pixel": torch.rand(1, 3, 1, 1),
              "non_square_grid": torch.rand(1, 3, 112, 812)}[kind]
    grid = (4, 29) if kind == "non_square_grid" else GRID
    tex = generate_texture_array(images, grid)
    assert tex.shape == (images.shape[0], 13, *grid)
    assert torch.isfinite(tex).all() and tex.min() >= 0 and tex.max() <= 1


def test_no_channel_duplicates_another():
    tex = generate_texture_array(torch.rand(1, 3, 448, 448) * torch.linspace(0, 1, 448).view(1, 1, 1, -1), GRID)
    flat = tex[0].flatten(1)
    for i in range(13):
        for j in range(i + 1, 13):
            assert not torch.allclose(flat[i], flat[j], atol=1e-3), (CHANNEL_NAMES[i], CHANNEL_NAMES[j])


def test_runs_without_grad_on_the_input_device():
    images = torch.rand(1, 3, 64, 64, requires_grad=True)
    tex = generate_texture_array(images, (4, 4))
    assert not tex.requires_grad and tex.device == images.device


def test_only_an_image_with_nothing_in_it_is_flat():
    from arr_coc.relevance.texture import is_flat

    flat = generate_texture_array(torch.full((2, 3, 448, 448), 0.3), GRID)
    busy = generate_texture_array(torch.rand(1, 3, 448, 448), GRID)
    faint = torch.full((1, 3, 448, 448), 0.3)
    faint[..., 200:240, 200:240] = 0.33  # a faint square still counts
    assert is_flat(flat).tolist() == [True, True] and is_flat(busy).tolist() == [False]
    assert is_flat(generate_texture_array(faint, GRID)).tolist() == [False]


def test_minmax_is_per_image_floors_rounding_and_ignores_non_finite():
    from arr_coc.relevance.texture import minmax

    x = torch.tensor([[[1.0, 3.0], [2.0, 5.0]], [[0.5, 0.5], [0.5, 0.5 + 1e-6]]])  # a map, and one flat up to rounding
    out = minmax(x)
    torch.testing.assert_close(out[0], torch.tensor([[0.0, 0.5], [0.25, 1.0]]))  # each image on its own range
    assert out[1].max() < 0.02  # rounding is not stretched to 0..1
    assert minmax(x, floor=0)[1].max() == 1.0  # floor=0: any span is scaled
    nan = minmax(torch.tensor([[float("nan"), 2.0, 4.0, float("inf")]]), floor=0)
    torch.testing.assert_close(nan, torch.tensor([[0.0, 0.0, 1.0, 0.0]]))
    assert not minmax(torch.full((1, 3), float("nan"))).any()


def test_the_package_has_one_minmax():
    """the prior's attention upsampling and viz's heat maps scale through texture.minmax, not copies of it."""
    from arr_coc import viz
    from arr_coc.relevance import prior

    m = prior.upsample_map(torch.tensor([0.0, 1.0, 2.0, 3.0]), (2, 2), (4, 4))
    assert m.min() == 0 and m.max() == 1
    assert not prior.upsample_map(torch.full((4,), 0.7), (2, 2), (4, 4)).any()  # flat: zeros
    flat = viz.normalise(np.full((3, 3), 0.25))
    assert not flat.any() and viz.normalise(np.array([[np.nan, 1.0], [3.0, 2.0]])).tolist() == [[0, 0], [1, 0.5]]
