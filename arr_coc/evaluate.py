"""
Compare the pipelines on a dataset: answer accuracy, saccades on the target box, tokens and latency.

Rows are the stock baselines (full, gestalt, budget) and ARR-COC under each allocation strategy
(arr:topk, arr:logpolar, arr:grid, arr:random): the design's critical experiment at a fixed budget.

    python -m arr_coc.evaluate --model tiny --synthetic 16 --json out/eval.json
    python -m arr_coc.evaluate --model Qwen/Qwen2-VL-2B-Instruct --data data/mine --checkpoint checkpoints/mine
"""

import argparse
import json
import re
import statistics
from pathlib import Path

import torch

from arr_coc.config import STRATEGIES
from arr_coc.data import SCENE_KINDS, Sample, load_jsonl, make_dataset
from arr_coc.model import BASELINES, ARRCOCQwen
from arr_coc.qwen import DEFAULT_MODEL


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help='hub id, folder or "tiny"')
    p.add_argument("--checkpoint", default=None, help="ARR checkpoint folder (default: the untrained prior)")
    p.add_argument("--data", default=None, help="JSONL dataset folder (arr_coc.data format)")
    p.add_argument("--synthetic", type=int, default=16, help="without --data: this many synthetic scenes")
    p.add_argument("--kinds", default=",".join(SCENE_KINDS), help="synthetic scene kinds, comma-separated")
    p.add_argument("--seed", type=int, default=1234, help="seed of the synthetic scenes")
    p.add_argument("--baselines", default=",".join(BASELINES), help="stock baselines to run, comma-separated")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="ARR strategies to run, comma-separated")
    p.add_argument("--budget", type=int, default=273, help="saccades per image")
    p.add_argument("--max-new-tokens", type=int, default=16, help="answer length limit")
    p.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    p.add_argument("--json", default=None, help="write the per-row summary and per-sample results here")
    return p.parse_args(argv)


def normalise(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def is_correct(prediction: str, expected: str) -> bool:
    """The expected answer appears in the prediction, ignoring case and punctuation."""
    return bool(normalise(expected)) and f" {normalise(expected)} " in f" {normalise(prediction)} "


def box_recall_precision(coverage: torch.Tensor, indices: torch.Tensor) -> tuple[float, float]:
    """Share of the box's cells that got a saccade, and share of the saccades on the box (coverage [GH, GW], indices [K])."""
    target = coverage.flatten() > 0  # [N] cells the box touches
    hits = int(target[indices.to(target.device)].sum())
    return hits / max(int(target.sum()), 1), hits / max(indices.numel(), 1)


def evaluate(model: ARRCOCQwen, samples: list[Sample], rows: list[str], budget: int, max_new_tokens: int) -> dict:
    """rows like "full" or "arr:logpolar" -> per-row means and per-sample records."""
    records = []
    for i, sample in enumerate(samples):
        for row in rows:
            pipeline, _, strategy = row.partition(":")
            a = model.answer(sample.image, sample.question, pipeline, max_new_tokens=max_new_tokens,
                             strategy=strategy or None, budget=budget)
            record = dict(sample=i, kind=sample.kind, row=row, answer=a.text, correct=is_correct(a.text, sample.answer),
                          visual_tokens=a.tokens["total_visual"], total_ms=a.timings_ms["total"])
            if a.arr is not None and sample.box is not None:
                recall, precision = box_recall_precision(a.views.box_coverage(sample.box), a.arr.indices[0])
                record.update(box_recall=recall, box_precision=precision, fallback=a.arr.fallback[0])
            records.append(record)
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
    samples = load_jsonl(args.data) if args.data else make_dataset(args.synthetic, args.kinds.split(","), seed=args.seed)
    model = ARRCOCQwen.from_pretrained(args.model, checkpoint=args.checkpoint, device=args.device)
    rows = [b for b in args.baselines.split(",") if b] + [f"arr:{s}" for s in args.strategies.split(",") if s]
    with torch.no_grad():
        result = evaluate(model, samples, rows, args.budget, args.max_new_tokens)
    print(f"{len(samples)} samples, model {model.vlm.name}, checkpoint {args.checkpoint or 'prior (untrained)'}")
    print(format_table(result["summary"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
