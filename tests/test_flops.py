"""Compute estimates: they grow as the work does, and match a hand count for the real 2B architecture."""

import pytest

from arr_coc.vlm.flops import prefill_gflops, vision_gflops
from arr_coc.vlm.tiny import qwen2_vl_2b_config


@pytest.fixture(scope="module")
def config():
    return qwen2_vl_2b_config()


def test_the_2b_vision_tower_costs_what_its_weights_say(config):
    # ~0.6 G ViT parameters: each patch costs about 2 x params FLOPs, plus attention that grows with N^2
    params = sum(p for p in [32 * (4 * 1280**2 + 2 * 1280 * 5120)])
    small = vision_gflops(config.vision_config, 1024)
    assert 2 * params * 1024 / 1e9 < small < 1.3 * 2 * params * 1024 / 1e9
    big = vision_gflops(config.vision_config, 16384)
    assert big > 16 * small  # the quadratic attention term makes 16x the patches cost more than 16x


def test_prefill_counts_layers_tokens_and_the_head(config):
    t = config.text_config
    full = prefill_gflops(t, 560)
    half = prefill_gflops(t, 560, layers=t.num_hidden_layers // 2, logits=False)
    head = 2 * t.hidden_size * t.vocab_size / 1e9
    assert full == pytest.approx(2 * half + head)
    assert 2 * 1.3e9 * 560 / 1e9 < full < 2 * 1.7e9 * 560 / 1e9  # ~1.5 G LLM parameters, 2 FLOPs each per token


def test_an_arr_answer_reports_less_vision_compute_than_full_at_high_resolution(arr_model):
    from PIL import Image
    import numpy as np

    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (1792, 1792, 3), dtype=np.uint8))
    arr = arr_model.answer(image, "What is here?", "arr", max_new_tokens=1)
    full = arr_model.answer(image, "What is here?", "full", max_new_tokens=1)
    assert arr.compute.vision < full.compute.vision / 3 and arr.compute.prefill < full.compute.prefill
    assert arr.to_json()["gflops"]["vision"] > 0
