"""The sweep figures (arr_coc.eval.figures, run as python -m arr_coc.eval.figures): their points from evaluate's
results, the bench's TTFT per method and budget, and the PNGs."""

import argparse
import json

import pytest
from PIL import Image

from arr_coc.eval import figures
from arr_coc.eval.records import EvalRecord


def results(folder, rows):
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    return str(folder)


def result(kind, row, budget, score, tokens):
    """A sweep's result of one row at one budget; what the figures do not read left empty."""
    return EvalRecord(item=0, id="0", kind=kind, row=row, budget=budget, sweep=True, prediction="", answers=["a"],
                      score=score, visual_tokens=tokens, gflops=0.0, ttft_ms=0.0, total_ms=0.0, confidence=None)


BENCH = {"device": "GPU", "sizes": {"1792": {
    "pipelines": {"full/fast": {"ttft_ms": 230.0}, "arr/fast": {"ttft_ms": 50.0}},
    "budgets": {"16": {"arr": {"ttft_ms": 40.0}, "divprune": {"ttft_ms": 228.0}},
                "32": {"arr": {"ttft_ms": 41.0}, "divprune": {"ttft_ms": 229.0}}}}}}


def test_points_pool_folders_by_kind_and_budget(tmp_path):
    a = results(tmp_path / "a", [result("box_word", "arr-raster:topk", 16, 1, 272), result("box_word", "arr-raster:topk", 16, 0, 272),
                                 result("box_word", "full", None, 1, 4096), result("fine_print", "arr-raster:topk", 32, 1, 288)])
    b = results(tmp_path / "b", [result("box_word", "arr-raster:topk", 16, 1, 272), result("box_word", "arr:topk", 16, 0, 272)])
    got = figures.points("arr-raster:topk", [a, b])
    assert got["box_word"] == [figures.Point(16, 2.0, 3, 272.0)] and got["fine_print"] == [figures.Point(32, 1.0, 1, 288.0)]
    assert figures.bench_ttft(BENCH, 1792, "arr-raster:topk", 32) == 41.0
    assert figures.bench_ttft(BENCH, 1792, "divprune", 16) == 228.0
    assert figures.bench_ttft(BENCH, 1792, "full", None) == 230.0


def test_the_figures_are_drawn_and_a_bad_curve_is_refused(tmp_path):
    a = results(tmp_path / "a", [result(k, row, b, 1, 256 + (b or 0)) for k in ("box_word", "fine_print")
                                 for row, b in (("full", None), ("arr:topk", 16), ("arr:topk", 32), ("divprune", 16))])
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH))
    paths = figures.main(["--bench", str(bench), "--size", "1792", "--out", str(tmp_path / "figs"),
                          "--curve", f"full=full@{a}", "--curve", f"ARR=arr:topk@{a}", "--curve", f"divprune=divprune@{a}"])
    assert [p.name for p in paths] == ["accuracy_vs_tokens.png", "accuracy_vs_ttft.png"]
    assert all(Image.open(p).width > 2 * Image.open(p).height for p in paths)  # a panel per kind, side by side
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=ROW@FOLDER"):
        figures.curve_spec("full")
    with pytest.raises(argparse.ArgumentTypeError, match="no results.jsonl"):
        figures.curve_spec(f"x=full@{tmp_path}")


def test_layout_families_get_panels_of_their_own_and_an_untimed_method_leaves_only_the_ttft_figure(tmp_path, capsys):
    dense, sparse = (EvalRecord(**vars(result("box_word", "pixelprune", None, s, 300)) | {"family": f})
                     for f, s in (("box_grid", 0), ("slide", 1)))
    a = results(tmp_path / "a", [dense, sparse, result("box_word", "full", None, 1, 4096)])
    assert figures.points("pixelprune", [a]) == {"box_word (box_grid)": [figures.Point(None, 0.0, 1, 300.0)],
                                                 "box_word (slide)": [figures.Point(None, 1.0, 1, 300.0)]}
    assert figures.bench_ttft(BENCH, 1792, "pixelprune", None) is None  # the bench never timed it
    assert figures.bench_ttft(BENCH, 1792, "divprune", 273) is None
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH))
    figures.main(["--bench", str(bench), "--size", "1792", "--out", str(tmp_path / "figs"),
                  "--curve", f"full=full@{a}", "--curve", f"PixelPrune=pixelprune@{a}"])
    assert capsys.readouterr().out.splitlines()[0] == (
        "PixelPrune: the bench did not time pixelprune at these budgets; left out of the TTFT figure")


def test_a_budget_free_line_says_its_own_panels_tokens():
    """PixelPrune at its own count reads 3000 tokens of a dense page and 300 of a sparse one: each panel writes its
    own on the line, and the legend names the method only."""
    curves = {"PixelPrune": {"box_word (box_grid)": [figures.Point(None, 0.0, 1, 3000.0)],
                             "box_word (slide)": [figures.Point(None, 1.0, 1, 300.0)]}}
    fig = figures.figure(curves, lambda name, p: p.tokens, "visual tokens", "")
    dense, sparse = fig.axes
    assert [t.get_text() for t in dense.texts] == ["at 3000"] and [t.get_text() for t in sparse.texts] == ["at 300"]
    assert [t.get_text() for t in sparse.get_legend().get_texts()] == ["PixelPrune"]
