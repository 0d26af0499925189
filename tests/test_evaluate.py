"""
evaluate.py on the tiny model: the rows, the set's metric, the report, resuming, bad input, and torchrun
(2 processes on CPU with gloo) giving the one-process results item for item; bench.py's report.
"""

import json
import os
import statistics
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import ROOT, write_parquet_set

from arr_coc import bench, evaluate
from arr_coc.pipelines import PIPELINES
from arr_coc.pipelines import FAST_ENGINE_ONLY
from arr_coc.eval import metrics, report
from arr_coc.eval.data import make_dataset, save_jsonl
from arr_coc.eval.records import EvalRecord
from arr_coc.eval.sets import Source

pytestmark = pytest.mark.usefixtures("tiny_loaded_once")  # the commands share the session's tiny model

FAST = ["--model", "tiny", "--baselines", "gestalt", "--strategies", "topk", "--max-new-tokens", "2", "--no-oracle"]
PAGE = (1000, 700)  # 25x36 native cells or more, more than ARR reads: it chooses saccades, whose faithfulness is measured


def results(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def record(**fields) -> EvalRecord:
    """A result with the fields a test gives; the others empty: no answer, one kind (""), no measures (None: the
    report leaves out a column no result measured)."""
    empty = dict(item=0, id="", kind="", row="full", prediction="", answers=[], score=None, visual_tokens=None,
                 gflops=None, ttft_ms=None, total_ms=None, confidence=None)
    return EvalRecord(**empty | fields)


def without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in evaluate.TIMING_FIELDS} for r in records]


def run_evaluate(*args: str, processes: int = 1) -> subprocess.CompletedProcess:
    """The command in a fresh process (under torchrun for processes > 1), one thread each, so the arithmetic
    of one and two processes is the same."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"] if processes > 1 else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *launcher, "-m", "arr_coc.evaluate", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_evaluate_compares_baselines_and_strategies_on_synthetic_scenes(tmp_path):
    out = tmp_path / "eval"
    assert evaluate.main(["--model", "tiny", "--synthetic", "2", "--kinds", "text_vs_distractor,noise",
                          "--max-new-tokens", "2", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    summary = report["summary"]
    assert report["checkpoint"] == "prior (untrained)" and report["metric"] == "contains"  # the default rule: no
    # shipped layer's evidence passes (issue 61)
    assert list(summary) == ["full", "gestalt", "budget", "divprune", "visionzip", "fastv", "pixelprune",
                             "pixelprune_n", "arr:topk", "arr:logpolar", "arr:grid", "arr:random", "arr:regions",
                                        "arr:regions_ink", "oracle"]
    assert summary["full"]["visual_tokens"] == 1024 and summary["arr:topk"]["visual_tokens"] == 529
    assert summary["divprune"]["visual_tokens"] == summary["visionzip"]["visual_tokens"] == 529  # as many as ARR reads
    assert summary["fastv"]["visual_tokens"] == 529
    assert summary["arr:topk"]["gflops"] < summary["full"]["gflops"]
    assert summary["full"]["box_recall"] == summary["gestalt"]["box_recall"] == 1.0  # they read every cell
    assert all(0 <= summary[row]["box_recall"] <= 1 for row in ("arr:topk", "divprune", "pixelprune_n"))
    assert summary["oracle"]["box_recall"] == 1.0 and summary["oracle"]["items"] == 1  # the asked box forced in
    records = results(out)
    assert [(r["item"], r["row"]) for r in records] == [(i, row) for i in range(2) for row in summary
                                                        if (i, row) != (1, "oracle")]  # item 1 (noise) has no box
    noise = [r for r in records if r["kind"] == "noise"]
    assert noise and all("box_recall" not in r for r in noise)  # no target box, no box metric
    peaks = {r["row"]: r.get("prior_peak") for r in records if r["kind"] != "noise"}
    assert isinstance(peaks["arr:topk"], bool) and peaks["full"] is None  # ARR's prior is there to peak; full's not


def test_ablations_are_rows_at_the_same_visual_tokens(tmp_path, capsys):
    out = tmp_path / "eval"
    assert evaluate.main(["--model", "tiny", "--checkpoint", "tiny-text-vs-distractor", "--baselines", "",
                          "--strategies", "topk", "--ablations", "all", "--synthetic", "1", "--kinds", "text_vs_distractor",
                          "--max-new-tokens", "1", "--no-oracle", "--out", str(out)]) == 0
    names = ["information", "perspectival", "participatory", "fixed-weights", "no-prior", "raster", "relevance-order",
             "no-gestalt", "explore", "diversify", "auto-budget", "busy-grid", "busy-keep"]
    summary = json.loads((out / "report.json").read_text())["summary"]
    assert list(summary) == ["arr:topk", *(f"arr-{name}:topk" for name in names)]
    assert {row["visual_tokens"] for name, row in summary.items() if name != "arr-auto-budget:topk"} == {529}
    records = {r["row"]: r for r in results(out)}
    tensions = {row: r["tensions"] for row, r in records.items()}
    # the tension rows: each tension on, at its fixed value, against arr:topk where all are at their priors
    assert (tensions["arr:topk"]["explore"], tensions["arr:topk"]["diversify"], tensions["arr:topk"]["budget"]) == (0, 0, 273)
    assert tensions["arr-explore:topk"]["explore"] == 0.25 and tensions["arr-diversify:topk"]["diversify"] == 2.0
    auto = tensions["arr-auto-budget:topk"]
    assert auto["auto_budget"] and 64 <= auto["budget"] <= 512
    assert records["arr-auto-budget:topk"]["visual_tokens"] == 256 + auto["budget"]
    assert "Mean visual tokens (accuracy) per scene kind" in (out / "report.md").read_text()
    no_gestalt, arr = records["arr-no-gestalt:topk"], records["arr:topk"]  # 529 saccades hold the 273 most relevant
    assert no_gestalt["box_recall"] == arr["box_recall"] == 1 and no_gestalt["box_precision"] < arr["box_precision"]
    with pytest.raises(SystemExit):
        evaluate.parse_args(["--ablations", "raster,nope"])
    assert "unknown ['nope']; choose from information,perspectival" in capsys.readouterr().err


def test_the_adaptive_budget_spends_each_images_own_tokens_and_the_reducers_follow(tmp_path):
    out = tmp_path / "eval"
    assert evaluate.main(["--model", "tiny", "--checkpoint", "prior", "--baselines", "divprune", "--strategies", "topk",
                          "--budget", "auto", "--min-budget", "20", "--max-budget", "300", "--synthetic", "2",
                          "--kinds", "text_vs_distractor,chart", "--max-new-tokens", "1", "--out", str(out)]) == 0
    records = results(out)
    arr = {r["item"]: r for r in records if r["row"] == "arr:topk"}
    assert all(r["tensions"]["auto_budget"] and 20 <= r["tensions"]["budget"] <= 300 for r in arr.values())
    assert len({r["tensions"]["budget"] for r in arr.values()}) == 2  # each image its own K
    for r in records:
        if r["row"] == "divprune":  # the reducer keeps as many tokens as ARR read of the same image and question
            assert r["visual_tokens"] == arr[r["item"]]["visual_tokens"] == 256 + arr[r["item"]]["tensions"]["budget"]
    report_md = (out / "report.md").read_text()
    assert f"| arr:topk | {arr[0]['visual_tokens']} (" in report_md  # one item per kind: its tokens are the mean


def test_a_second_look_row_records_when_it_fired_and_the_report_compares_with_and_without(tmp_path, capsys):
    """--refixate 1 fires on every item (no answer is certain): each arr+refix result says so, keeps its first
    answer's score, and report.md's section counts the firings; arr:topk has no second look."""
    out = tmp_path / "eval"
    assert evaluate.main([*FAST, "--synthetic", "2", "--kinds", "text_vs_distractor", "--budget", "40",
                          "--refixate", "1", "--refixate-budget", "20", "--out", str(out)]) == 0
    assert "## Second look (refixation)" in capsys.readouterr().out
    records = results(out)
    assert [r["row"] for r in records[:3]] == ["gestalt", "arr:topk", "arr+refix:topk"]
    refix = [r for r in records if r["row"] == "arr+refix:topk"]
    plain = {r["item"]: r for r in records if r["row"] == "arr:topk"}
    assert all(r["refixated"] and len(r["confidences"]) == 2 and r["visual_tokens"] == 256 + 60 for r in refix)
    assert all(r["first_prediction"] == plain[r["item"]]["prediction"] for r in refix)  # the first look is arr:topk's
    assert all(r["first_score"] == plain[r["item"]]["score"] for r in refix) and "refixated" not in plain[0]
    md = (out / "report.md").read_text()
    assert "| arr+refix:topk | 2 | 2 | 1.000 |" in md
    summary = json.loads((out / "report.json").read_text())["refixation"]["arr+refix:topk"]
    assert summary["fired"] == 2 and summary["accuracy_without"] == statistics.fmean(r["score"] for r in plain.values())
    never = report.refixation_summary([replace(EvalRecord.from_json(r), refixated=False) for r in refix])
    never = never["arr+refix:topk"]
    assert never["fire_rate"] == 0 and "accuracy_when_fired" not in never


def test_the_second_look_section_compares_with_and_without_on_the_items_where_it_fired():
    row = lambda fired, score, first: record(row="arr+refix:topk", refixated=fired, score=score, first_score=first)  # noqa: E731
    records = [row(True, 1.0, 0.0), row(True, 0.0, 0.0), row(False, 1.0, 1.0), row(False, 0.0, 0.0),
               record(row="arr:topk", score=1.0)]
    summary = report.refixation_summary(records)
    assert list(summary) == ["arr+refix:topk"]
    assert summary["arr+refix:topk"] == dict(items=4, fired=2, fire_rate=0.5, accuracy=0.5, accuracy_without=0.25,
                                             accuracy_when_fired=0.5, accuracy_without_when_fired=0.0)
    assert "| arr+refix:topk | 4 | 2 | 0.500 | 0.500 | 0.250 | 0.500 | 0.000 |" in report.refixation_table(summary)


SWEEP = ["--model", "tiny", "--synthetic", "1", "--kinds", "text_vs_distractor", "--size", "560",  # 20x20 native cells
         "--baselines", "full,budget,divprune", "--strategies", "topk", "--max-new-tokens", "1", "--no-oracle"]


def test_a_budget_sweep_runs_each_row_at_each_budget_at_arrs_visual_tokens(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert evaluate.main([*SWEEP, "--budgets", "128,2000,64", "--out", str(out)]) == 0
    # 2000 saccades do not fit the 32x32 candidate grid: skipped, said in one line, not a crash
    assert ("skipped arr:topk at budget 2000 on 1 item(s): 2000 saccades exceed the 32x32 = 1024 candidate cells"
            in capsys.readouterr().err)
    records = results(out)
    assert [(r["row"], r["budget"]) for r in records] == [("full", None)] + [
        (row, budget) for budget in (64, 128) for row in ("budget", "divprune", "arr:topk")]  # full runs once
    tokens = {(r["row"], r["budget"]): r["visual_tokens"] for r in records}
    for budget in (64, 128):  # ARR reads the 16x16 gestalt + the saccades; the others as many, or about as many
        assert tokens["arr:topk", budget] == tokens["divprune", budget] == 256 + budget
        assert 256 + budget - 40 < tokens["budget", budget] <= 256 + budget  # a whole grid of cells
    assert tokens["budget", 64] < tokens["budget", 128] and tokens["full", None] == 20 * 20  # the native grid
    report_json = json.loads((out / "report.json").read_text())
    assert report_json["budgets"] == [64, 128, 2000] and report_json["budget"] is None
    curves = report_json["curves"]
    assert list(curves) == ["full", "budget", "divprune", "arr:topk"] and len(curves["full"]) == 1
    for row in ("budget", "divprune", "arr:topk"):  # one point per budget; 2000's holds no item
        assert [(p["budget"], p["items"]) for p in curves[row]] == [(64, 1), (128, 1), (2000, 0)]
        assert [p["visual_tokens"] for p in curves[row][:2]] == [tokens[row, 64], tokens[row, 128]]
    markdown = (out / "report.md").read_text()
    assert "### budget 64 saccades" in markdown and "### budget 128 saccades" in markdown
    assert "budget 2000" not in markdown  # skipped on every item: no table
    assert "![accuracy against visual tokens](accuracy_vs_tokens.png)" in markdown
    assert "![accuracy against TTFT](accuracy_vs_ttft.png)" in markdown
    for plot in ("accuracy_vs_tokens.png", "accuracy_vs_ttft.png"):
        assert (out / plot).stat().st_size > 10_000
    figure = report.sweep_plot(curves, "visual_tokens", "visual tokens", "contains", tmp_path / "again.png")
    lines = {line.get_label(): list(line.get_xdata()) for line in figure.axes[0].lines}
    assert lines == {"full": [400], "budget": [tokens["budget", 64], tokens["budget", 128]],
                     "divprune": [320, 384], "arr:topk": [320, 384]}  # one curve per row, through its budgets
    styles = {line.get_label(): line.get_linestyle() for line in figure.axes[0].lines}
    assert styles == {"full": "None", "budget": "-", "divprune": "-", "arr:topk": "-"}  # full: a lone point
    # the same command resumes (nothing new to evaluate); another sweep is refused, naming the budgets
    assert evaluate.main([*SWEEP, "--budgets", "64,128,2000", "--out", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["throughput"]["items"] == 0
    assert without_timings(results(out)) == without_timings(records)
    assert evaluate.main([*SWEEP, "--budgets", "64", "--out", str(out)]) == 2
    assert "(budgets: [64, 128, 2000] there, [64] now)" in capsys.readouterr().err


def test_a_sweep_gives_the_second_look_its_row_at_each_budget_and_skips_it_where_both_looks_overflow(tmp_path,
                                                                                                         capsys):
    """arr+refix runs per budget like any row; at 700 saccades its second look's 400 more would not fit the 32x32
    candidate grid, so that job alone is skipped; the second-look section has a line per budget."""
    out = tmp_path / "sweep-refix"
    assert evaluate.main([*SWEEP[:8], "--baselines", "", "--strategies", "topk", "--max-new-tokens", "1",
                          "--no-oracle", "--budgets", "64,700",
                          "--refixate", "1", "--refixate-budget", "400", "--out", str(out)]) == 0
    assert ("skipped arr+refix:topk at budget 700 on 1 item(s): 1100 saccades exceed the 32x32 = 1024 candidate "
            "cells" in capsys.readouterr().err)
    records = results(out)
    assert [(r["row"], r["budget"]) for r in records] == [("arr:topk", 64), ("arr+refix:topk", 64), ("arr:topk", 700)]
    assert records[1]["refixated"] and records[1]["visual_tokens"] == 256 + 64 + 400
    assert records[1]["first_prediction"] == records[0]["prediction"]  # the first look is arr:topk's at that budget
    markdown = (out / "report.md").read_text()
    assert "### budget 64 saccades" in markdown and "## Second look (refixation)" in markdown
    assert "| arr+refix:topk@64 | 1 | 1 | 1.000 |" in markdown and "arr+refix:topk@700 |" not in markdown
    assert list(json.loads((out / "report.json").read_text())["refixation"]) == ["arr+refix:topk@64"]


def test_in_a_sweep_the_adaptive_budget_row_runs_once_and_each_budget_gets_its_line_per_scene_kind(tmp_path):
    """arr-auto-budget reads no fixed budget: like full, it runs once and sits in every budget's table; the
    tokens-by-kind table has a line per row and budget (arr:topk@64, ...); every ARR result records its tensions."""
    out = tmp_path / "sweep-auto"
    assert evaluate.main([*SWEEP[:8], "--baselines", "", "--strategies", "topk", "--ablations", "auto-budget",
                          "--max-budget", "100", "--max-new-tokens", "1", "--budgets", "64,128", "--no-oracle",
                          "--out", str(out)]) == 0
    records = results(out)
    assert [(r["row"], r["budget"]) for r in records] == [("arr-auto-budget:topk", None), ("arr:topk", 64),
                                                          ("arr:topk", 128)]
    assert records[0]["tensions"]["auto_budget"] and 64 <= records[0]["tensions"]["budget"] <= 100
    assert [r["tensions"]["budget"] for r in records[1:]] == [64, 128]
    markdown = (out / "report.md").read_text()
    assert "| arr-auto-budget:topk |" in markdown.split("### budget 64 saccades")[1].split("### budget 128")[0]
    kinds = markdown.split("Mean visual tokens (accuracy) per scene kind:")[1]
    assert "| arr:topk@64 | 320" in kinds and "| arr:topk@128 | 384" in kinds and "| arr-auto-budget:topk |" in kinds
    assert json.loads((out / "report.json").read_text())["max_budget"] == 100  # the settings check knows the bounds


def test_budgets_are_checked_before_anything_loads(capsys):
    for argv, message in ((["--budget", "100", "--budgets", "64"], "argument --budgets: not allowed with argument --budget"),
                          (["--budget", "auto", "--budgets", "64"], "argument --budgets: not allowed with argument --budget"),
                          (["--budgets", "64,5000"], "argument --budgets: 5000 exceeds --max-cells 4096"),
                          (["--budgets", "64,x"], "argument --budgets: expected an integer, got 'x'")):
        with pytest.raises(SystemExit):
            evaluate.parse_args(argv)
        assert message in capsys.readouterr().err
    assert evaluate.parse_args(["--budgets", "128,64,128"]).budgets == [64, 128]


def test_resuming_with_other_settings_is_refused_naming_them(tmp_path, capsys):
    out = tmp_path / "eval"
    assert evaluate.main([*FAST, "--synthetic", "2", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert evaluate.main([*FAST, "--synthetic", "1", "--seed", "7", "--out", str(out)]) == 2
    error = capsys.readouterr().err.splitlines()
    assert error[next(i for i, line in enumerate(error) if line.startswith("error")):] == [f"error: {out} holds the results of another run (synthetic: 2 there, 1 now; seed: 1234 there, 7 "
                      "now); choose another --out, or resume that run with its own settings"]  # no "run it again"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing evaluated, nothing rewritten
    assert evaluate.main([*FAST, "--synthetic", "2", "--out", str(out)]) == 0  # the same command: resumed, all done
    assert json.loads((out / "report.json").read_text())["throughput"]["items"] == 0


# an evaluate flag -> (the flags of the run it changes, another value); every flag but --device and --out
OTHER_VALUES = {
    "model": ([], ["--model", "tiny-qwen3-vl"]), "checkpoint": ([], ["--checkpoint", "prior"]),
    "prior_readout": ([], ["--prior-readout", "default"]),
    "dataset": (["--dataset", "lmms-lab/textvqa"], ["--dataset", "lmms-lab/DocVQA"]),
    "split": (["--dataset", "lmms-lab/textvqa"], ["--split", "test"]),
    "config": (["--dataset", "lmms-lab/textvqa"], ["--config", "other"]),
    "schema": (["--dataset", "lmms-lab/textvqa"], ["--schema", "docvqa"]), "metric": ([], ["--metric", "anls"]),
    "limit": ([], ["--limit", "3"]), "synthetic": ([], ["--synthetic", "8"]), "kinds": ([], ["--kinds", "noise"]), "size": ([], ["--size", "1792"]),
    "seed": ([], ["--seed", "1"]), "baselines": ([], ["--baselines", "full"]), "strategies": ([], ["--strategies", "grid"]),
    "ablations": ([], ["--ablations", "raster"]), "no_oracle": ([], ["--no-oracle"]),
    "budget": ([], ["--budget", "100"]), "budgets": ([], ["--budgets", "64,128"]), "max_new_tokens": ([], ["--max-new-tokens", "3"]),
    "min_budget": (["--budget", "auto"], ["--min-budget", "10"]),
    "max_budget": (["--ablations", "auto-budget"], ["--max-budget", "100"]),
    "max_cells": ([], ["--max-cells", "2048"]), "fastv_layer": ([], ["--fastv-layer", "3"]),
    "gestalt_tokens": ([], ["--gestalt-tokens", "576"]),
    "pixelprune_tau": ([], ["--pixelprune-tau", "8"]),
    "faithfulness": ([], ["--faithfulness"]), "refixate": ([], ["--refixate", "0.5"]),
    "refixate_budget": (["--refixate", "0.5"], ["--refixate-budget", "50"]),
    "refixate_guide": (["--refixate", "0.5"], ["--refixate-guide", "attention"]),
    "looks": ([], ["--looks", "one,two_scale"]), "crop_tokens": (["--looks", "two_scale"], ["--crop-tokens", "64"]),
    "faithfulness_steps": (["--faithfulness"], ["--faithfulness-steps", "4"]),
    "conversation": (["--kinds", "box_word"], ["--conversation"]),
    "turns": (["--kinds", "box_word", "--conversation"], ["--turns", "2"]),
    "held_out_layouts": (["--kinds", "box_word"], ["--held-out-layouts"]),
    "families": (["--kinds", "box_word"], ["--families", "held-out"]),
}


def settings_of(argv: list[str]) -> dict:
    """run_settings for these flags, the dataset's schema, the metric and the checkpoint resolved as given."""
    args = evaluate.parse_args(argv)
    source = Source(args.dataset or "synthetic", args.schema or ("textvqa" if args.dataset else "jsonl"), [])
    return evaluate.run_settings(args, source, args.metric or source.metric, args.checkpoint or "default")


@pytest.mark.parametrize("flag", OTHER_VALUES)
def test_every_flag_but_where_it_runs_counts_in_the_settings(flag):
    run_flags, other = OTHER_VALUES[flag]
    assert settings_of([*run_flags, *other]) != settings_of(run_flags)
    assert settings_of([*run_flags, "--device", "cpu", "--out", "elsewhere"]) == settings_of(run_flags)


def test_the_settings_check_knows_every_flag(capsys):
    """A new evaluate flag must be listed above (it changes the results) or be one that says where they run."""
    with pytest.raises(SystemExit):
        evaluate.parse_args(["--help"])
    usage = capsys.readouterr().out.partition("\n\n")[0]  # "usage: ... [--model MODEL] ..."
    flags = {word.strip("[]").removeprefix("--").replace("-", "_") for word in usage.split() if word.startswith(("--", "[--"))}
    assert flags == set(OTHER_VALUES) | {"device", "out"}


def test_a_parquet_set_gets_its_metric_a_report_and_plots(tmp_path):
    folder = write_parquet_set(tmp_path / "docvqa", "docvqa", 3, size=PAGE)
    out = tmp_path / "eval"
    assert evaluate.main([*FAST, "--dataset", str(folder), "--limit", "2", "--faithfulness",
                          "--faithfulness-steps", "3", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "docvqa" and report["metric"] == "anls" and report["items"] == 2
    assert report["throughput"]["items"] == 2 and report["throughput"]["items_per_s"] > 0
    assert report["prompt"] == "{question}\nAnswer the question using a single word or phrase."  # what was asked
    assert "lmms-eval docvqa_val" in report["prompt_reference"] and report["unscored_items"] == 0
    assert "prompt `{question}\\nAnswer the question using a single word or phrase.`" in (out / "report.md").read_text()
    records = results(out)
    assert len(records) == 4 and records[0]["answers"] == ["000", "$000"] and records[0]["id"] == "q0"
    assert all(r["contains"] == metrics.contains(r["prediction"], r["answers"]) for r in records)  # the lenient extra
    topk = [r for r in records if r["row"] == "arr:topk"]
    curves = topk[0]["faithfulness"]
    assert len(curves["deletion"]) == len(curves["random"]) == len(curves["insertion"]) == 4
    assert "faithfulness" not in records[0]  # the gestalt row has no saccades to remove
    # the Markdown table says what the JSON says
    table = (out / "report.md").read_text().splitlines()
    head = [c.strip() for c in next(line for line in table if line.startswith("| row")).strip("|").split("|")]
    for row, means in report["summary"].items():
        cells = [c.strip() for c in next(line for line in table if line.startswith(f"| {row} |")).strip("|").split("|")]
        shown = dict(zip(head, cells))
        assert float(shown["accuracy (anls)"]) == pytest.approx(means["accuracy"], abs=5e-4)
        assert float(shown["contains (lenient)"]) == pytest.approx(means["contains"], abs=5e-4)
        assert float(shown["visual tokens"]) == pytest.approx(means["visual_tokens"], abs=0.5)
        assert float(shown["TTFT ms"]) == pytest.approx(means["ttft_ms"], abs=0.5)
        assert shown["deletion area"] == ("-" if row == "gestalt" else f"{means['deletion_area']:.3f}")
    assert means["deletion_area"] == pytest.approx(sum(r["faithfulness"]["areas"]["deletion"] for r in topk) / 2)
    for plot in ("accuracy_vs_tokens.png", "accuracy_vs_ttft.png", "faithfulness.png"):
        assert (out / plot).stat().st_size > 10_000


def test_the_answer_limit_defaults_to_the_sets_own(tmp_path):
    folder = write_parquet_set(tmp_path / "docvqa", "docvqa", 1)
    out = tmp_path / "eval"
    assert evaluate.main(["--model", "tiny", "--baselines", "gestalt", "--strategies", "", "--dataset", str(folder),
                          "--out", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["max_new_tokens"] == 32  # lmms-eval's DocVQA limit


def test_items_without_answers_are_answered_counted_and_left_out_of_the_mean(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = write_parquet_set(tmp_path / "textvqa", "textvqa", 3, size=PAGE)
    path = next(folder.rglob("*.parquet"))
    table = pq.read_table(path)  # a test split's items: answers None or empty; item 1 keeps its ten
    answers = pa.array([None, ["stop"] * 10, []], type=table.schema.field("answers").type)
    pq.write_table(table.set_column(table.schema.get_field_index("answers"), "answers", answers), path)
    out = tmp_path / "eval"
    assert evaluate.main([*FAST, "--dataset", str(folder), "--faithfulness", "--faithfulness-steps", "1",
                          "--out", str(out)]) == 0
    records = results(out)
    assert [r["score"] is None for r in records] == [True, True, False, False, True, True]
    assert all(("contains" in r) == (r["item"] == 1) for r in records)
    assert [r["item"] for r in records if "faithfulness" in r] == [1]  # no reference answer to follow elsewhere
    report = json.loads((out / "report.json").read_text())
    assert report["items"] == 3 and report["unscored_items"] == 2
    assert report["prompt"] == "{question.capitalize()}\nAnswer the question using a single word or phrase."
    gestalt = report["summary"]["gestalt"]
    assert gestalt["unscored"] == 2 and gestalt["accuracy"] == records[2]["score"]  # the mean of item 1 alone
    assert "| unscored (no answers) |" in (out / "report.md").read_text()
    assert "2 of 3 items have no reference answers" in capsys.readouterr().out


def test_a_wholly_unscored_split_reports_without_accuracy_or_plots(tmp_path):
    records = [record(item=i, row="full", score=None, visual_tokens=100, ttft_ms=5.0, total_ms=9.0, gflops=1.0)
               for i in range(3)]
    summary = report.summarise(records, ["full"])
    assert summary["full"]["unscored"] == 3 and "accuracy" not in summary["full"]
    paths = report.write_report(tmp_path, summary, dict(metric="vqa", unscored_items=3), records)
    assert [p.name for p in paths] == ["report.md", "report.json"]  # nothing to plot accuracy against
    assert "| full | 3 | 3 | 100 |" in (tmp_path / "report.md").read_text()


def test_an_interrupted_run_resumes_where_it_stopped(tmp_path):
    folder = write_parquet_set(tmp_path / "chartqa", "chartqa", 3)
    out = tmp_path / "eval"
    command = [*FAST, "--dataset", str(folder), "--out", str(out)]
    assert evaluate.main(command) == 0
    first = results(out)
    # an interruption: item 0 finished in results.jsonl, item 1 in a part file, item 2 cut off mid-line
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first[:2]))
    finished = [dict(r, prediction="kept from before") for r in first[2:4]]
    (out / "part-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in finished) + '{"item": 2, "row": "ges')
    assert evaluate.main(command) == 0
    resumed = results(out)
    assert [(r["item"], r["row"]) for r in resumed] == [(i, row) for i in range(3) for row in ("gestalt", "arr:topk")]
    assert resumed[:2] == first[:2] and [r["prediction"] for r in resumed[2:4]] == ["kept from before"] * 2
    assert without_timings(resumed[4:]) == without_timings(first[4:])  # item 2, evaluated again
    assert json.loads((out / "report.json").read_text())["throughput"]["items"] == 1  # only item 2 was new
    assert not list(out.glob("part-*.jsonl"))  # merged into results.jsonl


def test_a_dataset_that_is_not_there_creates_nothing(tmp_path, capsys):
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as exit:
        evaluate.main([*FAST, "--dataset", str(tmp_path / "nonexistent"), "--out", str(out)])
    assert exit.value.code == 2 and f"{tmp_path / 'nonexistent'} does not exist" in capsys.readouterr().err
    (tmp_path / "unnamed").mkdir()  # there, but no schema to tell: refused after parsing, still nothing made
    assert evaluate.main([*FAST, "--dataset", str(tmp_path / "unnamed"), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "cannot tell the schema" in error and "kept" not in error
    assert not out.exists()


def test_bad_sets_exit_2_in_one_line_and_keep_the_finished_items(tmp_path, capsys):
    bad = write_parquet_set(tmp_path / "textvqa", "textvqa", 3, corrupt=(2,))
    out = tmp_path / "eval"
    assert evaluate.main([*FAST, "--dataset", str(bad), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "error: item 2 (id 2): cannot read its image" in error and "run the same command again to resume" in error
    kept = [json.loads(line) for line in (out / "part-0.jsonl").read_text().splitlines()]
    assert [(r["item"], r["row"]) for r in kept] == [(0, "gestalt"), (0, "arr:topk"), (1, "gestalt"), (1, "arr:topk")]

    assert evaluate.main([*FAST, "--dataset", str(bad), "--max-new-tokens", "3", "--out", str(out)]) == 2
    error = capsys.readouterr().err  # its finished items are another run's: no "run the same command again"
    assert "holds the results of another run (max_new_tokens: 2 there, 3 now)" in error and "resume\n" not in error
    missing = write_parquet_set(tmp_path / "docvqa", "docvqa", 2, drop="question")
    assert evaluate.main([*FAST, "--dataset", str(missing), "--out", str(tmp_path / "other")]) == 2
    assert "has no question column" in capsys.readouterr().err


def test_a_question_over_the_token_limit_is_refused_before_the_first_item_naming_its_line(tmp_path, capsys):
    """3000 characters (under MAX_QUESTION_CHARS) that are 3000 of the tiny model's tokens (over MAX_QUESTION_TOKENS,
    2048): refused once the model is loaded, before any item runs, naming the JSONL line; before, the run stopped at
    that item, and every resume stopped there again."""
    samples = make_dataset(2, kinds=("text_vs_distractor",), size=224)
    samples[1].question = "\N{GRINNING FACE}" * 3000
    path = save_jsonl(samples, tmp_path / "set")
    out = tmp_path / "eval"
    assert evaluate.main([*FAST, "--dataset", str(tmp_path / "set"), "--out", str(out)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert errors == [f"error: {path}:2: the question is 3000 tokens long; the limit is 2048 tokens: shorten it"]
    assert not list(out.glob("*.jsonl"))  # not one item ran


@contextmanager
def one_thread():
    """Torch on one thread here, as each torchrun worker is (OMP_NUM_THREADS=1): the same arithmetic."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_torchrun_with_two_processes_equals_one_process(tmp_path):
    folder = write_parquet_set(tmp_path / "docvqa", "docvqa", 5)
    one, two = tmp_path / "one", tmp_path / "two"
    with one_thread():
        assert evaluate.main([*FAST, "--dataset", str(folder), "--out", str(one)]) == 0
    done = run_evaluate(*FAST, "--dataset", str(folder), "--out", str(two), processes=2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["item"] for r in results(two)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert without_timings(results(two)) == without_timings(results(one))
    assert json.loads((two / "report.json").read_text())["throughput"]["processes"] == 2


def test_a_dying_worker_stops_the_other_and_leaves_valid_partial_results(tmp_path):
    folder = write_parquet_set(tmp_path / "docvqa", "docvqa", 5, corrupt=(3,))  # item 3 is rank 1's
    out = tmp_path / "eval"
    done = run_evaluate(*FAST, "--dataset", str(folder), "--out", str(out), processes=2)
    assert done.returncode != 0
    assert "[rank 1] error: item 3 (id q3): cannot read its image" in done.stderr
    assert "[rank 0] stopping: another worker failed" in done.stderr
    kept = [json.loads(line) for part in out.glob("part-*.jsonl") for line in part.read_text().splitlines()]
    finished = {r["item"] for r in kept}  # each line whole; rank 0 may have been stopped before its last items
    assert 1 in finished and finished <= {0, 1, 2, 4}
    # fixed, the set resumes in one process and evaluates only the items not finished
    write_parquet_set(tmp_path / "docvqa", "docvqa", 5)
    assert evaluate.main([*FAST, "--dataset", str(folder), "--out", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["throughput"]["items"] == 5 - len(finished)
    assert [r["item"] for r in results(out)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_bench_reports_every_pipeline_and_engine_with_exact_decode_length(tmp_path):
    out = tmp_path / "bench.json"
    report = bench.main(["--model", "tiny", "--device", "cpu", "--new-tokens", "3", "--repeats", "1", "--sizes", "448,1000",
                         "--layer-repeats", "1", "--json", str(out)])
    assert report["device"] == "CPU" and report["layer"]["grid"] == [36, 36]  # native 1000 px: 36 cells of 28 px
    assert report["layer"]["layer_ms"] > 0 and report["layer"]["layer_eager_ms"] > 0
    assert set(report["sizes"]) == {448, 1000}
    big = report["sizes"][1000]
    assert set(big["pipelines"]) == {f"{p}/{e}" for p in PIPELINES for e in ("fast", "hf")} - {
        f"{p}/hf" for p in FAST_ENGINE_ONLY}  # FastV runs on the fast engine only
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


def test_a_hub_dataset_that_is_neither_here_nor_reachable_fails_at_once_naming_both(tmp_path, monkeypatch, capsys):
    """An id whose schema its name tells (so no parse-time refusal), not on disk, with no hub: one line, no retries."""
    import time

    import datasets
    import huggingface_hub

    from arr_coc import checkpoints

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # restored after go_offline sets them
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    monkeypatch.setattr(checkpoints, "hub_answers", lambda endpoint, timeout=checkpoints.HUB_TIMEOUT_S: False)
    start = time.perf_counter()
    assert evaluate.main([*FAST, "--dataset", "nowhere-xyz/chartqa", "--out", str(tmp_path / "eval")]) == 2
    assert time.perf_counter() - start < 20
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: cannot load the dataset 'nowhere-xyz/chartqa' (split 'validation'): no such file "
                            "or folder here, and as a hub dataset: the hub (") and "cannot be reached" in error


def test_a_line_cut_short_in_this_processs_part_is_trimmed_before_resuming(tmp_path, capsys):
    """The cut line in the part file the resumed process appends to: the first new result must not be glued to it."""
    folder = write_parquet_set(tmp_path / "chartqa", "chartqa", 3)
    out = tmp_path / "eval"
    command = [*FAST, "--dataset", str(folder), "--out", str(out)]
    assert evaluate.main(command) == 0
    first = results(out)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first[:4]))  # items 0 and 1
    (out / "part-0.jsonl").write_text('{"item": 2, "row": "ges')  # item 2 cut off mid-line, in rank 0's own part
    capsys.readouterr()
    assert evaluate.main(command) == 0
    resumed = results(out)
    assert [(r["item"], r["row"]) for r in resumed] == [(i, row) for i in range(3) for row in ("gestalt", "arr:topk")]
    assert without_timings(resumed[4:]) == without_timings(first[4:])
    assert "warning" not in capsys.readouterr().out and "Warning" not in (out / "report.md").read_text()


def test_trim_cuts_a_part_back_to_its_last_whole_line(tmp_path):
    from arr_coc.runtime.distributed import Process

    folder = evaluate.ResultsFolder(str(tmp_path), Process(0, 1, "cpu"))
    line = lambda item: json.dumps(record(item=item).to_json()) + "\n"  # noqa: E731
    folder.part.write_text(line(0) + '{"item": 1, "ro')
    folder.append([record(item=1)])
    assert folder.part.read_text() == line(0) + line(1)
    folder.part.write_text('{"item": 0, "r')  # no whole line at all
    folder.append([record(item=0)])
    assert folder.read() == [record(item=0)]
    folder.part.write_text('{"item": 0, "mode": "alone", "turn": 1}\n')  # a --conversation run's line: no result
    assert folder.read() == []


def test_rows_evaluated_on_different_items_are_flagged_loudly(tmp_path):
    records = [record(item=i, row=row, score=1.0, visual_tokens=10, ttft_ms=1.0, total_ms=2.0, gflops=1.0)
               for i in range(3) for row in ("full", "arr:topk") if (i, row) != (1, "arr:topk")]
    summary = report.summarise(records, ["full", "arr:topk"])
    assert report.uneven_items(records, list(summary)) == {"arr:topk": [1]}
    assert report.uneven_items([r for r in records if r.item != 1], list(summary)) == {}
    report.write_report(tmp_path, summary, dict(metric="contains"), records)
    assert (tmp_path / "report.md").read_text().startswith(
        "# ARR-COC evaluation\n\n**Warning: rows were evaluated on different items, so their means are not comparable: "
        "arr:topk lacks 1 of 3 (item 1).**")
    assert json.loads((tmp_path / "report.json").read_text())["uneven_items"] == {"arr:topk": [1]}


def test_a_lost_result_is_flagged_on_stdout(tmp_path, capsys, monkeypatch):
    """Should a row still lack an item at the end (here one result is thrown away as it is written), evaluate says
    so before the table."""
    append = evaluate.ResultsFolder.append
    monkeypatch.setattr(evaluate.ResultsFolder, "append",
                        lambda self, results: append(self, [r for r in results if (r.item, r.row) != (1, "gestalt")]))
    assert evaluate.main([*FAST, "--synthetic", "3", "--out", str(tmp_path / "eval")]) == 0
    printed = capsys.readouterr().out
    assert "warning: rows were evaluated on different items, so their means are not comparable: gestalt lacks 1 of 3 " \
           "(item 1); a budget over an image's grid is skipped (said above), any other gap is a lost result: rerun " \
           "the same command to fill it" in printed


def test_ctrl_c_stops_with_one_line_and_exit_130_and_the_same_command_resumes(tmp_path, capsys, monkeypatch):
    out = tmp_path / "eval"
    command = [*FAST, "--synthetic", "3", "--out", str(out)]
    evaluate_item = evaluate.evaluate_item

    def interrupted(model, source, item, *args):
        if item.index == 1:
            raise KeyboardInterrupt  # what Python's SIGINT handler raises, here while item 1 is evaluated
        return evaluate_item(model, source, item, *args)

    monkeypatch.setattr(evaluate, "evaluate_item", interrupted)
    try:
        code = evaluate.main(command)
    except KeyboardInterrupt:
        code = "KeyboardInterrupt escaped"
    assert code == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"stopped; rerun the same command to resume (finished items are kept in {out})"
    assert "Traceback" not in err
    assert [(r["item"], r["row"]) for r in map(json.loads, (out / "part-0.jsonl").read_text().splitlines())] == [
        (0, "gestalt"), (0, "arr:topk")]
    monkeypatch.setattr(evaluate, "evaluate_item", evaluate_item)
    assert evaluate.main(command) == 0
    assert json.loads((out / "report.json").read_text())["throughput"]["items"] == 2  # items 1 and 2
    assert [r["item"] for r in results(out)] == [0, 0, 1, 1, 2, 2]


def test_the_report_gives_each_rows_wilson_interval_and_the_suite_is_scored_by_exact_match():
    """Per row: items, accuracy and its 95% Wilson interval (Newcombe's 81/263 -> 0.2553-0.3662); fine-print pages
    alone are scored by exact match."""
    from arr_coc.eval import report, sets

    records = [record(row="full", item=i, score=float(i < 81)) for i in range(263)]
    means = report.summarise(records, ["full"])["full"]
    assert means["items"] == 263 and means["interval"] == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert "| full | 263 | 0.308 | [0.26, 0.37] |" in report.markdown_table(report.summarise(records, ["full"]), "exact")
    assert sets.synthetic_source(1, ("fine_print", "box_word"), seed=0).metric == "exact"
    assert sets.synthetic_source(1, ("fine_print", "text_vs_distractor"), seed=0).metric == "contains"


def test_the_report_sets_each_row_against_full_by_their_intervals():
    """Overlapping 95% intervals are a tie, never a difference: 8 of 10 for full is [0.49, 0.94]; 1 of 10
    ([0.02, 0.40]) is below it, 9 of 10 ([0.60, 0.98]) ties it; against 1 of 10 for full, 9 of 10 is above."""
    from arr_coc.eval import report

    def table(correct: dict[str, int]) -> str:
        records = [record(row=row, item=i, score=float(i < c)) for row, c in correct.items() for i in range(10)]
        return report.markdown_table(report.summarise(records, list(correct)), "exact")

    lines = table({"full": 8, "arr:topk": 1, "budget": 9}).splitlines()
    assert lines[0].endswith("| against `full` |")
    assert lines[2] == "| full | 10 | 0.800 | [0.49, 0.94] | - |"
    assert lines[3].startswith("| arr:topk | 10 | 0.100 | [0.02, 0.40] |") and lines[3].endswith("| below |")
    assert lines[4].startswith("| budget | 10 | 0.900 | [0.60, 0.98] |") and lines[4].endswith("| tie |")
    assert table({"full": 1, "arr:topk": 9}).splitlines()[3].endswith("| above |")
    assert "against" not in table({"gestalt": 1, "arr:topk": 9})  # no full row: nothing to set against


def test_a_conversation_asks_each_pages_questions_in_one_conversation_and_alone(tmp_path, capsys):
    """Pocket pages, two of their questions each: every row answers each question as a turn of one conversation
    and alone; turn 1 is the same request either way; the report gives exact match by turn with intervals."""
    out = tmp_path / "chat"
    assert evaluate.main(["--model", "pocket", "--conversation", "--synthetic", "2", "--kinds", "box_word,fine_print",
                          "--size", "448", "--turns", "2", "--baselines", "full,fastv", "--strategies", "topk",
                          "--budget", "32", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "note: fastv cannot hold a conversation: left out" in captured.err
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(results) == 2 * 2 * 2 * 2  # pages x rows x turns x modes
    assert {(r["row"], r["mode"], r["turn"]) for r in results} == {
        (row, mode, turn) for row in ("full", "arr:topk") for mode in ("conversation", "alone") for turn in (1, 2)}
    first = {(r["item"], r["row"], r["mode"]): r["prediction"] for r in results if r["turn"] == 1}
    assert all(first[(i, row, "conversation")] == first[(i, row, "alone")] for i, row, _ in first)
    later = {(r["item"], r["row"], r["mode"]): r["prefilled"] for r in results if r["turn"] == 2}
    assert all(later[(i, row, "conversation")] < later[(i, row, "alone")] for i, row, _ in later)
    report_md = (out / "report.md").read_text()
    assert "| all | arr:topk | conversation | " in report_md and "(n=2)" in report_md and "turn 2" in report_md
    assert json.loads((out / "report.json").read_text())["settings"]["conversation_turns"] == 2


@pytest.mark.parametrize("flags, message", [
    (["--kinds", "noise"], "--conversation: asks the pocket suite's synthetic pages (fine_print, box_word, "
                           "shape_colour), not --kinds noise"),
    (["--kinds", "box_word", "--budgets", "16,32"], "--budgets: not with --conversation"),
    (["--kinds", "box_word", "--ablations", "raster"], "--ablations: not with --conversation"),
    (["--kinds", "box_word", "--baselines", "fastv", "--strategies", ""], "no row can hold a conversation"),
])
def test_a_conversation_that_cannot_run_is_refused_at_parse_time(flags, message, capsys):
    with pytest.raises(SystemExit):
        evaluate.parse_args(["--model", "pocket", "--conversation", *flags])
    assert message in capsys.readouterr().err


def test_the_report_gives_each_kinds_accuracy_with_its_wilson_interval_and_items():
    """On a set of two kinds, per row and kind: exact match, its 95% Wilson interval and the scored items, in the
    summary (report.json's by_kind) and report.md's table (Newcombe's 81/263 -> [0.26, 0.37]; 9 of 10 -> [0.60,
    0.98]); a set of one kind: no table."""
    from arr_coc.eval import report

    records = [record(row="full", item=i, kind="fine_print", score=float(i < 81)) for i in range(263)]
    records += [record(row="full", item=263 + i, kind="box_word", score=float(i < 9)) for i in range(10)]
    records += [record(row="full", item=273, kind="box_word", score=None)]  # unscored: not among the items
    summary = report.summarise(records, ["full"])
    by_kind = summary["full"]["by_kind"]
    assert by_kind["fine_print"]["items"] == 263 and by_kind["box_word"]["items"] == 10
    assert by_kind["fine_print"]["interval"] == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert report.kind_table(summary, "exact").splitlines()[2:] == [
        "| row | fine_print | box_word |", "|---|---|---|",
        "| full | 0.31 [0.26, 0.37] (n=263) | 0.90 [0.60, 0.98] (n=10) |"]
    assert report.kind_table(report.summarise(records[:263], ["full"]), "exact") == ""


def test_the_report_reads_each_layout_family_apart():
    """Pages drawn by layout families: a column per kind and family, so sparse and dense pages are never pooled (a
    dense family's 1 of 4 beside a sparse one's 4 of 4)."""
    from arr_coc.eval import report

    records = [record(row="full", item=i, kind="box_word", score=float(i == 0)) for i in range(4)]
    records += [record(row="full", item=4 + i, kind="box_word", score=1.0) for i in range(4)]
    for r, family in zip(records, ["box_grid"] * 4 + ["slide"] * 4):
        r.family = family
    assert report.kind_table(report.summarise(records, ["full"]), "exact").splitlines()[2:] == [
        "| row | box_word (box_grid) | box_word (slide) |", "|---|---|---|",
        "| full | 0.25 [0.05, 0.70] (n=4) | 1.00 [0.51, 1.00] (n=4) |"]


def test_held_out_layouts_draw_the_pocket_pages_in_the_layouts_training_never_draws(capsys):
    """--held-out-layouts: pocket pages drawn as fineprint.make_page draws them in LAYOUTS (not SPEC's pages); any
    other kind or a dataset is refused at parse time."""
    from arr_coc.eval.sets import synthetic_source
    from arr_coc.synth.fineprint import LAYOUTS, make_page

    assert evaluate.parse_args(["--model", "pocket", "--kinds", "box_word", "--held-out-layouts"]).held_out_layouts
    source = synthetic_source(2, ("shape_colour",), seed=7, size=448, held_out_layouts=True)
    seeds = [7 * 1_000_003, 7 * 1_000_003 + 1]  # iter_dataset's scene seeds
    for item, seed in zip(source.items, seeds):
        assert item.image.tobytes() == make_page("shape_colour", seed, 448, style=LAYOUTS).image.tobytes()
        assert item.image.tobytes() != make_page("shape_colour", seed, 448).image.tobytes()
    for flags, named in ((["--kinds", "box_word,noise"], "--kinds noise"),
                         (["--dataset", "owner/name", "--schema", "docvqa"], "--dataset owner/name")):
        with pytest.raises(SystemExit):
            evaluate.parse_args(["--model", "pocket", "--held-out-layouts", *flags])
        assert ("--held-out-layouts: draws the pocket suite's synthetic pages (fine_print, box_word, shape_colour), "
                f"not {named}") in capsys.readouterr().err


def test_families_draw_the_pocket_pages_on_the_named_layout_families(capsys):
    """--families held-out: each pocket page drawn by a held-out layout family that carries its kind (slide and
    box_grid in turn by seed), at its family's aspect; other kinds, a dataset and unknown names refused at parse."""
    from arr_coc.eval.sets import synthetic_source
    from arr_coc.synth.families import make_family_page

    assert evaluate.parse_args(["--model", "pocket", "--kinds", "box_word", "--families", "held-out"]).families == (
        "slide", "box_grid")
    source = synthetic_source(2, ("box_word",), seed=7, size=448, families=("slide", "box_grid"))
    seeds = [7 * 1_000_003, 7 * 1_000_003 + 1]  # iter_dataset's scene seeds (odd -> box_grid, even -> slide)
    for item, seed, family, size in zip(source.items, seeds, ("box_grid", "slide"), ((476, 420), (588, 336))):
        assert item.image.size == size
        assert item.image.tobytes() == make_family_page(family, "box_word", seed, *size).image.tobytes()
    for flags, named in ((["--kinds", "box_word,noise"], "not --kinds noise"),
                         (["--dataset", "owner/name", "--schema", "docvqa"], "not --dataset owner/name"),
                         (["--families", "slides"], "unknown layout family slides")):
        with pytest.raises(SystemExit):
            evaluate.parse_args(["--model", "pocket", "--families", "held-out", *flags])
        assert named in capsys.readouterr().err


def test_the_progress_bar_knows_how_many_items_remain():
    """evaluate's bar has its total (it said '13item [21:49, ...]'): this process's items still lacking a job on a list
    of items; unknown (None) for a streamed dataset."""
    from types import SimpleNamespace

    items = [SimpleNamespace(index=i) for i in range(5)]
    jobs = [("full", None)]
    one = SimpleNamespace(world_size=1, rank=0)
    assert evaluate.pending_total(items, {(1, "full", None), (3, "full", None)}, jobs, one) == 3
    assert evaluate.pending_total(items, set(), jobs, SimpleNamespace(world_size=2, rank=1)) == 2  # items 1 and 3
    assert evaluate.pending_total(iter(items), set(), jobs, one) is None
