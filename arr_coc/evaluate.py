"""
Compare the pipelines on a dataset: answer accuracy, saccades on the target box, tokens and latency.

Rows are the stock baselines (full, gestalt, budget) and ARR-COC under each allocation strategy
(arr:topk, arr:logpolar, arr:grid, arr:random): the design's critical experiment at a fixed budget.

    python -m arr_coc.evaluate --model tiny --synthetic 16 --json out/eval.json
    python -m arr_coc.evaluate --model Qwen/Qwen2-VL-2B-Instruct --data data/mine --checkpoint checkpoints/mine
"""

from __future__ import annotations  # type hints name the model without importing torch

import argparse
import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from arr_coc import cli
from arr_coc.config import BASELINES, DEFAULT_MODEL, STRATEGIES
from arr_coc.data import SCENE_KINDS, Sample, load_jsonl, make_dataset
from arr_coc.metrics import box_recall_precision, is_correct

if TYPE_CHECKING:
    from arr_coc.model import ARRCOCQwen


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help='Qwen-VL hub id or folder, or an offline tiny model ("tiny", "tiny-qwen2.5-vl", "tiny-qwen3-vl")')
    p.add_argument("--checkpoint", default=None,
                   help="ARR checkpoint: a name under checkpoints/, a folder, a hub repo id, or 'prior' for the "
                        "untrained layer (default: the first checkpoint under checkpoints/ made for the model, "
                        "else the prior; the app's rule)")
    p.add_argument("--data", default=None, help="JSONL dataset folder (arr_coc.data format)")
    p.add_argument("--synthetic", type=cli.bounded_int(1, 100_000), default=16,
                   help="without --data: this many synthetic scenes")
    p.add_argument("--kinds", type=cli.comma_list(SCENE_KINDS), default=",".join(SCENE_KINDS),
                   help="synthetic scene kinds, comma-separated")
    p.add_argument("--seed", type=int, default=1234, help="seed of the synthetic scenes")
    p.add_argument("--baselines", type=cli.comma_list(BASELINES, allow_empty=True), default=",".join(BASELINES),
                   help="stock baselines to run, comma-separated (\"\" for none)")
    p.add_argument("--strategies", type=cli.comma_list(STRATEGIES, allow_empty=True), default=",".join(STRATEGIES),
                   help="ARR strategies to run, comma-separated (\"\" for none)")
    p.add_argument("--budget", type=cli.bounded_int(1, cli.MAX_CELLS), default=273, help="saccades per image")
    p.add_argument("--max-new-tokens", type=cli.bounded_int(*cli.MAX_NEW_TOKENS), default=16,
                   help="answer length limit")
    cli.add_max_cells(p)
    p.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    p.add_argument("--json", default=None, help="write the per-row summary and per-sample results here")
    args = p.parse_args(argv)
    if not args.baselines and not args.strategies:
        p.error("argument --baselines: empty, and so is --strategies: nothing to evaluate")
    if args.budget > args.max_cells:
        p.error(f"argument --budget: {args.budget} exceeds --max-cells {args.max_cells}")
    return args


def evaluate(model: ARRCOCQwen, samples: list[Sample], rows: list[str], budget: int, max_new_tokens: int,
             max_cells: int = 4096) -> dict:
    """rows like "full" or "arr:logpolar" -> per-row means and per-sample records."""
    from tqdm.auto import tqdm

    records = []
    bar = tqdm(total=len(samples) * len(rows), desc="evaluate", unit="answer")
    for i, sample in enumerate(samples):
        for row in rows:
            pipeline, _, strategy = row.partition(":")
            a = cli.answer(model, sample.image, sample.question, pipeline, max_new_tokens=max_new_tokens,
                           strategy=strategy or None, budget=budget, max_cells=max_cells)
            bar.update()
            record = dict(sample=i, kind=sample.kind, row=row, answer=a.text, correct=is_correct(a.text, sample.answer),
                          visual_tokens=a.tokens["total_visual"], total_ms=a.timings_ms["total"])
            if a.arr is not None and sample.box is not None:
                recall, precision = box_recall_precision(a.views.box_coverage(sample.box), a.arr.indices[0])
                record.update(box_recall=recall, box_precision=precision, fallback=a.arr.fallback[0])
            records.append(record)
    bar.close()
    summary = {}
    for row in rows:
        mine = [r for r in records if r["row"] == row]
        summary[row] = {key: statistics.mean(float(r[key]) for r in mine if key in r)
                        for key in ("correct", "box_recall", "box_precision", "visual_tokens", "total_ms")
                        if any(key in r for r in mine)}
    return dict(summary=summary, records=records)


def format_table(summary: dict) -> str:
    columns = (("correct", "{:.2f}"), ("box_recall", "{:.2f}"), ("box_precision", "{:.2f}"),
               ("visual_tokens", "{:.0f}"), ("total_ms", "{:.0f}"))
    lines = ["| row | accuracy | box recall | box precision | visual tokens | total ms |", "|---|---|---|---|---|---|"]
    for row, m in summary.items():
        cells = [fmt.format(m[key]) if key in m else "-" for key, fmt in columns]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch  # after parsing: --help and bad flags answer without loading it

    samples = load_jsonl(args.data) if args.data else make_dataset(args.synthetic, cli.names(args.kinds), seed=args.seed)
    model, checkpoint = cli.load_model(args.model, args.checkpoint, args.device)
    rows = cli.names(args.baselines) + [f"arr:{s}" for s in cli.names(args.strategies)]
    with torch.no_grad():
        result = evaluate(model, samples, rows, args.budget, args.max_new_tokens, args.max_cells)
    result.update(model=model.vlm.name, checkpoint=checkpoint, versions=cli.versions())
    print(f"{len(samples)} samples, model {model.vlm.name}, checkpoint {checkpoint}")
    print(format_table(result["summary"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
