"""EvalRecord (arr_coc.eval.records): results.jsonl's line as evaluate has always written it, optional fields only
where a result has them, and the folders in benchmarks/ read back byte for byte."""

import json

from conftest import ROOT

from arr_coc.eval.records import EvalRecord

MEASURES = dict(prediction="piano", answers=["piano"], score=1.0, visual_tokens=272, gflops=19.8, ttft_ms=17.61,
                total_ms=19.64, confidence=0.5)


def test_a_plain_result_writes_its_fields_in_order_and_nothing_it_lacks():
    plain = EvalRecord(item=3, id="3", kind="chart", row="full", **MEASURES)
    assert json.dumps(plain.to_json()) == (
        '{"item": 3, "id": "3", "kind": "chart", "row": "full", "prediction": "piano", "answers": ["piano"], '
        '"score": 1.0, "visual_tokens": 272, "gflops": 19.8, "ttft_ms": 17.61, "total_ms": 19.64, "confidence": 0.5}')
    unscored = EvalRecord(item=3, id="3", kind="chart", row="full", **dict(MEASURES, answers=[], score=None))
    assert unscored.to_json()["score"] is None  # an item without answers: score null, written


def test_a_sweep_writes_every_budget_and_an_arr_result_on_a_box_its_fallback_even_when_none():
    free = EvalRecord(item=0, id="0", kind="box_word", row="full", budget=None, sweep=True, **MEASURES)
    assert list(free.to_json())[4:5] == ["budget"] and free.to_json()["budget"] is None
    arr = EvalRecord(item=0, id="0", kind="box_word", row="arr:topk", budget=16, sweep=True, **MEASURES,
                     contains=1.0, tensions={"budget": 16}, box_recall=0.5, box_precision=0.25, fallback=None)
    assert list(arr.to_json()) == ["item", "id", "kind", "row", "budget", "prediction", "answers", "score",
                                   "visual_tokens", "gflops", "ttft_ms", "total_ms", "confidence", "contains",
                                   "tensions", "box_recall", "box_precision", "fallback"]
    stock = EvalRecord(item=0, id="0", kind="box_word", row="budget", **MEASURES, box_recall=1.0, box_precision=0.1)
    assert "fallback" not in stock.to_json() and "budget" not in stock.to_json()  # no ARR, no sweep


def test_a_second_look_writes_its_first_score_even_unscored():
    looked = EvalRecord(item=0, id="0", kind="fine_print", row="arr+refix:topk", **dict(MEASURES, score=None),
                        refixated=False, confidences=[0.95], first_prediction="piano", first_score=None)
    assert list(looked.to_json())[-4:] == ["refixated", "confidences", "first_prediction", "first_score"]
    assert looked.to_json()["first_score"] is None


def test_the_benchmark_results_read_back_byte_for_byte():
    """A sweep's folder from before this type (baselines, ARR rows with tensions and box fallbacks, budget-free rows'
    null budgets): every line read and written again is the line on disk."""
    path = ROOT / "benchmarks/pocket47213_sweep_1792/h200_box_word_prior/results.jsonl"
    lines = path.read_text().splitlines()
    records = [EvalRecord.from_json(json.loads(line)) for line in lines]
    assert len(lines) == 3552 and any(r.fallback is None and r.tensions for r in records)
    assert [json.dumps(r.to_json()) for r in records] == lines
