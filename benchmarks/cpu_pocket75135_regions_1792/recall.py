"""
Box recall of ARR's strategies on held-out pages, without generating answers (one prior pass and one scoring per
page, then each strategy re-selects from the same maps): a cheap CPU look at where each strategy puts the budget.
Pocket model, the default layer (the untrained prior). Resumable: finished pages are kept in the JSONL and skipped.

    PYTHONPATH=. nice .venv/bin/python benchmarks/cpu_pocket75135_regions_1792/recall.py --pages 24 --size 1792 \
        --out benchmarks/cpu_pocket75135_regions_1792/recall.jsonl
    .venv/bin/python benchmarks/cpu_pocket75135_regions_1792/recall.py --report \
        --out benchmarks/cpu_pocket75135_regions_1792/recall.jsonl       # the table: mean recall, whole boxes
"""

import argparse
import json
from pathlib import Path

from arr_coc.eval.metrics import box_recall_precision
from arr_coc.intervals import bootstrap_mean, interval_text
from arr_coc.eval.sets import synthetic_source
from arr_coc.model import ARRCOCQwen
from arr_coc.pipelines.arr import prepare
from arr_coc.pipelines.request import Request

STRATEGIES = ("topk", "regions", "regions_ink")  # the rows compared
BUDGETS = (64, 273)  # saccades


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--pages", type=int, default=24, help="pages a kind and family")
    p.add_argument("--size", type=int, default=1792, help="page side in px")
    p.add_argument("--seed", type=int, default=5678, help="the pages' seed")
    p.add_argument("--out", type=Path, required=True, help="JSONL: one line per page, strategy and budget")
    p.add_argument("--report", action="store_true", help="print the table of --out's lines and stop")
    args = p.parse_args()
    if args.report:
        return print(report([json.loads(line) for line in args.out.open()]))
    done = {(r["family"], r["item"]) for r in map(json.loads, args.out.open())} if args.out.exists() else set()
    model = ARRCOCQwen.from_pretrained("pocket", device="cpu")
    sources = {family: synthetic_source(2 * args.pages, ("fine_print", "box_word"), args.seed, args.size,
                                        families=(family,)) for family in ("slide", "box_grid")}
    with args.out.open("a") as out:
        for pair in zip(*(s.items for s in sources.values())):  # the families interleaved: a partial run has both
            for family, item in zip(sources, pair):
                if (family, item.index) in done or item.box is None:
                    continue
                views = model.views(item.open())
                scene = prepare(model.parts, views, sources[family].prompt(item), Request())
                coverage = views.box_coverage(item.box)
                for strategy in STRATEGIES:
                    for budget in BUDGETS:
                        sel = scene.select(model.parts.layer, budget, strategy)
                        recall, _ = box_recall_precision(coverage, sel.indices[0])
                        out.write(json.dumps(dict(family=family, item=item.index, kind=item.kind, strategy=strategy,
                                                  budget=budget, recall=recall)) + "\n")
                out.flush()

def report(lines: list[dict]) -> str:
    """Markdown: per family, kind, budget and strategy, the mean box recall (bootstrap interval), then the pages whose box was read whole
    (recall 1) with its 95% Wilson interval, and n."""
    rows = ["| family | kind | saccades | strategy | n | mean box recall [95% bootstrap] | box read whole [95% Wilson] |",
            "|---|---|---|---|---|---|---|"]
    for family in ("slide", "box_grid"):
        for kind in ("box_word", "fine_print"):
            for budget in BUDGETS:
                for strategy in STRATEGIES:
                    got = [r["recall"] for r in lines if (r["family"], r["kind"], r["budget"], r["strategy"]) ==
                           (family, kind, budget, strategy)]
                    if got:
                        whole, (low, high) = sum(r == 1.0 for r in got), bootstrap_mean(got)
                        rows.append(f"| {family} | {kind} | {budget} | {strategy} | {len(got)} | "
                                    f"{sum(got) / len(got):.2f} [{low:.2f}, {high:.2f}] | {interval_text(whole, len(got))} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
