"""What every pipeline shares (arr_coc.pipelines.answer), with its expectations written out: a request's checks (its
settings by name, its ablation by name), views made once and read again only where they fit, the second look's
default size, the token counts, the latency split and the answer's confidence."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from arr_coc.errors import InputError
from arr_coc.pipelines import check_pipeline
from arr_coc.pipelines.answer import (Request, answer_confidence, check_question, check_request, latency_split,
                                      token_counts, views_for, with_settings)
from arr_coc.pipelines.arr import second_look_saccades
from arr_coc.relevance.ablation import ABLATIONS, NO_ABLATION
from arr_coc.settings import PipelineConfig
from arr_coc.vlm.views import make_views


def test_a_question_is_stripped_and_an_empty_or_overlong_one_refused():
    assert check_question("  What is the value of PAGE?\n") == "What is the value of PAGE?"
    for empty in ("", "   ", None, 7):
        with pytest.raises(InputError, match="the question is empty"):
            check_question(empty)
    with pytest.raises(InputError, match="is 4001 characters long; the limit is 4000"):
        check_question("x" * 4001)


@pytest.mark.parametrize("request_, message", [(Request(max_new_tokens=0), "between 1 and 1024, got 0"),
                                               (Request(max_new_tokens=1025), "between 1 and 1024, got 1025"),
                                               (Request(refixate=1.5), "between 0 and 1, got 1.5"),
                                               (Request(refixate=float("nan")), "between 0 and 1, got nan"),
                                               (Request(refixate_budget=0), "at least 1, got 0")])
def test_a_request_out_of_bounds_is_refused_naming_the_bound(request_, message):
    with pytest.raises(InputError, match=message):
        check_request(request_)


def test_a_request_within_bounds_passes_unchanged():
    request = Request(max_new_tokens=1024, refixate=0.0, refixate_budget=1)
    assert check_request(request) is request


def test_settings_by_name_go_over_a_request_and_an_unknown_one_is_named():
    base = Request(max_new_tokens=8, strategy="grid")
    assert with_settings(base, dict(budget="auto", max_new_tokens=2)) == Request(max_new_tokens=2, strategy="grid",
                                                                                 budget="auto")
    assert base == Request(max_new_tokens=8, strategy="grid")  # the request given is left as it was
    assert with_settings(None, {}) == Request()
    with pytest.raises(InputError, match=r"unknown request setting 'max_new_token': a Request has max_new_tokens, "):
        with_settings(None, dict(max_new_token=2))
    with pytest.raises(TypeError, match="request must be a Request, got int"):  # ARRCOCQwen.answer's old 4th place
        with_settings(16, {})


def test_an_ablation_by_name_becomes_its_ablation_in_one_place():
    assert check_request(Request(ablation="raster")).ablation is ABLATIONS["raster"]
    assert check_request(Request(ablation=ABLATIONS["raster"])).ablation is ABLATIONS["raster"]
    for none in (None, "none", NO_ABLATION):
        assert check_request(Request(ablation=none)).ablation is None
    with pytest.raises(InputError, match="unknown ablation 'nope': one of information,"):
        check_request(Request(ablation="nope"))


@pytest.mark.parametrize("pipeline, request_, message", [
    ("nonesuch", Request(), "pipeline must be one of"),
    ("full", Request(ablation="raster"), r"an ablation \(raster\) switches off part of ARR: it needs the arr pipeline"),
    ("full", Request(ablation=ABLATIONS["raster"]), r"an ablation \(raster\) switches off part of ARR"),
    ("gestalt", Request(refixate=0.5), "refixation is ARR's second look: it needs the arr pipeline, not gestalt"),
])
def test_a_pipeline_refuses_what_only_arr_does(pipeline, request_, message):
    with pytest.raises(InputError, match=message):
        check_pipeline(pipeline, request_)
    check_pipeline("arr", request_)  # ARR takes each


def test_views_made_once_are_read_again_only_for_their_own_image_at_their_own_settings():
    """views_for hands back the views a request brings (Request.views) where it made them of this very image at these
    settings; another image (even of the same pixels), cap, setting or VLM, or views it did not make, get new ones."""
    vlm = SimpleNamespace(device=torch.device("cpu"), cell=28, min_pixels=None)
    settings, image = PipelineConfig(), Image.new("RGB", (1792, 1344), (10, 20, 30))
    views = views_for(vlm, settings, image, 4096)
    assert views.image is image  # an RGB image is kept as it is: the one to pass with its views
    assert views_for(vlm, settings, image, 4096, views) is views
    assert views_for(vlm, settings, image, None, views) is views  # None: the settings' own cap, 4096
    smaller = views_for(vlm, settings, image, 1024, views)
    assert smaller is not views and smaller.candidate_grid != views.candidate_grid
    for other in (views_for(vlm, settings, image.copy(), 4096, views),  # the same pixels, another image
                  views_for(vlm, replace(settings, gestalt_max_tokens=64), image, 4096, views),
                  views_for(SimpleNamespace(device=torch.device("cpu"), cell=32, min_pixels=None), settings, image,
                            4096, views),
                  views_for(vlm, settings, image, 4096, make_views(image, max_cells=4096))):  # not views_for's
        assert other is not views
    assert views_for(vlm, settings, image, 4096, None) is not views  # none brought: new ones


def test_the_second_look_reads_half_the_first_unless_told():
    assert second_look_saccades(None, 273) == 136  # round(0.5 * 273): Python rounds half to even
    assert second_look_saccades(None, 1) == 1  # at least one
    assert second_look_saccades(40, 273) == 40


def test_token_counts_split_a_prompt_into_gestalt_saccades_and_text():
    assert token_counts(400, 256, 100) == dict(gestalt=256, saccade=100, text=44, total_visual=356)
    assert token_counts(600, 0, 0, total_visual=529) == dict(gestalt=0, saccade=0, text=71, total_visual=529)


def test_the_latency_split_has_every_part_and_zero_for_the_missing():
    assert latency_split({"vision": 3.5, "total": 9.0, "extra": 1.0}) == dict(vision=3.5, selection=0.0, prefill=0.0,
                                                                              decode=0.0, total=9.0)


def test_confidence_is_the_least_probable_text_token():
    vlm = SimpleNamespace(tokenizer=SimpleNamespace(all_special_ids=[0, 2]))  # 0, 2: special tokens (e.g. EOS)
    probs = torch.tensor([0.9, 0.6, 0.1, 0.8])
    assert answer_confidence(vlm, SimpleNamespace(ids=torch.tensor([[5, 7, 2, 9]]), probs=probs)) == pytest.approx(0.6)
    assert answer_confidence(vlm, SimpleNamespace(ids=torch.tensor([[0, 2, 2, 0]]), probs=probs)) == 0.0  # no text
    assert answer_confidence(vlm, SimpleNamespace(ids=torch.tensor([[5, 7, 2, 9]]), probs=None)) is None
