"""ARRCOCQwen end to end on the tiny model: pipelines, the fixed budget, shared weights, failures."""

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.errors import InputError, OutOfMemory
from arr_coc.model import ARRCOCQwen, Request
from arr_coc.pipelines import arr_scene
from arr_coc.pipelines.arr_layout import arr_prompt, encode_saccades
from arr_coc.pipelines.arr_options import Options as ArrOptions
from arr_coc.relevance.ablation import ABLATIONS
from arr_coc.relevance.config import ARRCOCConfig
from arr_coc.relevance.layer import ARRCOCLayer, CheckpointError
from conftest import QUESTION, scene_image


def test_arr_answer_carries_every_diagnostic(arr_model):
    a = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=3)
    assert a.tokens.saccade == 273 and a.tokens.gestalt == 256 and a.tokens.total_visual == 529
    assert a.tokens.text > 10 and 1 <= a.new_tokens <= 3
    assert set(asdict(a.timings)) == {"vision", "selection", "prefill", "decode", "total"}
    assert all(v > 0 for k, v in asdict(a.timings).items() if k != "decode")
    assert a.timings.total >= a.timings.vision + a.timings.selection + a.timings.prefill
    assert a.peak_memory_mb > 0 and len(a.saccades) == 273
    assert [s.rank for s in a.saccades] == list(range(1, 274))
    assert all(x.score >= y.score for x, y in zip(a.saccades, a.saccades[1:]))
    s = a.saccades[0]
    assert s.box == a.views.cell_box(s.row, s.col)
    j = a.to_json()
    assert j["grid"] == [32, 32] and len(j["weights"]) == 3 and j["fallback"] is None and len(j["saccades"]) == 273


def test_arr_prefers_the_detailed_half(arr_model):
    a = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=1)
    info = a.arr.information[0]
    assert info[16:, :16].mean() > 5 * info[:16].mean()  # the information prior sees the detail
    in_detail = sum(s.row >= 16 and s.col < 16 for s in a.saccades)
    # a quarter of the cells; chance is 68. The tiny model's random gestalt attention (weight 0.6) adds noise.
    assert in_detail > 120


@pytest.mark.parametrize("pipeline, visual", [("full", 1024), ("gestalt", 256), ("budget", 529)])  # full: native 896^2
def test_baselines_use_their_views(arr_model, pipeline, visual):
    a = arr_model.answer(scene_image(896, 896), QUESTION, pipeline, max_new_tokens=2)
    assert a.tokens.total_visual == visual and a.tokens.saccade == 0 and a.arr is None
    assert a.timings.vision > 0 and a.timings.selection == 0


def test_zero_budget_arr_answers_like_the_gestalt_baseline(arr_model):
    arr = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=4, budget=0)
    stock = arr_model.answer(scene_image(896, 896), QUESTION, "gestalt", max_new_tokens=4)
    assert arr.tokens.saccade == 0 and arr.text == stock.text


@pytest.mark.parametrize("size, saccades", [((1, 1), 0), ((28, 28), 0), ((4000, 300), 273), ((3000, 3000), 273)])
def test_exactly_273_saccades_for_any_size_that_holds_more_cells_than_arr_reads(arr_model, size, saccades):
    """11x143 and 64x64 native cells: 273 saccades. 1 px and 28 px hold Qwen2-VL's least, 2x2 cells, fewer than the
    gestalt plus the budget: ARR reads those 4 whole, as full does (Answer.reads_native)."""
    a = arr_model.answer(Image.new("RGB", size, (90, 60, 30)), QUESTION, "arr", max_new_tokens=1)
    assert a.tokens.saccade == saccades and len({(s.row, s.col) for s in a.saccades}) == saccades
    assert (a.reads_native is None) == bool(saccades) and (saccades or a.tokens.total_visual == 4)


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "I;16"])
def test_odd_image_modes_answer(arr_model, mode):
    image = scene_image(896, 672).convert("L" if mode == "I;16" else mode)  # 32x24 cells: more than ARR reads
    if mode == "I;16":
        image = Image.fromarray(np.asarray(image, dtype=np.uint16) * 257)
    assert arr_model.answer(image, QUESTION, "arr", max_new_tokens=1).tokens.saccade == 273


def test_both_pipelines_run_the_same_weights(arr_model):
    vlm = arr_model.vlm
    modules = (vlm.visual.patch_embed, vlm.visual.merger, vlm.language_model.layers[0].self_attn.q_proj, vlm.model.lm_head)
    seen = []
    hooks = [m.register_forward_hook(lambda mod, *_: seen.append(id(mod))) for m in modules]
    vlm.decoder.graphs_enabled = False  # a CUDA-graph replay runs no Python hooks: watch the eager path
    try:
        for engine in ("hf", "fast"):
            vlm.engine = engine
            for pipeline in ("full", "arr"):
                seen.clear()
                arr_model.answer(scene_image(896, 896), QUESTION, pipeline, max_new_tokens=1)
                assert set(seen) == {id(m) for m in modules}, (engine, pipeline)
    finally:
        vlm.engine, vlm.decoder.graphs_enabled = "fast", True
        for h in hooks:
            h.remove()
    vlm_params = sum(p.numel() for p in arr_model.vlm.model.parameters())
    layer_params = sum(p.numel() for p in arr_model.layer.parameters())
    assert layer_params < 0.01 * vlm_params  # the ARR layer adds no second copy of anything large
    assert not any(p.requires_grad for p in arr_model.vlm.model.parameters())


def test_fp16_arr_path_gives_finite_logits():
    model = ARRCOCQwen.from_pretrained("tiny", dtype=torch.float16)
    assert model.vlm.model.model.language_model.dtype == torch.float16 and model.vlm.visual.dtype == torch.float32
    scene = arr_scene.prepare(model.parts, model.views(scene_image(896, 896)), QUESTION, Request())
    assert torch.isfinite(scene.maps.relevance).all()
    vlm = model.vlm
    out = scene.select(model.layer)
    with torch.no_grad():
        saccades = encode_saccades(vlm, scene.observation, out.positions[0])
        prompt = arr_prompt(vlm, scene.observation, saccades)
        logits = vlm.model(inputs_embeds=prompt.embeds, position_ids=prompt.position_ids).logits
    assert logits.dtype == torch.float16 and torch.isfinite(logits).all()


def test_reselection_needs_no_vlm(arr_model):
    scene = arr_scene.prepare(arr_model.parts, arr_model.views(scene_image(896, 896)), QUESTION, Request())
    calls = []
    hook = arr_model.vlm.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        for strategy in ("topk", "logpolar", "grid", "random"):
            assert scene.select(arr_model.layer, 100, strategy).indices.shape == (1, 100)
    finally:
        hook.remove()
    assert not calls


def test_checkpoint_swaps_without_reloading_the_vlm(arr_model, tmp_path):
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=arr_model.vlm.hidden_size))
    with torch.no_grad():
        layer.balancer.head[1].bias.copy_(torch.tensor([3.0, -3.0, -3.0]))  # information only
    layer.save_pretrained(tmp_path / "info_only")
    vlm_before = arr_model.vlm.model
    loaded = arr_model.load_layer(tmp_path / "info_only")
    a = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=1, layer=loaded)
    assert arr_model.vlm.model is vlm_before and a.arr.weights[0, 0] > 0.9
    ARRCOCLayer(ARRCOCConfig(hidden_size=1536)).save_pretrained(tmp_path / "for_2b")
    with pytest.raises(CheckpointError, match="hidden size 1536.*hidden size 64"):
        arr_model.load_layer(tmp_path / "for_2b")


SHIPPED = sorted((Path(__file__).resolve().parents[1] / "checkpoints").glob("tiny-*"))


@pytest.mark.parametrize("checkpoint", SHIPPED, ids=lambda p: p.name)
@pytest.mark.parametrize("size, grid", [((1792, 1792), (64, 64)), ((2400, 900), (32, 86))])
def test_shipped_checkpoints_select_273_cells_on_any_native_grid(arr_model, checkpoint, size, grid):
    config = json.loads((checkpoint / "config.json").read_text())
    assert not {"gestalt_max_tokens", "budget_tokens", "prior_layer_fraction"} & config.keys()  # PipelineConfig's
    layer = arr_model.load_layer(str(checkpoint))
    image = scene_image(*size)
    scene = arr_scene.prepare(arr_model.parts, arr_model.views(image), QUESTION,
                              Request(options=(ArrOptions(layer=layer),)))
    out = scene.select(layer)
    assert scene.views.candidate_grid == out.grid == grid  # the native grid: 64x64 at 1792², non-square when wide
    cells = out.positions[0].tolist()
    assert len(cells) == len(set(map(tuple, cells))) == 273
    assert all(0 <= r < grid[0] and 0 <= c < grid[1] for r, c in cells)
    assert out.fallback == [None] and torch.isfinite(out.relevance).all()


def test_non_finite_relevance_falls_back_to_grid_and_says_so(arr_model):
    broken = arr_model.prior_layer()
    with torch.no_grad():
        broken.balancer.head[1].bias.fill_(float("nan"))
    a = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=1, layer=broken)
    assert a.arr.fallback == ["non_finite"] and a.tokens.saccade == 273
    assert a.to_json()["fallback"] == "non_finite"


def test_a_flat_image_is_a_semantic_void(arr_model):
    a = arr_model.answer(Image.new("RGB", (896, 896), (128, 128, 128)), "What is here?", "arr", max_new_tokens=1)
    assert a.arr.fallback == ["semantic_void"] and a.tokens.saccade == 273


@pytest.mark.parametrize("image, question, message", [
    (None, QUESTION, "no image"),
    ("scene", "", "question is empty"),
    ("scene", "   \n", "question is empty"),
    ("scene", "x" * 5000, "limit is 4000"),
])
def test_bad_input_is_a_clear_value_error(arr_model, image, question, message):
    with pytest.raises(ValueError, match=message):
        arr_model.answer(scene_image(896, 896) if image == "scene" else image, question, "arr")
    with pytest.raises(InputError, match="pipeline"):
        arr_model.answer(scene_image(896, 896), QUESTION, "everything")


def test_a_request_is_passed_whole_or_its_settings_by_name_over_it(arr_model):
    """answer and stream take one Request (arr_coc.pipelines.answer), any of its fields by name over it: the same
    answer either way, the ablation by name or as itself; a setting a Request lacks is named, and a number where
    answer once took max_new_tokens is refused."""
    whole = arr_model.answer(scene_image(896, 896), QUESTION, "arr", Request(max_new_tokens=2, budget=40,
                                                                               options=(ArrOptions(ablation="raster"),)))
    named = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=2, budget=40, ablation=ABLATIONS["raster"])
    over = arr_model.answer(scene_image(896, 896), QUESTION, "arr", Request(max_new_tokens=9, budget=7,
                                                                              options=(ArrOptions(ablation="no-prior"),)),
                            max_new_tokens=2, budget=40, ablation="raster")
    streamed = list(arr_model.stream(scene_image(896, 896), QUESTION, "arr", Request(budget=40), max_new_tokens=2,
                                     ablation="raster"))[-1]
    assert whole.ablation == "raster" and whole.tokens.saccade == 40
    for a in (named, over, streamed):
        assert (a.text, a.tokens, a.ablation) == (whole.text, whole.tokens, whole.ablation)
        assert [(s.row, s.col) for s in a.saccades] == [(s.row, s.col) for s in whole.saccades]
    with pytest.raises(InputError, match="unknown request setting 'max_tokens'"):
        arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_tokens=2)
    with pytest.raises(TypeError, match="pass settings by name"):
        arr_model.answer(scene_image(896, 896), QUESTION, "arr", 2)


def test_cuda_oom_is_reported_and_the_next_call_works(arr_model, monkeypatch):
    real = arr_model.vlm.generate_tokens

    def oom(*args, **kwargs):
        monkeypatch.setattr(arr_model.vlm, "generate_tokens", real)  # only the first call fails
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(arr_model.vlm, "generate_tokens", oom)
    with pytest.raises(OutOfMemory, match="memory was freed"):
        arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=1)
    assert arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=1).tokens.saccade == 273


def test_stream_ends_with_the_answer_a_plain_call_gives(arr_model):
    """(the text growing token by token: tests/vlm/test_decoder.py, on a scripted sentence)"""
    parts = list(arr_model.stream(scene_image(896, 896), QUESTION, "gestalt", max_new_tokens=4))
    final, texts = parts[-1], parts[:-1]
    plain = arr_model.answer(scene_image(896, 896), QUESTION, "gestalt", max_new_tokens=4)
    assert final.pipeline == "gestalt" and (final.text, final.new_tokens) == (plain.text, plain.new_tokens)
    assert all(isinstance(t, str) for t in texts) and texts[-1].strip() == final.text
    with pytest.raises(InputError):
        list(arr_model.stream(scene_image(896, 896), "", "arr"))


def test_unloadable_model_falls_back_to_the_pocket_model_with_a_notice(tmp_path):
    """The one offline fallback (cli.load_vlm): the app's ("any") takes the pocket model for a folder that is no
    model; a command's default model ("offline") only where the hub could not give it; asked for by name, never."""
    from arr_coc.commands import cli
    from arr_coc.errors import InputError

    missing = str(tmp_path / "no-such-model")
    model = cli.load_vlm(missing, None, "any")
    assert model.vlm.hidden_size == 256 and model.notice.startswith(f"Could not load the model {missing!r}: OSError")
    assert "pocket-qwen2-vl" in model.notice and "synthetic fine-print" in model.notice
    assert "meaningless" in ARRCOCQwen.from_pretrained("tiny").notice  # asked for, and still said
    for fallback in ("offline", None):
        with pytest.raises(InputError, match="cannot load the model"):
            cli.load_vlm(missing, None, fallback)
    with pytest.raises(OSError):
        ARRCOCQwen.from_pretrained(missing)


def test_a_new_pipeline_is_one_module_and_one_registry_line(arr_model, monkeypatch):
    """The façade dispatches by the registry: a module with answer() and its line there make a pipeline."""
    import sys
    import types

    from arr_coc import pipelines
    from arr_coc.pipelines.pipeline import Pipeline
    from arr_coc.pipelines.stock import answer_view

    module = types.ModuleType("echo_pipeline")
    module.answer = lambda parts, image, question, request: answer_view(parts, "echo", "gestalt", image, question,
                                                                        request)
    monkeypatch.setitem(sys.modules, "echo_pipeline", module)
    monkeypatch.setitem(pipelines.REGISTRY, "echo", Pipeline("echo", "echo_pipeline", "stock: the gestalt view, once "
                                                              "more", kind="stock", order=100))
    echo = arr_model.answer(scene_image(896, 896), QUESTION, "echo", max_new_tokens=2)
    gestalt = arr_model.answer(scene_image(896, 896), QUESTION, "gestalt", max_new_tokens=2)
    assert echo.pipeline == "echo" and (echo.text, echo.tokens) == (gestalt.text, gestalt.tokens)
    with pytest.raises(InputError, match="pipeline must be one of"):
        arr_model.answer(scene_image(896, 896), QUESTION, "nonesuch")
