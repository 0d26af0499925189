"""
The Qwen3-VL adapter against the stock Qwen3-VL (tiny, fp32): patches, the sparse tower with its interpolated
pos_embed and DeepStack features, M-RoPE ids, the Decoder with DeepStack (logits, prior, greedy tokens), and
the pipelines end to end.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from conftest import answers_by_engine, stock_inputs

from arr_coc.vlm.positions import ImageBlock, raster_block
from arr_coc.vlm.views import make_views

QUESTION = "What is written on the sign?"


def photo(w=400, h=300, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def q3():
    """ARRCOCQwen over the tiny Qwen3-VL, fp32 (exact comparisons)."""
    from arr_coc.model import ARRCOCQwen

    return ARRCOCQwen.from_pretrained("tiny-qwen3-vl", dtype=torch.float32)


def views_of(vlm, image, **kwargs):
    return make_views(image, device=vlm.device, cell=vlm.cell, **kwargs)


def test_the_family_and_cell(q3):
    from arr_coc.vlm.qwen3_vl import Qwen3VL

    assert isinstance(q3.vlm, Qwen3VL) and q3.vlm.family == "qwen3_vl" and q3.vlm.cell == 32


def test_device_patches_equal_the_image_processor(q3):
    vlm = q3.vlm
    view = views_of(vlm, photo(333, 517)).highres
    stock = vlm.image_processor(images=[view], do_resize=False, return_tensors="pt")
    pixels, grid = vlm.image_inputs(view)
    assert pixels.shape[1] == 3 * 2 * 16 * 16
    assert torch.equal(grid.cpu(), stock["image_grid_thw"])
    torch.testing.assert_close(pixels.cpu(), stock["pixel_values"], atol=1e-5, rtol=0)


def test_sparse_encoder_on_every_cell_equals_the_stock_tower_with_deepstack(q3):
    vlm = q3.vlm
    views = views_of(vlm, photo(1400, 900))  # native, non-square: 28 x 44 cells of 32 px
    assert views.candidate_grid == views.native_grid and views.candidate_grid[0] != views.candidate_grid[1]
    pixels, grid = vlm.image_inputs(views.highres)
    with torch.no_grad():
        stock = vlm.visual(pixels, grid_thw=grid)
        sparse = vlm.encode_cells(pixels, views.candidate_grid, raster_block(views.candidate_grid).positions)
        whole = vlm.encode_view(views.highres)
    assert len(stock.deepstack_features) == 2 and sparse.deepstack.shape == (2, *sparse.shape)
    for ours in (sparse, whole):
        torch.testing.assert_close(ours, stock.pooler_output, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.deepstack, torch.stack(stock.deepstack_features), atol=1e-5, rtol=0)


def test_any_cell_subset_gets_the_interpolated_pos_embed_of_its_own_patches(q3):
    """The pos_embed of selected patches = the learned grid bilinearly resized to the whole view's patch grid, there."""
    vlm = q3.vlm
    visual = vlm.visual
    grid = (7, 11)
    pixels = torch.zeros(4 * grid[0] * grid[1], 3 * 2 * 16 * 16)
    cells = torch.tensor([[6, 10], [0, 0], [3, 4], [2, 9]])
    _, patch_positions, taps, weights = vlm._vision_inputs(pixels, grid, cells)
    ours = (visual.pos_embed(taps) * weights[:, :, None]).sum(1)  # [16, E]
    side = visual.num_grid_per_side
    table = visual.pos_embed.weight.T.reshape(1, -1, side, side)  # [1, E, side, side]
    resized = F.interpolate(table, size=(2 * grid[0], 2 * grid[1]), mode="bilinear", align_corners=True)[0]
    expected = resized[:, patch_positions[:, 0], patch_positions[:, 1]].T  # [16, E]
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_sparse_tokens_are_a_set_at_their_true_positions(q3):
    vlm = q3.vlm
    views = views_of(vlm, photo())
    pixels, _ = vlm.image_inputs(views.highres)
    cells = torch.tensor([[3, 4], [10, 2], [0, 0]])
    with torch.no_grad():
        a = vlm.encode_cells(pixels, views.candidate_grid, cells)
        b = vlm.encode_cells(pixels, views.candidate_grid, cells[[2, 0, 1]])
    torch.testing.assert_close(a[[2, 0, 1]], b, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.deepstack[:, [2, 0, 1]], b.deepstack, atol=1e-5, rtol=0)


@pytest.mark.parametrize("view", ["gestalt", "highres"])
def test_position_ids_follow_qwen3_get_rope_index(q3, view):
    vlm = q3.vlm
    views = views_of(vlm, photo(1400, 500))
    grid = {"gestalt": views.gestalt_grid, "highres": views.candidate_grid}[view]
    ids, pixels, thw, mm = stock_inputs(vlm, getattr(views, view), QUESTION)
    stock, _ = vlm.model.model.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=thw)
    assert torch.equal(vlm.position_ids(ids, [raster_block(grid)]), stock)


def gestalt_prompt(vlm, image=None, question=QUESTION):
    views = views_of(vlm, image or photo())
    ids, pixels, grid, mm = stock_inputs(vlm, views.gestalt, question)
    with torch.no_grad():
        embeds = vlm.embed(ids, [vlm.encode_view(views.gestalt)])
    return views, ids, pixels, grid, mm, embeds, vlm.position_ids(ids, [raster_block(views.gestalt_grid)])


def test_zero_saccades_reproduce_the_stock_logits_with_deepstack(q3):
    vlm = q3.vlm
    decoder = vlm.decoder
    views, ids, pixels, grid, mm, embeds, positions = gestalt_prompt(vlm)
    assert embeds.deepstack.shape == (2, *embeds.shape)
    last = torch.tensor([ids.shape[1] - 1])
    with torch.no_grad():
        stock = vlm.model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=mm).logits
        decoder._state(1024, embeds.dtype)
        ours = decoder._prefill(embeds, positions, last, 1024, embeds.deepstack)  # [1, V]
        without = decoder._prefill(embeds, positions, last, 1024)
    torch.testing.assert_close(ours, stock[:, -1], atol=1e-5, rtol=0)
    assert (without - stock[:, -1]).abs().max() > 1e-3  # DeepStack matters: dropping it would show


def test_the_prior_equals_the_eager_attention_with_deepstack(q3):
    from transformers import Qwen3VLForConditionalGeneration

    from arr_coc.vlm.tiny import tiny_model_path

    vlm = q3.vlm
    views, ids, pixels, grid, mm, embeds, positions = gestalt_prompt(vlm, question="Where is the cat?")
    at = (ids[0] == vlm.image_token_id).nonzero()[:, 0]
    span, query_start = (int(at[0]), int(at[-1]) + 1), int(at[-1]) + 2
    with torch.no_grad():
        ours = vlm.gestalt_attention("Where is the cat?", vlm.encode_view(views.gestalt), views.gestalt_grid, 0.5)
        eager = Qwen3VLForConditionalGeneration.from_pretrained(tiny_model_path("tiny-qwen3-vl"), dtype=torch.float32,
                                                                attn_implementation="eager").to(vlm.device)
        mask = ids == vlm.image_token_id
        out = eager.model.language_model(inputs_embeds=embeds, position_ids=positions, visual_pos_masks=mask,
                                         deepstack_visual_embeds=[d[mask] for d in embeds.deepstack],
                                         output_attentions=True)
    expected = out.attentions[2][0, :, query_start:, span[0]:span[1]].mean(dim=(0, 1))  # layer 4 * 0.5
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-4)


def test_greedy_tokens_equal_stock_generate_from_pixels(q3):
    """Zero saccades through the fast engine (our embeddings + DeepStack) = stock generate() from pixel_values."""
    vlm = q3.vlm
    views, ids, pixels, grid, mm, embeds, positions = gestalt_prompt(vlm, photo(seed=3))
    with torch.no_grad():
        stock = vlm.model.generate(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=mm,
                                   attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                                   eos_token_id=None)[:, ids.shape[1]:]
    ours = vlm.generate(10, inputs_embeds=embeds, position_ids=positions)
    eos = set(vlm.eos_token_ids)
    stop = next((i + 1 for i, t in enumerate(stock[0].tolist()) if t in eos), 10)
    assert ours.tolist() == stock[:, :stop].tolist()


def test_arr_answers_with_273_ordered_unique_saccades(q3):
    a = q3.answer(photo(900, 700), QUESTION, "arr", max_new_tokens=4)
    cells = [(s.row, s.col) for s in a.saccades]
    assert a.tokens["saccade"] == 273 and len(cells) == 273 == len(set(cells))
    assert [s.rank for s in a.saccades] == list(range(1, 274))
    assert all(x.score >= y.score for x, y in zip(a.saccades, a.saccades[1:]))
    gh, gw = a.views.candidate_grid
    assert all(0 <= r < gh and 0 <= c < gw for r, c in cells)


def test_zero_saccades_answer_as_the_stock_gestalt_baseline(q3):
    vlm = q3.vlm
    try:
        vlm.engine = "hf"
        stock = q3.answer(photo(seed=4), QUESTION, "gestalt", max_new_tokens=8)
    finally:
        vlm.engine = "fast"
    arr = q3.answer(photo(seed=4), QUESTION, "arr", max_new_tokens=8, budget=0)
    assert arr.tokens["saccade"] == 0 and arr.text == stock.text and arr.new_tokens == stock.new_tokens


@pytest.mark.parametrize("pipeline", ["full", "gestalt", "budget"])
def test_baselines_answer_the_same_with_both_engines(q3, pipeline):
    answers = answers_by_engine(q3, photo(700, 500), QUESTION, pipeline)
    assert answers["fast"].text == answers["hf"].text and answers["fast"].tokens == answers["hf"].tokens


def test_the_hf_engine_refuses_arr_embeddings_it_would_strip_of_deepstack(q3):
    vlm = q3.vlm
    try:
        vlm.engine = "hf"
        with pytest.raises(ValueError, match="DeepStack"):
            q3.answer(photo(), QUESTION, "arr", max_new_tokens=2)
    finally:
        vlm.engine = "fast"
    with pytest.raises(ValueError, match="DeepStack"):  # features that lost their DeepStack are refused, not dropped
        views, ids, *_ = gestalt_prompt(vlm)
        vlm.embed(ids, [vlm.encode_view(views.gestalt).clone()])


def test_the_chat_template_comes_from_the_folder(q3):
    from arr_coc.vlm.tiny import QWEN3_VL_CHAT_TEMPLATE, tiny_model_path

    vlm = q3.vlm
    saved = json.loads((tiny_model_path("tiny-qwen3-vl") / "tokenizer_config.json").read_text()).get("chat_template")
    on_disk = saved or (tiny_model_path("tiny-qwen3-vl") / "chat_template.jinja").read_text()
    assert vlm.chat_template == on_disk == QWEN3_VL_CHAT_TEMPLATE
    text = vlm.tokenizer.decode(vlm.prompt_ids("Why?", [3])[0])
    assert text == ("<|im_start|>user\n<|vision_start|>" + "<|image_pad|>" * 3 +
                    "<|vision_end|>Why?<|im_end|>\n<|im_start|>assistant\n")  # no default system prompt


def test_run_cli_with_the_tiny_qwen3_vl(tmp_path):
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "arr_coc.run", "--model", "tiny-qwen3-vl", "--image",
                           "assets/chelsea.png", "--question", QUESTION, "--max-new-tokens", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["model"] == "tiny-qwen3-vl" and report["pipelines"]["arr"]["tokens"]["saccade"] == 273


def test_random_weights_build_the_family_adapter_for_the_bench():
    from arr_coc.model import ARRCOCQwen
    from arr_coc.vlm.families import random_vlm
    from arr_coc.vlm.qwen3_vl import Qwen3VL
    from arr_coc.vlm.tiny import FULL_SIZE, QWEN3_VL_CHAT_TEMPLATE, tiny_qwen3_vl_config

    vlm = random_vlm(tiny_qwen3_vl_config(), "cpu", torch.float32, "random tiny Qwen3-VL")
    assert isinstance(vlm, Qwen3VL) and vlm.cell == 32 and vlm.chat_template == QWEN3_VL_CHAT_TEMPLATE
    assert ARRCOCQwen(vlm).answer(photo(), QUESTION, "arr", max_new_tokens=2).tokens["saccade"] == 273
    assert FULL_SIZE["qwen3_vl"][1]().model_type == "qwen3_vl"


@pytest.mark.gpu
def test_graphed_paths_equal_eager_on_cuda():
    """Vision (with pos_embed and DeepStack), prefill with DeepStack, the prior and decode: graphs = eager."""
    from arr_coc.model import ARRCOCQwen

    model = ARRCOCQwen.from_pretrained("tiny-qwen3-vl", device="cuda", dtype=torch.float32)
    vlm = model.vlm
    scene = model.prepare(photo(900, 700), QUESTION)
    out = model.select(scene)
    pixels, _ = vlm.image_inputs(scene.views.highres)
    blocks = [raster_block(scene.views.gestalt_grid), ImageBlock(scene.views.candidate_grid, out.positions[0].cpu())]
    results = {}
    for graphs in (True, False):
        vlm.decoder.graphs_enabled = graphs
        with torch.no_grad():
            features = [vlm.encode_view(scene.views.tensor("gestalt")),
                        vlm.encode_cells(pixels, scene.views.candidate_grid, out.positions[0])]
            prompt = vlm.prompt(QUESTION, list(zip(features, blocks)))
            prior = vlm.gestalt_attention(QUESTION, features[0], scene.views.gestalt_grid)
            tokens = vlm.generate(12, inputs_embeds=prompt.embeds, position_ids=prompt.position_ids)
        results[graphs] = (features[1], features[1].deepstack, features[0].deepstack, prior, tokens)
    vlm.decoder.graphs_enabled = True
    assert len(vlm.graphed_vision.graphs) >= 2 and vlm.decoder.decode_graphs  # the graphed run did use graphs
    for graphed, eager in zip(results[True][:4], results[False][:4]):
        torch.testing.assert_close(graphed, eager, atol=1e-4, rtol=1e-4)
    assert results[True][4].tolist() == results[False][4].tolist()


def test_training_runs_on_the_tiny_qwen3_vl(tmp_path):
    """The answer loss keeps the saccades' DeepStack features and reaches the ARR layer (VLM frozen)."""
    from arr_coc.train import TrainConfig, train

    cfg = TrainConfig(model="tiny-qwen3-vl", steps=2, n_train=2, n_eval=2, batch_size=2, lm_weight=1.0,
                      eval_every=1, out=str(tmp_path / "ckpt"))
    from arr_coc.model import ARRCOCQwen

    model = ARRCOCQwen.from_pretrained("tiny-qwen3-vl", dtype=torch.float32)
    before = {k: v.clone() for k, v in model.layer.state_dict().items()}
    vlm_before = {k: v.clone() for k, v in model.vlm.model.state_dict().items() if "layers.0." in k}
    model, log = train(cfg, model)
    assert model.vlm.family == "qwen3_vl" and len(log) >= 1
    assert all(torch.isfinite(torch.tensor(v)) for row in log for k, v in row.items() if isinstance(v, float))
    assert any(not torch.equal(before[k], v) for k, v in model.layer.state_dict().items())  # the layer learned
    assert all(torch.equal(vlm_before[k], model.vlm.model.state_dict()[k]) for k in vlm_before)  # the VLM did not
