"""
The answer metrics against scores worked out by hand from the reference definitions (the official DocVQA ANLS,
the EvalAI answer processor with mmf's leave-one-out average, pix2struct's relaxed_correctness), every case of
issue 20 among them; the lenient `contains` and the one normaliser behind it and A/B agreement.
"""

import pytest
import torch

from arr_coc.app import ui
from arr_coc.eval import metrics

# (prediction, references, score, why): distance on the stripped, lower-cased, space-collapsed strings, over the
# longer RAW string's length after upper-casing; 1 - the best, 0 below 0.5
ANLS_CASES = [
    ("12", ["13"], 0.5, "distance 1 / length 2: a similarity of exactly 0.5 keeps 0.5"),
    ("ab", ["ac"], 0.5, "the same boundary"),
    ("abcdef", ["abcxyz"], 0.5, "3 / 6: the boundary again"),
    ("abcde", ["abxyz"], 0.0, "3 / 5 = 0.6: a similarity of 0.4 is below the threshold"),
    ("abc", ["abd"], 2 / 3, "1 / 3"),
    ("invoise", ["invoice"], 1 - 1 / 7, "1 / 7"),
    ("Invoice", ["invoice"], 1.0, "case ignored"),
    (" invoice ", ["invoice"], 1.0, "outer spaces ignored by the distance"),
    ("a  b", ["a c"], 0.75, "distance 1 between 'a b' and 'a c', over the raw length 4 (not 3 after collapsing)"),
    ("ßß", ["ab"], 0.5, "'ßß'.upper() is 'SSSS': distance 2 / length 4 (not 2, which would give 0)"),
    ("abcdeg", ["zzz", "abcdef"], 1 - 1 / 6, "the best reference counts"),
    ("", ["x"], 0.0, "1 / 1"),
    ("", [""], 1.0, "both empty: distance 0"),
]

# (prediction, reference, processed prediction, processed reference): the EvalAI answer processor's steps
VQA_ANSWER_CASES = [
    ("1,000", "1000", "1000", "1000"),  # commas deleted first: a thousands separator is no difference
    ("dont", "don't", "don't", "don't"),  # the contractions map
    ("none", "0", "0", "0"),  # the number map, "none" included
    ("The Two", "2", "2", "2"),  # lower case, articles dropped, number words as digits
    ("$5", "5", "$5", "5"),  # "$" is not in the punctuation list
    ("50%", "50", "50%", "50"),  # nor is "%"
    ("12:30", "12 30", "12:30", "12 30"),  # nor ":"
    ("3.5", "3 5", "3.5", "3 5"),  # a period before a digit stays
    ("it's", "it", "it 's", "it"),  # "'s" is split off, not deleted
    ("don\u2019t", "don't", "don\u2019t", "don't"),  # a curly apostrophe is no apostrophe
    ("e-mail", "email", "e mail", "email"),  # a mark touching no space becomes a space
    ("hello - world", "hello world", "hello world", "hello world"),  # one touching a space is deleted
    ("Dr. Pepper.", "dr pepper", "dr pepper", "dr pepper"),  # periods not before a digit are deleted
    ("Stop?\n", "stop", "stop", "stop"),  # "?" deleted, newlines as spaces
]


@pytest.mark.parametrize("prediction, answers, score, why", ANLS_CASES)
def test_anls_follows_the_official_docvqa_script(prediction, answers, score, why):
    assert metrics.anls(prediction, answers) == pytest.approx(score), why


def test_edit_distance():
    assert metrics.edit_distance("kitten", "sitting") == 3
    assert metrics.edit_distance("", "abc") == 3 and metrics.edit_distance("same", "same") == 0


@pytest.mark.parametrize("prediction, reference, processed, processed_reference", VQA_ANSWER_CASES)
def test_vqa_answers_go_through_the_evalai_processor(prediction, reference, processed, processed_reference):
    assert metrics.vqa_answer(prediction) == processed and metrics.vqa_answer(reference) == processed_reference
    # ten humans all giving the reference: 1 when the processed answers are equal, else 0
    assert metrics.vqa_accuracy(prediction, [reference] * 10) == float(processed == processed_reference)


def test_vqa_punctuation_step_and_its_digit_comma_rule():
    # called on its own (the processor deletes commas before it): a digit-comma-digit anywhere makes every mark
    # deleted rather than turned into a space
    assert metrics.vqa_punctuation("1,000-ish") == "1000ish"
    assert metrics.vqa_punctuation("a,b-c") == "a b c"
    assert metrics.vqa_answer("x." * 40) == "x" * 32 + "x." * 8  # the reference strips 32 periods at most


@pytest.mark.parametrize("prediction, answers, score", [
    ("two", ["2"] * 10, 1.0),
    ("A dog.", ["dog"] * 4 + ["cat"] * 6, 1.0),  # every leave-one-out keeps 3 or 4 agreeing
    ("A dog.", ["dog"] * 3 + ["cat"] * 7, 0.9),  # 7 leave-one-outs keep 3 (1 each), 3 keep 2 (2/3 each): 9 / 10
    ("dog", ["dog"] * 2 + ["cat"] * 8, 0.6),  # 8 keep 2 (2/3), 2 keep 1 (1/3): (16/3 + 2/3) / 10
    ("dog", ["dog"] + ["cat"] * 9, 0.3),  # 9 keep 1 (1/3), 1 keeps none: 3 / 10
    ("bird", ["dog"] * 10, 0.0),
    ("dog", ["dog"], 0.0),  # a single reference leaves no other human to agree with
])
def test_vqa_accuracy_is_mmfs_leave_one_out_average(prediction, answers, score):
    assert metrics.vqa_accuracy(prediction, answers) == pytest.approx(score)


@pytest.mark.parametrize("prediction, target, correct, why", [
    ("41.5", "42", True, "0.5 / 42 = 1.2 %"),
    ("39", "42", False, "3 / 42 = 7.1 %"),
    ("105", "100", True, "5 / 100: exactly 5 % is within"),
    ("95", "100", True, "the same from below"),
    ("106", "100", False, "6 %"),
    ("42%", "42", False, "'42%' reads as 0.42, 99 % from 42"),
    ("0.42", "42%", True, "0.42 against 0.42"),
    ("42%", "42%", True, "both 0.42"),
    ("-$5", "5", False, "'-$5' is no number: compared as text, the sign kept"),
    ("\u22125", "5", False, "a unicode minus is no number for float(): compared as text"),
    ("-5", "5", False, "a relative change of 2"),
    ("-5", "-5.0", True, "numbers compared as numbers"),
    ("1,000", "1000", False, "'1,000' is no number for float(): compared as text"),
    ("$5", "5", False, "'$' not stripped"),
    ("0", "0", True, "a zero target is compared as text: equal"),
    ("0.0", "0", False, "a zero target is compared as text, though the numbers are equal"),
    ("0.01", "0", False, "the same"),
    ("Yes", "yes", True, "text: equal up to case"),
    ("Yes.", "yes", False, "text: nothing stripped"),
    ("no", "yes", False, "different text"),
])
def test_relaxed_correctness_follows_pix2struct(prediction, target, correct, why):
    assert metrics.relaxed_correctness(prediction, target) is correct, why
    assert metrics.relaxed_accuracy(prediction, [target]) == float(correct), why


def test_relaxed_accuracy_takes_the_best_reference():
    assert metrics.relaxed_accuracy("10", ["7", "10.2"]) == 1.0 and metrics.relaxed_accuracy("10", ["7", "8"]) == 0.0


@pytest.mark.parametrize("metric", ["anls", "vqa", "relaxed"])
def test_a_benchmark_metric_without_answers_says_so(metric):
    with pytest.raises(ValueError, match="no reference answers"):
        metrics.METRICS[metric]("anything", [])


def test_contains_is_the_lenient_metric():
    assert metrics.LENIENT == "contains" and metrics.METRICS["contains"] is metrics.contains
    assert metrics.is_correct("The total is 4,821.", "4 821")
    assert metrics.is_correct("It's RED!", "red") and not metrics.is_correct("reddish", "red")
    assert not metrics.is_correct("anything", "")
    assert metrics.contains("It is red.", ["blue", "red"]) == 1.0 and metrics.contains("green", ["red"]) == 0.0
    assert metrics.contains("42%", ["42"]) == 1.0  # where relaxed accuracy gives 0


def test_contains_and_ab_agreement_share_one_normaliser():
    assert ui.answers_agree is metrics.answers_agree
    assert metrics.answers_agree("The total: 4,821.", "the total 4 821")  # inner punctuation too, as is_correct
    assert metrics.is_correct("The total: 4,821.", "the total 4 821")
    assert not metrics.answers_agree("a teaspoon", "a fork") and not metrics.answers_agree("red", "reddish")


def test_exact_match_is_the_answer_alone_up_to_case_and_punctuation():
    """The fine-print suite's metric: a list of words that holds the answer, which contains credits, is wrong."""
    assert metrics.exact("0427.", ["0427"]) == 1.0 and metrics.exact("Copper", ["copper"]) == 1.0
    assert metrics.exact("copper copper candle engine", ["copper"]) == 0.0
    assert metrics.contains("copper copper candle engine", ["copper"]) == 1.0


def test_every_metric_is_registered_and_bounded():
    assert set(metrics.METRICS) == {"anls", "vqa", "relaxed", "exact", "contains"}
    for score in metrics.METRICS.values():
        for prediction, answers in (("4821", ["4821"] * 10), ("nonsense", ["4821", "4,821"]), ("", ["a"])):
            assert 0.0 <= score(prediction, answers) <= 1.0
        assert score("4821", ["4821"] * 10) == 1.0


def test_box_recall_and_precision():
    coverage = torch.zeros(4, 4)
    coverage[0, :2] = 1.0  # the box touches cells 0 and 1
    coverage[1, 0] = 0.25  # and partly cell 4
    recall, precision = metrics.box_recall_precision(coverage, torch.tensor([0, 4, 9, 15]))
    assert recall == 2 / 3 and precision == 2 / 4
