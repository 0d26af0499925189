"""What every pipeline shares (arr_coc.pipelines.answer), with its expectations written out: a request's checks,
the second look's default size, the token counts, the latency split and the answer's confidence."""

from types import SimpleNamespace

import pytest
import torch

from arr_coc.errors import InputError
from arr_coc.pipelines.answer import (Request, answer_confidence, check_question, check_request, latency_split,
                                      second_look_saccades, token_counts)


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
