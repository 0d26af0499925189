"""The answer metrics against hand-computed values, and the one normaliser behind accuracy and A/B agreement."""

import pytest
import torch

from arr_coc import metrics, ui


def test_correctness_ignores_case_and_punctuation():
    assert metrics.is_correct("The total is 4,821.", "4 821")
    assert metrics.is_correct("It's RED!", "red") and not metrics.is_correct("reddish", "red")
    assert not metrics.is_correct("anything", "")
    assert metrics.contains("It is red.", ["blue", "red"]) == 1.0 and metrics.contains("green", ["red"]) == 0.0


def test_accuracy_and_ab_agreement_share_one_normaliser():
    assert ui.answers_agree is metrics.answers_agree
    assert metrics.answers_agree("The total: 4,821.", "the total 4 821")  # inner punctuation too, as is_correct
    assert metrics.is_correct("The total: 4,821.", "the total 4 821")
    assert not metrics.answers_agree("a teaspoon", "a fork") and not metrics.answers_agree("red", "reddish")


def test_edit_distance():
    assert metrics.edit_distance("kitten", "sitting") == 3
    assert metrics.edit_distance("", "abc") == 3 and metrics.edit_distance("same", "same") == 0


def test_anls_is_one_minus_normalised_distance_cut_at_half():
    assert metrics.anls("Invoice", ["invoice"]) == 1.0  # case and spacing ignored
    assert metrics.anls("invoise", ["invoice"]) == pytest.approx(1 - 1 / 7)
    assert metrics.anls("abcdef", ["abcxyz"]) == 0.0  # distance 3/6 = 0.5: at the threshold, no credit
    assert metrics.anls("abcdeg", ["zzz", "abcdef"]) == pytest.approx(1 - 1 / 6)  # the best reference counts
    assert metrics.anls("", ["x"]) == 0.0


def test_vqa_accuracy_averages_ten_leave_one_out_subsets():
    assert metrics.vqa_accuracy("two", ["2"] * 10) == 1.0  # number words as digits
    assert metrics.vqa_accuracy("A dog.", ["dog"] * 3 + ["cat"] * 7) == pytest.approx(0.9)  # 3 of 10: (7*1 + 3*2/3)/10
    assert metrics.vqa_accuracy("dog", ["dog"] + ["cat"] * 9) == pytest.approx(0.3)  # 1 of 10: (9*1/3 + 0)/10
    assert metrics.vqa_accuracy("bird", ["dog"] * 10) == 0.0
    assert metrics.vqa_accuracy("the dog", ["dog"]) == 1.0  # a single reference: exact after normalising


def test_relaxed_accuracy_allows_five_percent_on_numbers():
    assert metrics.relaxed_accuracy("41.5", ["42"]) == 1.0 and metrics.relaxed_accuracy("39", ["42"]) == 0.0
    assert metrics.relaxed_accuracy("1,050%", ["1000"]) == 1.0  # thousands separators and % are read
    assert metrics.relaxed_accuracy("0", ["0"]) == 1.0 and metrics.relaxed_accuracy("0.01", ["0"]) == 0.0
    assert metrics.relaxed_accuracy("Yes.", ["yes"]) == 1.0 and metrics.relaxed_accuracy("no", ["yes"]) == 0.0


def test_every_metric_is_registered_and_bounded():
    assert set(metrics.METRICS) == {"anls", "vqa", "relaxed", "contains"}
    for score in metrics.METRICS.values():
        for prediction, answers in (("4821", ["4821"]), ("nonsense", ["4821", "4,821"]), ("", ["a"])):
            assert 0.0 <= score(prediction, answers) <= 1.0
        assert score("4821", ["4821"]) == 1.0


def test_box_recall_and_precision():
    coverage = torch.zeros(4, 4)
    coverage[0, :2] = 1.0  # the box touches cells 0 and 1
    coverage[1, 0] = 0.25  # and partly cell 4
    recall, precision = metrics.box_recall_precision(coverage, torch.tensor([0, 4, 9, 15]))
    assert recall == 2 / 3 and precision == 2 / 4
