"""ARR's ablations change exactly what they name: on the tiny Qwen2-VL with the shipped tiny-text-vs-distractor
checkpoint, each ablation's layer outputs are compared with the unablated ones on the same observation."""

import copy
from pathlib import Path

import pytest
import torch

from arr_coc.errors import InputError
from arr_coc.pipelines import arr_scene
from arr_coc.pipelines.arr_scene import score, select
from arr_coc.relevance.ablation import ABLATIONS, NO_ABLATION, PRIOR_WEIGHTS, SCORER_NAMES
from arr_coc.relevance.balancing import standardise
from arr_coc.relevance.layer import ScoreMaps
from arr_coc.runtime.timing import Stopwatch
from conftest import QUESTION, scene_image

CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny-text-vs-distractor"
BUDGET = 273


@pytest.fixture(scope="module")
def scene(arr_model):
    """The trained layer and one observation, scored and selected without any ablation."""
    layer = arr_model.load_layer(str(CHECKPOINT))
    observation = arr_scene.observe(arr_model.parts, arr_model.views(scene_image()), QUESTION, Stopwatch(arr_model.vlm.device))
    maps = score(observation, layer)
    return layer, observation, maps, select_cells(layer, observation, maps)


def select_cells(layer, observation, maps, ablation=NO_ABLATION):
    return select(layer, maps, observation.views.candidate_grid, len(observation.gestalt), BUDGET, ablation=ablation)


def ablate(scene, name):
    layer, observation, _, _ = scene
    maps = score(observation, layer, ABLATIONS[name])
    return maps, select_cells(layer, observation, maps, ABLATIONS[name])


def assert_same(a: ScoreMaps, b: ScoreMaps, names):
    for name in names:
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_the_checkpoint_is_trained(scene, arr_model):
    """The guard that makes the weight tests mean something: its weights and maps are not the prior's."""
    _, observation, maps, _ = scene
    prior = score(observation, arr_model.prior_layer())
    assert not torch.allclose(maps.weights, torch.tensor([PRIOR_WEIGHTS]), atol=1e-3)
    assert not torch.allclose(maps.information, prior.information)


@pytest.mark.parametrize("name, alone", [("information", 0), ("perspectival", 1), ("participatory", 2)])
def test_a_scorer_alone_is_its_standardised_map_and_the_maps_are_untouched(scene, name, alone):
    _, _, base, base_out = scene
    maps, out = ablate(scene, name)
    assert_same(maps, base, ("textures", "participatory_prior", *SCORER_NAMES))
    assert maps.weights.tolist() == [[float(i == alone) for i in range(3)]]
    assert torch.allclose(maps.relevance, standardise(getattr(base, SCORER_NAMES[alone])), atol=1e-6)
    assert out.indices.shape == (1, BUDGET) and not torch.equal(out.indices, base_out.indices)


def test_fixed_weights_are_the_priors_over_the_trained_scorers(scene):
    _, _, base, _ = scene
    maps, out = ablate(scene, "fixed-weights")
    assert_same(maps, base, ("textures", "participatory_prior", *SCORER_NAMES))  # the trained checkpoint's maps
    assert torch.equal(maps.weights, torch.tensor([[0.2, 0.2, 0.6]]))
    stacked = standardise(torch.stack([getattr(base, n) for n in SCORER_NAMES], 1))  # [1, 3, gh, gw]
    assert torch.allclose(maps.relevance, 0.2 * stacked[:, 0] + 0.2 * stacked[:, 1] + 0.6 * stacked[:, 2], atol=1e-6)


def test_no_prior_changes_the_participatory_map_only(scene):
    layer, observation, base, _ = scene
    maps, _ = ablate(scene, "no-prior")
    assert_same(maps, base, ("textures", "information", "perspectival"))
    assert maps.participatory_prior is None
    without = layer.participatory(base.textures, observation.question_embeds, None, None)  # [1, gh, gw]
    assert torch.equal(maps.participatory, without) and not torch.allclose(without, base.participatory)
    # the balancer is not ablated: its weights are its own, over the maps it is given
    stacked = torch.stack([getattr(maps, n) for n in SCORER_NAMES], 1)
    relevance, weights, _ = layer.balancer(stacked, observation.question_embeds, None,
                                        observation.gestalt.features.unsqueeze(0))
    assert torch.equal(maps.weights, weights) and torch.equal(maps.relevance, relevance)


def test_raster_order_feeds_the_same_cells_sorted_by_raster_index(scene):
    _, _, base, base_out = scene
    maps, out = ablate(scene, "raster")
    assert_same(maps, base, ("textures", "relevance", "weights", *SCORER_NAMES))
    assert out.indices[0].tolist() == sorted(base_out.indices[0].tolist())
    assert not torch.equal(out.indices, base_out.indices)  # relevance order is not raster order here
    gw = out.grid[1]
    assert torch.equal(out.positions[0], torch.stack([out.indices[0] // gw, out.indices[0] % gw], -1))
    assert torch.equal(out.scores[0], base.relevance.flatten(1)[0, out.indices[0]])
    assert torch.equal(out.selected_scores, out.scores)


def test_a_raster_order_layer_feeds_raster_order_and_relevance_order_is_recovered_exactly(scene):
    """ARRCOCConfig.saccade_order = "raster" feeds the same cells as the relevance-order layer, sorted by raster
    index, everywhere the layer selects (training, the app, evaluate); the relevance-order ablation then gives
    back exactly what a relevance-order layer selects, field by field."""
    from dataclasses import replace

    from arr_coc.relevance.layer import PER_SACCADE

    layer, observation, maps, base_out = scene
    raster_layer = copy.deepcopy(layer)
    raster_layer.config = replace(layer.config, saccade_order="raster")
    raster = select_cells(raster_layer, observation, maps)
    assert raster.indices[0].tolist() == sorted(base_out.indices[0].tolist())
    gw = raster.grid[1]
    assert torch.equal(raster.positions[0], torch.stack([raster.indices[0] // gw, raster.indices[0] % gw], -1))
    back = select_cells(raster_layer, observation, maps, ABLATIONS["relevance-order"])
    for name in PER_SACCADE:
        assert torch.equal(getattr(back, name), getattr(base_out, name)), name


def test_no_gestalt_selects_budget_plus_gestalt_cells_from_the_same_map(scene):
    _, observation, base, base_out = scene
    maps, out = ablate(scene, "no-gestalt")
    assert_same(maps, base, ("textures", "relevance", "weights", *SCORER_NAMES))
    assert len(observation.gestalt) == 256 and out.indices.shape == (1, BUDGET + 256)
    assert torch.equal(out.indices[:, :BUDGET], base_out.indices)  # the most relevant first, as before


@pytest.mark.parametrize("name", [name for name, a in ABLATIONS.items() if not a.auto_budget])  # auto: its own K
def test_every_ablation_reads_the_same_visual_tokens(arr_model, name):
    page = scene_image(896, 896)  # 32x32 native cells, more than ARR reads: it chooses (a 448 px scene it reads whole)
    base = arr_model.answer(page, QUESTION, "arr", max_new_tokens=1)
    a = arr_model.answer(page, QUESTION, "arr", max_new_tokens=1, ablation=name)
    assert a.tokens.total_visual == base.tokens.total_visual == BUDGET + 256
    if name == "no-gestalt":  # one image block: 256 more saccades, no gestalt, 2 fewer block markers
        assert a.tokens.gestalt == 0 and a.tokens.saccade == BUDGET + 256
        assert a.tokens.text == base.tokens.text - 2
    else:
        assert a.tokens == base.tokens
    assert a.ablation == a.to_json()["ablation"] == name and base.ablation is None


def test_no_ablation_is_the_plain_pipeline(scene):
    layer, observation, base, base_out = scene
    maps = score(observation, layer, NO_ABLATION)
    assert_same(maps, base, ("textures", "relevance", "weights", *SCORER_NAMES))
    assert torch.equal(select_cells(layer, observation, maps, NO_ABLATION).indices, base_out.indices)


@pytest.mark.parametrize("pipeline, ablation, message", [
    ("arr", "no-such", "unknown ablation 'no-such': one of information,"),
    ("full", "raster", "an ablation (raster) switches off part of ARR: it needs the arr pipeline, not full"),
])
def test_a_bad_ablation_is_a_clear_input_error(arr_model, pipeline, ablation, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        arr_model.answer(scene_image(), QUESTION, pipeline, max_new_tokens=1, ablation=ablation)
