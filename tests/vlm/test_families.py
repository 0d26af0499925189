"""
Every family's adapter against its stock transformers model, written once and run on each tiny model (Qwen2-VL,
Qwen2.5-VL, Qwen3-VL; the `family` fixture in conftest): the chat template, patches, the sparse tower, M-RoPE
ids, one- and two-image prompts, the training forward (DeepStack included), every decode step, greedy tokens,
views, the pipelines end to end and the CLI. What only one family does is in its own test file.
"""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import answers_by_engine, gestalt_logits, stock_inputs

from arr_coc.pipelines import PIPELINES
from arr_coc.pipelines import FAST_ENGINE_ONLY, FROM_EMBEDS
from arr_coc.vlm.positions import raster_block
from arr_coc.vlm.views import make_views

QUESTION = "What is written on the sign?"
NEEDS_COMPILER = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                                    reason="Inductor on the CPU needs a C++ compiler")
FORCED = "The sign says: STOP here, then turn left at the old mill."  # a teacher-forced answer of many tokens
STOCK = {  # family -> (adapter class, transformers class, cell px, the rendered prompt of one 3-token image and "Why?")
    "qwen2_vl": ("QwenVL", "Qwen2VLForConditionalGeneration", 28, "<|im_start|>system\nYou are a helpful assistant."
                 "<|im_end|>\n<|im_start|>user\n<|vision_start|>" + "<|image_pad|>" * 3 +
                 "<|vision_end|>Why?<|im_end|>\n<|im_start|>assistant\n"),
    "qwen2_5_vl": ("Qwen25VL", "Qwen2_5_VLForConditionalGeneration", 28, "<|im_start|>system\nYou are a helpful "
                   "assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>" + "<|image_pad|>" * 3 +
                   "<|vision_end|>Why?<|im_end|>\n<|im_start|>assistant\n"),
    "qwen3_vl": ("Qwen3VL", "Qwen3VLForConditionalGeneration", 32, "<|im_start|>user\n<|vision_start|>" +
                 "<|image_pad|>" * 3 + "<|vision_end|>Why?<|im_end|>\n<|im_start|>assistant\n"),  # no system prompt
}


def photo(w=400, h=300, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def views_of(vlm, image, **kwargs):
    return make_views(image, device=vlm.device, cell=vlm.cell, min_pixels=vlm.min_pixels, **kwargs)


def test_the_family_loads_its_adapter_cell_and_chat_template(family):
    vlm = family.vlm
    adapter, hf_class, cell, text = STOCK[vlm.family]
    assert (type(vlm).__name__, type(vlm.model).__name__, vlm.cell) == (adapter, hf_class, cell)
    assert vlm.tokenizer.decode(vlm.chat.prompt_ids("Why?", [3])[0]) == text


def test_device_patches_equal_the_image_processor(family):
    vlm = family.vlm
    view = views_of(vlm, photo(333, 517)).highres
    stock = vlm.image_processor(images=[view], do_resize=False, return_tensors="pt")
    pixels, grid = vlm.vision.image_inputs(view)
    assert torch.equal(grid.cpu(), stock["image_grid_thw"])
    torch.testing.assert_close(pixels.cpu(), stock["pixel_values"], atol=1e-5, rtol=0)


def test_the_sparse_encoder_on_every_cell_equals_the_stock_tower(family):
    vlm = family.vlm
    views = views_of(vlm, photo(1400, 900))  # native, non-square, not twice the gestalt
    assert views.candidate_grid == views.native_grid and views.candidate_grid[0] != views.candidate_grid[1]
    pixels, grid = vlm.vision.image_inputs(views.highres)
    with torch.no_grad():
        stock = vlm.visual(pixels, grid_thw=grid)
        every = vlm.encode_cells(views.highres, raster_block(views.candidate_grid).positions)
        whole = vlm.encode_view(views.highres)
    assert stock.pooler_output.std() > 1e-3  # not a vacuous comparison
    for ours in (every, whole):
        assert ours.grid == views.candidate_grid
        torch.testing.assert_close(ours.features, stock.pooler_output, atol=1e-5, rtol=0)
        if vlm.family == "qwen3_vl":  # DeepStack: one merger per listed ViT block
            torch.testing.assert_close(ours.deepstack, torch.stack(stock.deepstack_features), atol=1e-5, rtol=0)
        else:
            assert ours.deepstack is None


@NEEDS_COMPILER
def test_the_compiled_vision_tower_equals_the_stock_tower_at_every_length(family):
    """
    The vision forward CUDA captures, compiled by Inductor (compiled here on the CPU, as the same arithmetic): a
    whole gestalt view equals the stock tower, and a subset of its cells (another patch count: the saccades) equals
    the eager forward, from one compile (the patch count is a dynamic dimension: no recompile per length).
    """
    from torch._dynamo.utils import counters

    vlm = family.vlm
    view = views_of(vlm, photo(700, 500)).tensor("gestalt")
    pixels, grid_thw = vlm.vision.image_inputs(view)
    grid = (int(grid_thw[0, 1]) // 2, int(grid_thw[0, 2]) // 2)
    every = raster_block(grid).positions
    some = every[torch.randperm(len(every), generator=torch.Generator().manual_seed(0))[:len(every) // 3]]
    compiled = vlm.vision.graphed.compiled_fn()
    before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        stock = vlm.visual(pixels, grid_thw=grid_thw)
        whole = vlm.vision.tokens(compiled(*vlm.vision.inputs(pixels, grid, every)), grid, every)
        subset = vlm.vision.tokens(compiled(*vlm.vision.inputs(pixels, grid, some)), grid, some)
        eager = vlm.vision.tokens(vlm.vision.forward(*vlm.vision.inputs(pixels, grid, some)), grid, some)
    assert counters["stats"]["unique_graphs"] - before == 1  # one compile for both lengths
    assert stock.pooler_output.std() > 1e-3 and len(some) != len(every)
    torch.testing.assert_close(whole.features, stock.pooler_output, atol=1e-5, rtol=0)
    torch.testing.assert_close(subset.features, eager.features, atol=1e-5, rtol=0)
    if vlm.family == "qwen3_vl":  # DeepStack too
        torch.testing.assert_close(whole.deepstack, torch.stack(stock.deepstack_features), atol=1e-5, rtol=0)
        torch.testing.assert_close(subset.deepstack, eager.deepstack, atol=1e-5, rtol=0)


def test_sparse_tokens_are_a_set_at_their_true_positions(family):
    vlm = family.vlm
    views = views_of(vlm, photo())
    cells = torch.tensor([[3, 4], [10, 2], [0, 0]])
    with torch.no_grad():
        a = vlm.encode_cells(views.highres, cells)
        b = vlm.encode_cells(views.highres, cells[[2, 0, 1]])
    torch.testing.assert_close(a.take(torch.tensor([2, 0, 1])).features, b.features, atol=1e-5, rtol=0)
    assert torch.equal(b.positions, cells[[2, 0, 1]]) and b.grid == views.candidate_grid
    if a.deepstack is not None:
        torch.testing.assert_close(a.deepstack[:, [2, 0, 1]], b.deepstack, atol=1e-5, rtol=0)


@pytest.mark.parametrize("view", ["gestalt", "highres"])
def test_position_ids_follow_get_rope_index_for_one_block(family, view):
    vlm = family.vlm
    views = views_of(vlm, photo(1400, 500))
    ids, pixels, thw, mm = stock_inputs(vlm, views.tensor(view), QUESTION)
    stock, _ = vlm.model.model.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=thw)
    assert torch.equal(vlm.chat.position_ids(ids, [raster_block(views.grid(view))]), stock)


def test_zero_saccades_reproduce_the_stock_logits(family):
    stock, ours = gestalt_logits(family.vlm, views_of(family.vlm, photo()), QUESTION)
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)


def test_a_two_image_prompt_equals_the_stock_forward_from_pixels(family):
    """The gestalt and a second block of another grid: position ids and logits (the training forward, DeepStack
    included) against transformers' own forward over both images' pixels."""
    vlm = family.vlm
    first, second = views_of(vlm, photo()).tensor("gestalt"), views_of(vlm, photo(300, 200, seed=1)).tensor("native")
    inputs = [vlm.stock_inputs(QUESTION, view) for view in (first, second)]
    with torch.no_grad():
        prompt = vlm.prompt(QUESTION, [vlm.encode_view(first), vlm.encode_view(second)])
        grids = torch.cat([s.image_grid_thw for s in inputs])  # [2, 3]
        mm = (prompt.ids == vlm.image_token_id).int()
        stock_positions, _ = vlm.model.model.get_rope_index(prompt.ids, mm_token_type_ids=mm, image_grid_thw=grids)
        stock = vlm.model(input_ids=prompt.ids, pixel_values=torch.cat([s.pixel_values for s in inputs]),
                          image_grid_thw=grids, mm_token_type_ids=mm).logits  # [1, L, V]
        ours = vlm.decoder.forward(prompt.embeds, prompt.position_ids, prompt.deepstack)
    assert int(mm.sum()) == sum(int(g.prod()) // 4 for g in grids) and grids[0].tolist() != grids[1].tolist()
    assert torch.equal(prompt.position_ids, stock_positions)
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("how", ["step", "fused", pytest.param("compiled", marks=NEEDS_COMPILER)])
def test_every_decode_step_equals_a_stock_forward_without_cache(family, how, request):
    """
    A long answer teacher-forced through the static-cache decode steps: each step's logits equal transformers'
    forward from pixels over the prompt and the tokens so far, so a wrong rope position or cache mask fails
    even when greedy decoding would only ever pick one token. `compiled`: the step Inductor compiles (fullgraph),
    which CUDA captures in its decode graph; compiled here on the CPU, as the same arithmetic. `fused`: q/k/v and
    gate/up as one matmul each (Decoder.fuse, on by itself on CUDA), the modules' weights views into them.
    """
    vlm = family.vlm
    if how == "fused" and vlm.decoder.fused is None:
        # the tiny models' q/k/v biases are zeros: random ones here, so a bias out of place in the fused matmul shows
        biases = [p.bias for layer in vlm.decoder.lm.layers for p in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                                         layer.self_attn.v_proj) if p.bias is not None]
        saved = [b.detach().clone() for b in biases]
        with torch.no_grad():
            for b in biases:
                b.copy_(torch.randn(b.shape, generator=torch.Generator().manual_seed(b.numel())))
        vlm.decoder.fuse()

        def restore():  # the stock modules again (same weights), and the biases as they were
            vlm.decoder.fused = None
            with torch.no_grad():
                for module_bias, old in zip(biases, saved):
                    module_bias.copy_(old)
        request.addfinalizer(restore)
        for layer, fused in zip(vlm.decoder.lm.layers, vlm.decoder.fused):  # shared, not copied
            assert layer.self_attn.v_proj.weight.untyped_storage().data_ptr() == fused.qkv.untyped_storage().data_ptr()
            assert layer.mlp.up_proj.weight.untyped_storage().data_ptr() == fused.gate_up.untyped_storage().data_ptr()
    compiled = how == "compiled"
    view = views_of(vlm, photo(seed=5)).tensor("gestalt")
    forced = vlm.tokenizer(FORCED, add_special_tokens=False)["input_ids"]
    stock_in = vlm.stock_inputs(QUESTION, view)
    ids = torch.cat([stock_in.input_ids, torch.tensor([forced], device=vlm.device)], dim=1)
    L = stock_in.length
    with torch.no_grad():
        stock = vlm.model(input_ids=ids, pixel_values=stock_in.pixel_values, image_grid_thw=stock_in.image_grid_thw,
                          mm_token_type_ids=(ids == vlm.image_token_id).int()).logits[0, L - 1:].float()  # [n + 1, V]
        prompt = vlm.prompt(QUESTION, [vlm.encode_view(view)])
        decoder = vlm.decoder
        cap, logits = decoder.start(prompt.embeds, prompt.position_ids, len(forced) + 1, prompt.deepstack)
        ours = [logits[0]]
        state = decoder.states[cap]
        step = decoder._compiled(state) if compiled else (lambda _: decoder._decode_step(cap))
        for token in forced:
            state.token.fill_(token)  # teacher forcing: the step reads the token it is given
            ours.append(step(state)[1][0].clone())
    assert len(forced) >= 12
    torch.testing.assert_close(torch.stack(ours), stock, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_pipeline_answers_the_same_with_both_engines(family, pipeline):
    if pipeline in FROM_EMBEDS and not family.vlm.stock_generate_takes_embeds:
        pytest.skip("stock generate() cannot take Qwen3-VL's embeddings (tests/vlm/test_qwen3_vl.py)")
    if pipeline in FAST_ENGINE_ONLY:
        pytest.skip("stock generate() cannot run FastV (tests/pipelines/test_fastv.py pins it to a reference)")
    answers = answers_by_engine(family, photo(700, 500), QUESTION, pipeline)
    assert answers["fast"].text == answers["hf"].text
    assert answers["fast"].new_tokens == answers["hf"].new_tokens
    assert answers["fast"].tokens == answers["hf"].tokens


def test_zero_saccades_answer_as_the_stock_gestalt_baseline(family):
    stock = answers_by_engine(family, photo(seed=4), QUESTION, "gestalt")["hf"]
    arr = family.answer(photo(seed=4), QUESTION, "arr", max_new_tokens=8, budget=0)
    assert arr.tokens.saccade == 0 and arr.text == stock.text and arr.new_tokens == stock.new_tokens


def test_arr_answers_with_273_ordered_unique_saccades(family):
    answer = family.answer(photo(1000, 700), QUESTION, "arr", max_new_tokens=4)  # more cells than ARR reads
    cells = [(s.row, s.col) for s in answer.saccades]
    assert answer.tokens.saccade == 273 and len(cells) == 273 == len(set(cells))
    assert [s.rank for s in answer.saccades] == list(range(1, 274))
    scores = [s.score for s in answer.saccades]
    assert scores == sorted(scores, reverse=True)
    gh, gw = answer.views.candidate_grid
    assert all(0 <= r < gh and 0 <= c < gw for r, c in cells)


@pytest.mark.parametrize("size", [(300, 200), (200, 300), (1792, 1792), (2500, 1200), (640, 480), (60, 40)])
def test_the_full_view_is_the_stock_image_processors_grid(family, size):
    """`full` reads what stock reads: the family's own min_pixels and max_cells cells (Qwen3-VL 300x200: 7x10)."""
    vlm = family.vlm
    processor = vlm.image_processor
    max_cells = 4096
    stock = processor(images=[photo(*size)], size={"longest_edge": max_cells * vlm.cell**2,
                                                   "shortest_edge": vlm.min_pixels}, return_tensors="pt")
    grid = views_of(vlm, photo(*size), max_cells=max_cells).native_grid
    assert [g // 2 for g in stock["image_grid_thw"][0, 1:].tolist()] == list(grid)
    if vlm.family == "qwen3_vl" and size == (300, 200):
        assert grid == (7, 10)


def test_run_cli_with_the_family(family, tmp_path):
    from arr_coc.run import main

    out = tmp_path / "run.json"
    code = main(["--model", family.vlm.name, "--image", "assets/hubble_deep_field.jpg", "--question", QUESTION,
                 "--max-new-tokens", "2", "--json", str(out), "--pipelines", "arr,gestalt", "--device", "cpu"])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["model"] == family.vlm.name and list(report["pipelines"]) == ["arr", "gestalt"]
    assert report["pipelines"]["arr"]["tokens"]["saccade"] == 273
    assert report["pipelines"]["arr"]["decode_ms_per_token"] >= 0 and "decode_ms_per_token" in report["pipelines"]["gestalt"]


def test_random_weights_build_the_family_adapter(family):
    from arr_coc.model import ARRCOCQwen
    from arr_coc.vlm.families import random_vlm
    from arr_coc.vlm.tiny import FULL_SIZE, TINY_MODELS

    recipe = TINY_MODELS[family.vlm.name]
    vlm = random_vlm(recipe.config(), "cpu", torch.float32, "random tiny")
    assert type(vlm) is type(family.vlm) and vlm.chat_template == recipe.chat_template and vlm.cell == family.vlm.cell
    assert ARRCOCQwen(vlm).answer(photo(1000, 700), QUESTION, "arr", max_new_tokens=2).tokens.saccade == 273
    assert FULL_SIZE[family.vlm.family][1]().model_type == family.vlm.family
