"""
What only the Qwen3-VL adapter does, against the stock Qwen3-VL (tiny, fp32): the interpolated pos_embed of any
cell subset, DeepStack in prefill and in the prior, the hf engine's refusal of DeepStack prompts, the chat
template from the folder, training (the equivalences every family has: tests/vlm/test_families.py).
"""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from conftest import stock_inputs, tiny_arr_model

from arr_coc.vlm.views import make_views
from arr_coc.pipelines import arr_scene
from arr_coc.pipelines.request import Request

QUESTION = "What is written on the sign?"


def photo(w=400, h=300, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def q3():
    """ARRCOCQwen over the tiny Qwen3-VL, fp32 (exact comparisons), shared with the family tests."""
    return tiny_arr_model("tiny-qwen3-vl")


def views_of(vlm, image, **kwargs):
    return make_views(image, device=vlm.device, cell=vlm.cell, min_pixels=vlm.min_pixels, **kwargs)


def test_any_cell_subset_gets_the_interpolated_pos_embed_of_its_own_patches(q3):
    """The pos_embed of selected patches = the learned grid bilinearly resized to the whole view's patch grid, there."""
    vlm = q3.vlm
    visual = vlm.visual
    grid = (7, 11)
    pixels = torch.zeros(4 * grid[0] * grid[1], 3 * 2 * 16 * 16)
    cells = torch.tensor([[6, 10], [0, 0], [3, 4], [2, 9]])
    _, patch_positions, taps, weights = vlm.vision.inputs(pixels, grid, cells)
    ours = (visual.pos_embed(taps) * weights[:, :, None]).sum(1)  # [16, E]
    side = visual.num_grid_per_side
    table = visual.pos_embed.weight.T.reshape(1, -1, side, side)  # [1, E, side, side]
    resized = F.interpolate(table, size=(2 * grid[0], 2 * grid[1]), mode="bilinear", align_corners=True)[0]
    expected = resized[:, patch_positions[:, 0], patch_positions[:, 1]].T  # [16, E]
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def gestalt_prompt(vlm, image=None, question=QUESTION):
    """The stock inputs of one gestalt view and our Prompt of the same (DeepStack laid out over it)."""
    views = views_of(vlm, image or photo())
    ids, pixels, grid, mm = stock_inputs(vlm, views.gestalt, question)
    with torch.no_grad():
        prompt = vlm.prompt(question, [vlm.encode_view(views.gestalt)])
    assert torch.equal(prompt.ids, ids)
    return views, ids, pixels, grid, mm, prompt


def test_prefill_with_deepstack_reproduces_the_stock_logits_and_needs_it(q3):
    vlm = q3.vlm
    decoder = vlm.decoder
    views, ids, pixels, grid, mm, prompt = gestalt_prompt(vlm)
    assert prompt.deepstack.shape == (2, *prompt.embeds.shape)
    last = torch.tensor([ids.shape[1] - 1])
    with torch.no_grad():
        stock = vlm.model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=mm).logits
        decoder._state(1024, prompt.embeds.dtype)
        ours = decoder._prefill(prompt.embeds, prompt.position_ids, last, 1024, prompt.deepstack)  # [1, V]
        without = decoder._prefill(prompt.embeds, prompt.position_ids, last, 1024)
    torch.testing.assert_close(ours, stock[:, -1], atol=1e-5, rtol=0)
    assert (without - stock[:, -1]).abs().max() > 1e-3  # DeepStack matters: dropping it would show


def test_the_prior_equals_the_eager_attention_with_deepstack(q3):
    from transformers import Qwen3VLForConditionalGeneration

    from arr_coc.vlm.tiny import tiny_model_path

    vlm = q3.vlm
    views, ids, pixels, grid, mm, prompt = gestalt_prompt(vlm, question="Where is the cat?")
    embeds, positions = prompt.embeds, prompt.position_ids
    at = (ids[0] == vlm.image_token_id).nonzero()[:, 0]
    span, query_start = (int(at[0]), int(at[-1]) + 1), int(at[-1]) + 2
    with torch.no_grad():
        ours = vlm.prior_attention("Where is the cat?", vlm.encode_view(views.gestalt), 0.5)
        eager = Qwen3VLForConditionalGeneration.from_pretrained(tiny_model_path("tiny-qwen3-vl"), dtype=torch.float32,
                                                                attn_implementation="eager").to(vlm.device)
        mask = ids == vlm.image_token_id
        out = eager.model.language_model(inputs_embeds=embeds, position_ids=positions, visual_pos_masks=mask,
                                         deepstack_visual_embeds=[d[mask] for d in prompt.deepstack],
                                         output_attentions=True)
    expected = out.attentions[2][0, :, query_start:, span[0]:span[1]].mean(dim=(0, 1))  # layer 4 * 0.5
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-4)


def test_the_hf_engine_refuses_arr_embeddings_it_would_strip_of_deepstack(q3):
    vlm = q3.vlm
    try:
        vlm.engine = "hf"
        with pytest.raises(ValueError, match="DeepStack"):
            q3.answer(photo(1000, 700), QUESTION, "arr", max_new_tokens=2)  # more cells than ARR reads: it chooses
    finally:
        vlm.engine = "fast"
    views = views_of(vlm, photo())
    tokens = vlm.encode_view(views.gestalt)
    with pytest.raises(ValueError, match="DeepStack"):  # features that lost their DeepStack are refused, not dropped
        vlm.prompt(QUESTION, [tokens, replace(tokens, deepstack=None)])


def test_the_chat_template_comes_from_the_folder(q3):
    from arr_coc.vlm.qwen3_vl import CHAT_TEMPLATE
    from arr_coc.vlm.tiny import tiny_model_path

    vlm = q3.vlm
    saved = json.loads((tiny_model_path("tiny-qwen3-vl") / "tokenizer_config.json").read_text()).get("chat_template")
    on_disk = saved or (tiny_model_path("tiny-qwen3-vl") / "chat_template.jinja").read_text()
    assert vlm.chat_template == on_disk == CHAT_TEMPLATE  # the family's, saved by the tiny recipe


@pytest.mark.gpu
def test_graphed_paths_equal_eager_on_cuda():
    """Vision (with pos_embed and DeepStack), prefill with DeepStack, the prior and decode: graphs = eager."""
    from arr_coc.model import ARRCOCQwen

    model = ARRCOCQwen.from_pretrained("tiny-qwen3-vl", device="cuda", dtype=torch.float32)
    vlm = model.vlm
    scene = arr_scene.prepare(model.parts, model.views(photo(900, 700)), QUESTION, Request())
    out = scene.select(model.layer)
    results = {}
    for graphs in (True, False):
        vlm.decoder.graphs_enabled = graphs
        with torch.no_grad():
            gestalt = vlm.encode_view(scene.views.tensor("gestalt"))
            saccades = vlm.encode_cells(scene.views.tensor("highres"), out.positions[0])
            prompt = vlm.prompt(QUESTION, [gestalt, saccades])
            prior = vlm.prior_attention(QUESTION, gestalt)
            tokens = vlm.generate(prompt, 12).ids
        results[graphs] = (saccades.features, saccades.deepstack, gestalt.deepstack, prior, tokens)
    vlm.decoder.graphs_enabled = True
    assert len(vlm.vision.graphed.graphs) >= 2 and vlm.decoder.decode_graphs  # the graphed run did use graphs
    for graphed, eager in zip(results[True][:4], results[False][:4]):
        torch.testing.assert_close(graphed, eager, atol=1e-4, rtol=1e-4)
    assert results[True][4].tolist() == results[False][4].tolist()


def test_training_runs_on_the_tiny_qwen3_vl(tmp_path):
    """Training with the answer loss runs on a DeepStack family: the layer learns, the VLM stays frozen (the answer
    loss's own gradient, per family: tests/test_train.py)."""
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
