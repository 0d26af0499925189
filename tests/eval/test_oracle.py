"""
evaluate's oracle row (ARR with the asked box's cells forced into its budget) and the rows every sweep runs by
default (random, the plain downsample `budget`), on the pocket model at 640² and at parse time. Run:

    nice .venv/bin/python -m pytest -q tests/eval/test_oracle.py
"""

import json

from arr_coc import evaluate
from arr_coc.eval import report
from arr_coc.eval.records import EvalRecord


def test_every_sweep_runs_random_budget_and_the_oracle_at_each_budget_by_default(tmp_path):
    """The default rows, as the flags leave them: the plain downsample and ARR's random strategy beside the
    reducers, the oracle after ARR's strategies; in a sweep each of them at every budget (full, gestalt and
    PixelPrune, which read no budget, once)."""
    out = ["--out", str(tmp_path / "eval")]  # parsed, never written
    args = evaluate.parse_args(["--model", "pocket", "--budgets", "16,64", *out])
    assert evaluate.row_names(args) == ["full", "gestalt", "budget", "divprune", "visionzip", "fastv", "pixelprune",
                                        "pixelprune_n", "arr:topk", "arr:logpolar", "arr:grid", "arr:random", "arr:regions",
                                        "arr:regions_ink", "oracle"]
    assert evaluate.job_list(args) == [
        ("full", None), ("gestalt", None), ("pixelprune", None),
        ("budget", 16), ("divprune", 16), ("visionzip", 16), ("fastv", 16), ("pixelprune_n", 16), ("arr:topk", 16),
        ("arr:logpolar", 16), ("arr:grid", 16), ("arr:random", 16), ("arr:regions", 16),
        ("arr:regions_ink", 16), ("oracle", 16),
        ("budget", 64), ("divprune", 64), ("visionzip", 64), ("fastv", 64), ("pixelprune_n", 64), ("arr:topk", 64),
        ("arr:logpolar", 64), ("arr:grid", 64), ("arr:random", 64), ("arr:regions", 64),
        ("arr:regions_ink", 64), ("oracle", 64)]
    assert "oracle" not in evaluate.row_names(evaluate.parse_args(["--model", "pocket", "--no-oracle", *out]))
    assert evaluate.row_names(evaluate.parse_args(["--model", "pocket", "--strategies", "", *out])) == [
        "full", "gestalt", "budget", "divprune", "visionzip", "fastv", "pixelprune", "pixelprune_n"]  # no ARR row


def test_the_oracle_reads_the_whole_box_where_it_fits_and_skips_items_without_one(tmp_path, capsys):
    """The pocket model on a box_word page (its asked box touches 16 of the 32 x 32 candidate cells of 20 px at 640²;
    its 23 x 23 native cells are more than ARR reads, 256 + 64, so it chooses: at 448² it would read the 16 x 16
    whole, as full does) and a noise page (no box): at 64 saccades the oracle's box recall is 1 and a quarter of its
    cells are the box's; at 2 the box is larger than the budget, so its 2 cells are both the box's (precision 1,
    recall 2 / 16) and the record says
    so; random and budget run beside it at both budgets; the noise page is skipped for the oracle alone, said on
    stderr and in report.md, and no row is flagged as uneven."""
    out = tmp_path / "oracle"
    assert evaluate.main(["--model", "pocket", "--synthetic", "2", "--kinds", "box_word,noise", "--size", "640",
                          "--baselines", "budget", "--strategies", "random", "--budgets", "2,64",
                          "--max-new-tokens", "3", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "skipped oracle at budget 2 on 1 item(s): the item has no asked box to force in" in err
    assert "skipped oracle at budget 64 on 1 item(s): the item has no asked box to force in" in err
    records = [EvalRecord.from_json(json.loads(line)) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r.item, r.kind, r.row, r.budget) for r in records] == [
        (0, "box_word", "budget", 2), (0, "box_word", "arr:random", 2), (0, "box_word", "oracle", 2),
        (0, "box_word", "budget", 64), (0, "box_word", "arr:random", 64), (0, "box_word", "oracle", 64),
        (1, "noise", "budget", 2), (1, "noise", "arr:random", 2),
        (1, "noise", "budget", 64), (1, "noise", "arr:random", 64)]
    oracle = {r.budget: r for r in records if r.row == "oracle"}
    assert (oracle[64].box_recall, oracle[64].box_precision, oracle[64].box_clipped) == (1.0, 0.25, False)
    assert (oracle[2].box_recall, oracle[2].box_precision, oracle[2].box_clipped) == (2 / 16, 1.0, True)
    assert oracle[64].visual_tokens == 256 + 64 and oracle[2].visual_tokens == 256 + 2  # ARR's tokens: gestalt + K
    assert all(r.box_clipped is None for r in records if r.row != "oracle")
    summary = json.loads((out / "report.json").read_text())["summary"]
    assert summary["oracle@64"]["box_recall"] == 1.0 and summary["oracle@64"]["items"] == 1
    assert {"budget@2", "arr:random@2", "budget@64", "arr:random@64"} <= set(summary)
    markdown = (out / "report.md").read_text()
    assert "Warning" not in markdown and json.loads((out / "report.json").read_text())["uneven_items"] == {}
    assert ("oracle: the asked box's cells forced into ARR's budget, on the 1 of 2 items with a box (1 without one "
            "skipped); 1 of its 2 results had a box larger than the budget (only its most relevant cells forced in)"
            in markdown)
    assert "| oracle@2 | 1.00 [0.21, 1.00] (n=1) | - |" in markdown  # its kind table: the box_word page alone


def test_the_oracle_lacking_an_item_with_a_box_is_still_flagged():
    """The oracle is held to the items with a box only: missing one of those is a lost result like any other."""
    def rec(item, row, box):
        return EvalRecord(item=item, id=str(item), kind="box_word", row=row, prediction="", answers=[], score=None,
                          visual_tokens=0, gflops=0.0, ttft_ms=0.0, total_ms=0.0, confidence=None,
                          box_recall=1.0 if box else None)

    boxed = {0: True, 1: False, 2: True}
    records = [rec(i, "arr:topk", box) for i, box in boxed.items()] + [rec(0, "oracle", True)]
    assert report.uneven_items(records, ["arr:topk", "oracle"]) == {"oracle": [2]}
    assert report.uneven_items(records + [rec(2, "oracle", True)], ["arr:topk", "oracle"]) == {}
