"""
viz.teacher_comparison (issue #52's drawing): the teacher's map beside ARR's relevance and their overlap, the asked
box on each; and the arithmetic under it, on hand-made maps: a map as a distribution on a grid, its mass on a box.

    .venv/bin/python -m pytest -q tests/test_viz_teacher.py
"""

import numpy as np
import torch
from PIL import Image

from arr_coc import viz


def test_a_map_becomes_a_distribution_on_a_grid():
    np.testing.assert_allclose(viz.on_grid(torch.tensor([[1.0, 3.0]]), (1, 2)), [[0.25, 0.75]])
    np.testing.assert_allclose(viz.on_grid(np.array([[-1.0, 0.0], [0.0, 0.0]]), (2, 2)), np.full((2, 2), 0.25))
    np.testing.assert_allclose(viz.on_grid(np.ones((2, 2)), (4, 4)), np.full((4, 4), 1 / 16))


def test_the_mass_on_a_box_counts_the_cells_it_touches():
    d = np.array([[0.1, 0.2], [0.3, 0.4]])
    assert viz.box_mass(d, (60, 60, 100, 100), (100, 100)) == 0.4  # cell (1, 1) alone
    assert abs(viz.box_mass(d, (40, 0, 60, 10), (100, 100)) - 0.3) < 1e-12  # cells (0, 0) and (0, 1)


def test_the_comparison_draws_three_panels_and_the_box():
    image = Image.new("RGB", (896, 448), "white")
    teacher = torch.zeros(16, 32)
    teacher[4, 8] = 1.0
    out = viz.teacher_comparison(image, teacher, torch.rand(16, 32), box=(224, 112, 280, 140))
    panel = viz.canvas_size(896, 448)  # each panel at the image's canvas size, 8 px apart
    assert out.width == 3 * panel[0] + 16 and out.height > panel[1]
    sx = panel[0] / 896
    assert out.getpixel((round(224 * sx) + 1, round(125 * sx))) == (0, 255, 0)  # the box's left edge, panel 1
    assert out.getpixel((panel[0] + 8 + round(224 * sx) + 1, round(125 * sx))) == (0, 255, 0)  # and panel 2's
