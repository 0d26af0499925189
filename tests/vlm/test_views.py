"""The views every pipeline reads (arr_coc.vlm.views), with their grids, cell boxes and box coverage written out by
hand: the gestalt grid closest to the image's aspect, the stock processor's native grid, and where a candidate cell
lies in the original image."""

import pytest
import torch
from PIL import Image

from arr_coc.vlm.views import Views, fit_grid, native_grid, resize


@pytest.mark.parametrize("size, grid", [((448, 448), (16, 16)),  # square: 16 x 16 = 256
                                        ((1792, 896), (11, 22)),  # 2:1 -> rows round(sqrt(128)) = 11, cols 22
                                        ((896, 1792), (23, 11)),  # 1:2 -> rows round(sqrt(512)) = 23, cols 256 // 23
                                        ((10, 10), (16, 16))])  # the grid depends on the aspect alone
def test_the_gestalt_grid_is_the_closest_to_the_aspect_under_256_tokens(size, grid):
    assert fit_grid(*size, 256) == grid


@pytest.mark.parametrize("size, grid", [((1792, 1792), (64, 64)),  # 1792 / 28
                                        ((1400, 900), (32, 50)),  # 900 / 28 = 32.1, 1400 / 28 = 50
                                        ((3584, 3584), (64, 64)),  # capped at 4096 cells
                                        ((448, 448), (16, 16)),  # 448 / 28
                                        ((20, 20), (2, 2))])  # raised to 4 cells, as Qwen2-VL's 56 x 56 px
def test_the_native_grid_is_the_stock_processors(size, grid):
    assert native_grid(*size, max_cells=4096) == grid


def _views(width=100, height=50) -> Views:
    image = Image.new("RGB", (width, height))
    pixels = torch.zeros(1, 3, height, width, dtype=torch.uint8)
    return Views(image, pixels, (1, 2), (2, 4), (2, 4), (1, 2))


def test_a_candidate_cells_box_in_the_original_image():
    views = _views()  # 100 x 50 px on a 2 x 4 candidate grid: 25 px cells
    assert views.cell_box(0, 0) == [0, 0, 25, 25]
    assert views.cell_box(1, 3) == [75, 25, 100, 50]


def test_box_coverage_is_the_share_of_each_cell_inside_the_box():
    coverage = _views().box_coverage([30, 0, 60, 25])  # x 30..60 covers 20 px of column 1 and 10 of column 2
    torch.testing.assert_close(coverage, torch.tensor([[0.0, 0.8, 0.4, 0.0], [0.0, 0.0, 0.0, 0.0]]))


def test_resize_keeps_a_view_of_its_own_size_and_scales_uint8_to_one():
    pixels = torch.tensor([[[[0, 255]] * 2] * 3], dtype=torch.uint8).repeat(1, 1, 14, 14)  # [1, 3, 28, 28]
    out = resize(pixels, (1, 1))  # one 28 px cell: the same size, no resampling
    assert out.shape == (1, 3, 28, 28) and out.dtype == torch.float32
    assert out[0, 0, 0, :2].tolist() == [0.0, 1.0]


def test_the_upload_is_the_images_bytes_channels_first():
    """A 3 x 2 RGB image with two known pixels -> [1, 3, 2, 3] uint8, pixel (x, y) at [0, :, y, x]; an RGB image is
    not copied by to_rgb, and a grayscale one is made RGB."""
    from arr_coc.vlm.views import to_rgb, upload

    image = Image.new("RGB", (3, 2))
    image.putpixel((1, 0), (10, 20, 30))
    image.putpixel((2, 1), (200, 100, 50))
    pixels = upload(image, "cpu")
    assert pixels.shape == (1, 3, 2, 3) and pixels.dtype == torch.uint8
    assert pixels[0, :, 0, 1].tolist() == [10, 20, 30] and pixels[0, :, 1, 2].tolist() == [200, 100, 50]
    assert int(pixels.sum()) == 10 + 20 + 30 + 200 + 100 + 50
    assert to_rgb(image) is image
    assert to_rgb(Image.new("L", (3, 2), 7)).getpixel((0, 0)) == (7, 7, 7)


@pytest.mark.parametrize("side, lent", [(1792, True),  # 12.25 MiB of 4-byte pixels: one block, lent by Pillow
                                        (2100, False),  # 16.8 MiB: several blocks, np.asarray's packed copy
                                        (5, True)])
def test_the_upload_reads_pillows_own_memory_where_it_is_lent_and_the_same_bytes_either_way(side, lent):
    """host_pixels takes Pillow's 4-byte pixels through the Arrow C data interface (no packing copy) where the
    image lies in one memory block, and the upload then equals numpy's reading of the image, channels first."""
    import numpy as np

    from arr_coc.vlm.views import host_pixels, upload

    array = np.random.default_rng(side).integers(0, 256, (side, side + 3, 3), dtype=np.uint8)  # [H, W, 3]
    image = Image.fromarray(array)
    assert host_pixels(image).shape == (side, side + 3, 4 if lent else 3)
    assert torch.equal(upload(image, "cpu")[0], torch.from_numpy(array).permute(2, 0, 1))
