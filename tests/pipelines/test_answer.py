"""What every pipeline shares (arr_coc.pipelines.request, .answer, .steps), with its expectations written out: a
request's checks (its settings by name, its ablation by name), the views at their cap, the second look's default size,
the token counts, the latency split and the answer's confidence."""

from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from arr_coc.errors import InputError
from arr_coc.pipelines import check_pipeline
from arr_coc.pipelines.answer import TokenCounts, Timings, answer_confidence
from arr_coc.pipelines.arr_options import Options as ArrOptions, arr_options
from arr_coc.pipelines.request import Request, check_question, check_request, with_settings
from arr_coc.pipelines.steps import views_of
from arr_coc.pipelines.refixation import second_look_saccades
from arr_coc.relevance.ablation import ABLATIONS, NO_ABLATION
from arr_coc.settings import PipelineConfig


def test_a_question_is_stripped_and_an_empty_or_overlong_one_refused():
    assert check_question("  What is the value of PAGE?\n") == "What is the value of PAGE?"
    for empty in ("", "   ", None, 7):
        with pytest.raises(InputError, match="the question is empty"):
            check_question(empty)
    with pytest.raises(InputError, match="is 4001 characters long; the limit is 4000"):
        check_question("x" * 4001)


@pytest.mark.parametrize("request_, message", [(Request(max_new_tokens=0), "between 1 and 1024, got 0"),
                                               (Request(max_new_tokens=1025), "between 1 and 1024, got 1025"),
                                               (Request(options=(ArrOptions(refixate=1.5),)), "between 0 and 1, got 1.5"),
                                               (Request(options=(ArrOptions(refixate=float("nan")),)),
                                                "between 0 and 1, got nan"),
                                               (Request(options=(ArrOptions(refixate_budget=0),)), "at least 1, got 0")])
def test_a_request_out_of_bounds_is_refused_naming_the_bound(request_, message):
    with pytest.raises(InputError, match=message):
        check_request(request_)


def test_a_request_within_bounds_passes_unchanged():
    request = Request(max_new_tokens=1024, options=(ArrOptions(refixate=0.0, refixate_budget=1),))
    assert check_request(request) is request


def test_settings_by_name_go_over_a_request_and_an_unknown_one_is_named():
    base = Request(max_new_tokens=8, options=(ArrOptions(strategy="grid"),))
    assert with_settings(base, dict(budget="auto", max_new_tokens=2)) == Request(
        max_new_tokens=2, options=(ArrOptions(strategy="grid"),), budget="auto")
    assert base == Request(max_new_tokens=8, options=(ArrOptions(strategy="grid"),))  # the request given is left as it was
    assert with_settings(None, {}) == Request()
    with pytest.raises(InputError, match=r"unknown request setting 'max_new_token': a Request has max_new_tokens, "):
        with_settings(None, dict(max_new_token=2))
    with pytest.raises(TypeError, match="request must be a Request, got int"):  # ARRCOCQwen.answer's old 4th place
        with_settings(16, {})


def test_an_ablation_by_name_becomes_its_ablation_in_one_place():
    def ablated(ablation):
        return Request(options=(ArrOptions(ablation=ablation),))

    assert arr_options(check_request(ablated("raster"))).ablation is ABLATIONS["raster"]
    assert arr_options(check_request(ablated(ABLATIONS["raster"]))).ablation is ABLATIONS["raster"]
    for none in (None, "none", NO_ABLATION):
        assert arr_options(check_request(ablated(none))).ablation is None
    with pytest.raises(InputError, match="unknown ablation 'nope': one of information,"):
        check_request(ablated("nope"))


@pytest.mark.parametrize("pipeline, request_, message", [
    ("nonesuch", Request(), "pipeline must be one of"),
    ("full", Request(options=(ArrOptions(ablation="raster"),)),
     r"an ablation \(raster\) switches off part of ARR: it needs the arr pipeline"),
    ("full", Request(options=(ArrOptions(ablation=ABLATIONS["raster"]),)), r"an ablation \(raster\) switches off part of ARR"),
    ("gestalt", Request(options=(ArrOptions(refixate=0.5),)),
     "refixation is ARR's second look: it needs the arr pipeline, not gestalt"),
])
def test_a_pipeline_refuses_what_only_arr_does(pipeline, request_, message):
    with pytest.raises(InputError, match=message):
        check_pipeline(pipeline, request_)
    check_pipeline("arr", request_)  # ARR takes each


def test_views_are_made_at_the_settings_cap_or_the_one_a_request_names():
    """views_of: an RGB image kept as it is (the one the drawings read); the native grid at its 28 px cells under the
    settings' cap (4096) or a request's max_cells; the candidate grid at least twice the gestalt's per side."""
    parts = SimpleNamespace(vlm=SimpleNamespace(device=torch.device("cpu"), cell=28, min_pixels=None),
                            pipeline=PipelineConfig())
    image = Image.new("RGB", (1792, 1344), (10, 20, 30))
    views = views_of(parts, image)
    assert views.image is image
    assert (views.gestalt_grid, views.native_grid, views.candidate_grid) == ((14, 18), (48, 64), (48, 64))
    capped = views_of(parts, image, 1024)  # 27 x 36 native cells; the candidates twice the gestalt's 14 rows
    assert (capped.gestalt_grid, capped.native_grid, capped.candidate_grid) == ((14, 18), (27, 36), (28, 36))


def test_the_second_look_reads_half_the_first_unless_told():
    assert second_look_saccades(None, 273) == 136  # round(0.5 * 273): Python rounds half to even
    assert second_look_saccades(None, 1) == 1  # at least one
    assert second_look_saccades(40, 273) == 40


def test_token_counts_split_a_prompt_into_gestalt_saccades_and_text():
    assert TokenCounts.of_prompt(400, 256, 100) == TokenCounts(gestalt=256, saccade=100, text=44, total_visual=356)
    assert TokenCounts.of_prompt(600, 0, 0, total_visual=529) == TokenCounts(gestalt=0, saccade=0, text=71,
                                                                           total_visual=529)


def test_the_latency_split_has_every_part_and_zero_for_the_missing():
    assert Timings.of({"vision": 3.5, "total": 9.0, "extra": 1.0}) == Timings(vision=3.5, selection=0.0, prefill=0.0,
                                                                              decode=0.0, total=9.0)


def test_confidence_is_the_least_probable_text_token():
    vlm = SimpleNamespace(tokenizer=SimpleNamespace(all_special_ids=[0, 2]))  # 0, 2: special tokens (e.g. EOS)
    probs = torch.tensor([0.9, 0.6, 0.1, 0.8])
    assert answer_confidence(vlm, SimpleNamespace(ids=torch.tensor([[5, 7, 2, 9]]), probs=probs)) == pytest.approx(0.6)
    assert answer_confidence(vlm, SimpleNamespace(ids=torch.tensor([[0, 2, 2, 0]]), probs=probs)) == 0.0  # no text
    assert answer_confidence(vlm, SimpleNamespace(ids=torch.tensor([[5, 7, 2, 9]]), probs=None)) is None
