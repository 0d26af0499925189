"""evaluate.py and bench.py on the tiny model: the rows, the metrics, the report's shape and content."""

import json

import pytest

from arr_coc import bench, evaluate, metrics, ui


def test_correctness_ignores_case_and_punctuation():
    assert evaluate.is_correct("The total is 4,821.", "4 821")
    assert evaluate.is_correct("It's RED!", "red") and not evaluate.is_correct("reddish", "red")
    assert not evaluate.is_correct("anything", "")


def test_accuracy_and_ab_agreement_share_one_normaliser():
    assert ui.answers_agree is metrics.answers_agree and evaluate.is_correct is metrics.is_correct
    assert metrics.answers_agree("The total: 4,821.", "the total 4 821")  # inner punctuation too, as is_correct
    assert metrics.is_correct("The total: 4,821.", "the total 4 821")
    assert not metrics.answers_agree("a teaspoon", "a fork") and not metrics.answers_agree("red", "reddish")


def test_evaluate_compares_baselines_and_strategies(tmp_path):
    out = tmp_path / "eval.json"
    result = evaluate.main(["--model", "tiny", "--synthetic", "2", "--kinds", "text_vs_distractor,noise",
                            "--max-new-tokens", "2", "--json", str(out)])
    summary = result["summary"]
    assert result["model"] == "tiny" and result["checkpoint"] == "tiny-charts-documents"  # the app's default rule
    assert list(summary) == ["full", "gestalt", "budget", "arr:topk", "arr:logpolar", "arr:grid", "arr:random"]
    assert summary["full"]["visual_tokens"] == 1024 and summary["arr:topk"]["visual_tokens"] == 529
    assert "box_recall" not in summary["full"] and 0 <= summary["arr:topk"]["box_recall"] <= 1
    noise = [r for r in result["records"] if r["kind"] == "noise"]
    assert noise and all("box_recall" not in r for r in noise)  # no target box, no box metric
    assert json.loads(out.read_text())["summary"] == json.loads(json.dumps(summary))


def test_bench_reports_every_pipeline_and_engine_with_exact_decode_length(tmp_path):
    out = tmp_path / "bench.json"
    report = bench.main(["--model", "tiny", "--device", "cpu", "--new-tokens", "3", "--repeats", "1", "--sizes", "448,1000",
                         "--layer-repeats", "1", "--json", str(out)])
    assert report["device"] == "CPU" and report["layer"]["grid"] == [36, 36]  # native 1000 px: 36 cells of 28 px
    assert report["layer"]["layer_ms"] > 0 and report["layer"]["layer_eager_ms"] > 0
    assert set(report["sizes"]) == {448, 1000}
    big = report["sizes"][1000]
    assert set(big["pipelines"]) == {f"{p}/{e}" for p in ("arr", "full", "gestalt", "budget") for e in ("fast", "hf")}
    for r in big["pipelines"].values():
        assert r["new_tokens"] == 3  # EOS suppressed: every answer has the same length, with either engine
        assert r["timings_ms"]["total"] > r["timings_ms"]["prefill"] > 0 and r["ttft_ms"] > r["timings_ms"]["prefill"]
    assert big["pipelines"]["arr/fast"]["tokens"]["saccade"] == 273
    assert big["pipelines"]["full/hf"]["tokens"]["total_visual"] == 36 * 36  # full: the native view
    assert big["pipelines"]["arr/fast"]["gflops"]["vision"] < big["pipelines"]["full/hf"]["gflops"]["vision"]
    ttft = big["ratios"]["arr/fast vs full/hf"]["ttft"]
    assert ttft == pytest.approx(big["pipelines"]["arr/fast"]["ttft_ms"] / big["pipelines"]["full/hf"]["ttft_ms"])
    assert "| arr | fast | 529 |" in bench.format_table(big["pipelines"])
    assert json.loads(out.read_text())["sizes"]["1000"]["ratios"] == json.loads(json.dumps(big["ratios"]))


def test_box_recall_and_precision():
    import torch

    coverage = torch.zeros(4, 4)
    coverage[0, :2] = 1.0  # the box touches cells 0 and 1
    coverage[1, 0] = 0.25  # and partly cell 4
    recall, precision = evaluate.box_recall_precision(coverage, torch.tensor([0, 4, 9, 15]))
    assert recall == 2 / 3 and precision == 2 / 4
