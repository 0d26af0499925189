"""
The example images in assets/: examples.json matches the files, the high-resolution examples regenerate
pixel for pixel, and their small print really needs the native-resolution view (the gestalt cannot read it).

    .venv/bin/python -m pytest tests/test_assets.py -q
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from arr_coc.vlm.views import make_views

ASSETS = Path(__file__).resolve().parents[1] / "assets"
EXAMPLES = json.loads((ASSETS / "examples.json").read_text())
MAX_BYTES = 1_500_000  # each example image stays small enough for the repo and the Space


def make_synthetic():
    """assets/make_synthetic.py as a module (assets/ is not a package)."""
    spec = importlib.util.spec_from_file_location("make_synthetic", ASSETS / "make_synthetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SYNTH = make_synthetic()
HIGHRES = {ex.file for ex in SYNTH.HIGHRES}
HIGHRES_EXAMPLES = [e for e in EXAMPLES if e["image"] in HIGHRES]


def laplacian(image: Image.Image) -> np.ndarray:
    """The 4-neighbour Laplacian of the luminance (valid region, one pixel smaller on every side)."""
    a = np.asarray(image.convert("L"), dtype=np.float64)
    return 4 * a[1:-1, 1:-1] - a[:-2, 1:-1] - a[2:, 1:-1] - a[1:-1, :-2] - a[1:-1, 2:]


def detail_kept(view: Image.Image, image: Image.Image, box) -> float:
    """
    How much of the box's fine detail (its high-pass band) a view keeps: the correlation of the original's
    Laplacian with that of the view scaled back to the original size, inside the box. ~0: nothing legible.
    """
    x0, y0, x1, y1 = box
    crop = np.s_[y0 - 1:y1 - 1, x0 - 1:x1 - 1]  # the Laplacian's index (i, j) is pixel (i + 1, j + 1)
    a = laplacian(image)[crop].ravel()
    b = laplacian(view.resize(image.size, Image.Resampling.BICUBIC))[crop].ravel()
    return float(np.corrcoef(a, b)[0, 1])


def test_every_example_exists_is_small_and_its_box_lies_inside():
    for e in EXAMPLES:
        path = ASSETS / e["image"]
        assert path.stat().st_size < MAX_BYTES, f"{e['image']} is {path.stat().st_size} bytes"
        assert e["question"].strip() and "Expected answer:" in e["note"]
        if e["box"] is not None:
            w, h = Image.open(path).size
            x0, y0, x1, y1 = e["box"]
            assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, f"{e['image']}: box {e['box']} outside {w}x{h}"
    assert len(HIGHRES_EXAMPLES) >= 2


@pytest.mark.parametrize("example", SYNTH.HIGHRES, ids=lambda ex: ex.file)
def test_high_res_examples_regenerate_pixel_for_pixel(example):
    samples = example.draw(example.seed)
    drawn = samples[0].image.quantize(example.colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).convert("RGB")
    stored = Image.open(ASSETS / example.file)
    assert np.array_equal(np.asarray(drawn.convert("RGB")), np.asarray(stored.convert("RGB")))
    listed = [(e["question"], e["box"]) for e in HIGHRES_EXAMPLES if e["image"] == example.file]
    assert listed == [(s.question, list(s.box)) for s in samples]


@pytest.mark.parametrize("example", HIGHRES_EXAMPLES, ids=lambda e: e["question"])
def test_the_gestalt_cannot_resolve_the_print_but_the_native_view_can(example):
    image = Image.open(ASSETS / example["image"]).convert("RGB")
    views = make_views(image)  # the app's defaults: 256 gestalt tokens, 4096 cells
    scale = min(views.gestalt.width / image.width, views.gestalt.height / image.height)
    text_px = SYNTH.PRINT_PX if example["image"] == "synth_invoice_page.png" else SYNTH.SIGN_TEXT_PX
    assert text_px * scale < 4  # glyphs a few pixels high at the gestalt's scale: no letter survives
    assert views.candidate_grid[0] * views.candidate_grid[1] > 4 * views.gestalt_grid[0] * views.gestalt_grid[1]
    gestalt, native = (detail_kept(v, image, example["box"]) for v in (views.gestalt, views.native))
    assert gestalt < 0.2 < 0.6 < native, f"detail kept: gestalt {gestalt:.2f}, native {native:.2f}"
