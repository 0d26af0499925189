"""The concentration measures, and the busy-image test they decide: noise and dense textures fall back to grid, a
document does not (through the tiny model's observation and the prior layer, as the app runs it)."""

import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.eval.data import make_scene
from arr_coc.pipelines import arr_scene
from arr_coc.pipelines.request import Request
from arr_coc.relevance.concentration import normalised_entropy, top_mass_ratio
from arr_coc.relevance.config import ARRCOCConfig


def noise_image(size=896, seed=0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8))


def stripes_image(size=896) -> Image.Image:
    """A dense periodic texture: two sinusoids finer than a 28 px cell."""
    x = np.arange(size)
    grey = ((np.sin(x[None, :] * 2 * np.pi / 9) + np.sin(x[:, None] * 2 * np.pi / 13)) * 60 + 128).astype(np.uint8)
    return Image.fromarray(np.stack([grey] * 3, -1))


def checker_image(size=896) -> Image.Image:
    x = np.arange(size)
    return Image.fromarray(((((x[:, None] // 6) + (x[None, :] // 6)) % 2) * 255).astype(np.uint8)).convert("RGB")


def test_top_mass_ratio_is_one_for_a_uniform_map_and_large_for_a_peak():
    flat = torch.ones(1, 32, 32)
    peak = torch.zeros(1, 32, 32)
    peak[0, 3, 4] = 1.0
    assert float(top_mass_ratio(flat, 0.02)) == 1.0
    assert float(top_mass_ratio(peak, 0.02)) == pytest.approx(1 / 0.0195, rel=0.01)  # 20 of 1024 cells hold it all
    assert float(normalised_entropy(flat, 0.5)) == pytest.approx(1.0)
    assert float(normalised_entropy(100 * peak, 0.5)) < 0.01


@pytest.mark.parametrize("name, image, busy", [
    ("noise", noise_image(), True),
    ("stripes", stripes_image(), True),
    ("checker", checker_image(), True),
    ("fine-print page", make_scene("fine_print", 0, 1792).image, False),
    ("document", make_scene("document", 0, 896).image, False),
])
def test_busy_images_are_said_busy_and_documents_are_not(arr_model, name, image, busy):
    """A busy image keeps its selection (busy_pages "keep", the default since issue 61) and is recorded as busy."""
    arr_model.layer, layer = arr_model.prior_layer(), arr_model.layer
    try:
        out = arr_scene.prepare(arr_model.parts, arr_model.views(image), "What does it say?", Request()).select(arr_model.layer)
    finally:
        arr_model.layer = layer
    threshold = ARRCOCConfig().void_structure
    assert (float(out.structure[0]) < threshold) == busy, float(out.structure[0])
    assert out.fallback == (["busy"] if busy else [None])


def test_every_checkpoint_agrees_on_busyness(arr_model):
    """The test reads the scorers' priors: a checkpoint whose trained maps are flatter (tiny-charts-documents puts
    the cat at 1.90) judges an image as the prior does, and a photo is not busy."""
    from arr_coc.vlm.images import open_image
    from arr_coc.relevance.layer import choose_checkpoint

    cat, layer = open_image("assets/chelsea.png"), arr_model.layer
    structures = []
    try:
        for name in ("prior", "tiny-charts-documents", "tiny-text-vs-distractor"):
            folder = choose_checkpoint(name, arr_model.vlm.family, arr_model.vlm.hidden_size)
            arr_model.layer = arr_model.load_layer(folder) if folder else arr_model.prior_layer()
            out = arr_scene.prepare(arr_model.parts, arr_model.views(cat), "What colour are the cat's eyes?", Request()).select(
                arr_model.layer)
            assert out.fallback == [None], name
            structures.append(float(out.structure[0]))
    finally:
        arr_model.layer = layer
    assert structures[0] == structures[1] == structures[2] > ARRCOCConfig().void_structure
