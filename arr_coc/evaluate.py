"""
Compare the pipelines on a dataset: the set's accuracy metric, visual tokens, TTFT, total time and GFLOPs per
row, box recall where items have target boxes, and (with --faithfulness) whether ARR's answers depend on
its saccades.

Rows are the baselines (the stock views full, gestalt, budget; the published token reducers divprune, visionzip
and fastv at ARR's visual-token count), ARR-COC under each allocation strategy (arr:topk, arr:logpolar, arr:grid,
arr:random) and, with --ablations, ARR with one part switched off under topk (arr-information:topk, ...,
arr-no-gestalt:topk; arr_coc.relevance.ablation), all on the same items and the same visual tokens: the design's
critical experiment at a fixed budget. Three more --ablations switch one tension on, with a fixed value, against
arr:topk where each is at its prior: arr-explore:topk (e = 0.25), arr-diversify:topk (lambda = 2) and
arr-auto-budget:topk (the adaptive budget). Every ARR row records its tensions per item in results.jsonl (explore,
diversify, particularize, budget K, auto_budget, structure); report.md adds the mean visual tokens and accuracy
per scene kind. --budget auto puts every ARR row on the adaptive budget (the reducers keep as many tokens).

    python -m arr_coc.evaluate --model tiny --synthetic 16 --out runs/eval-synthetic
    python -m arr_coc.evaluate --dataset lmms-lab/DocVQA --config DocVQA --split validation --limit 500 --out runs/docvqa
    python -m arr_coc.evaluate --dataset data/chartqa --schema chartqa --limit 100 --faithfulness --out runs/chartqa
    python -m arr_coc.evaluate --model tiny --checkpoint tiny-text-vs-distractor --baselines "" --strategies topk \
        --ablations all --out runs/eval-ablations
    torchrun --nproc-per-node 2 -m arr_coc.evaluate --dataset lmms-lab/textvqa --limit 1000 --out runs/textvqa

--out holds run.json (the settings, with the prompt every item is asked and where it comes from), results.jsonl
(one line per item and row, in order; an item without reference answers has score null), report.md,
report.json and the plots (arr_coc.eval.report). While running, each process appends its finished items to
part-RANK.jsonl; run the same command again to resume: finished items are skipped. A different command
(every flag counts but --device) is refused, naming what differs. Under torchrun the items are shared out
by index and the merged results equal a one-process run, item for item.

Exit codes: 0 on success; 2 on bad input (a bad flag, a model or dataset that cannot be loaded, a dataset
without the schema's columns, an unreadable image, an --out made with other settings), with one line on
stderr; the results written so far are kept. A --dataset path that does not exist, an unusable --device and
an --out that is a file are refused before anything loads; --out is made only once there is something to write.
"""

from __future__ import annotations  # type hints name the model without importing torch

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from arr_coc import cli, pipelines
from arr_coc.config import BASELINES, DEFAULT_BUDGET, DEFAULT_MODEL, STRATEGIES
from arr_coc.errors import InputError, OutOfMemory
from arr_coc.eval.data import SCENE_KINDS
from arr_coc.eval.metrics import LENIENT, METRICS
from arr_coc.eval.sets import SCHEMAS, Item, Source, open_source, synthetic_source
from arr_coc.relevance import ablation as ablations
from arr_coc.relevance.config import AUTO

if TYPE_CHECKING:
    from arr_coc.distributed import Process
    from arr_coc.model import ARRCOCQwen

ABLATION_STRATEGY = "topk"  # the strategy of the ablation rows: ARR's default row, the one they are compared with
TIMING_FIELDS = ("ttft_ms", "total_ms")  # the only fields of a result that differ between two identical runs


def dataset(text: str) -> str:
    """An argparse type: a local file or folder that exists, or a hub id (name or owner/name, fetched on load)."""
    path = Path(text)
    looks_local = (text.startswith(("/", ".", "~")) or text.count("/") > 1 or path.suffix in (".parquet", ".jsonl")
                   or (path.parent != Path(".") and path.parent.is_dir()))  # data/chartqa: under a local folder
    if looks_local and not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist; a hub dataset id looks like owner/name")
    return text


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help='Qwen-VL hub id or folder, or an offline tiny model ("tiny", "tiny-qwen2.5-vl", "tiny-qwen3-vl")')
    p.add_argument("--checkpoint", default=None,
                   help="ARR checkpoint: a name under checkpoints/, a folder, a hub repo id, or 'prior' for the "
                        "untrained layer (default: the first checkpoint under checkpoints/ made for the model, "
                        "else the prior; the app's rule)")
    p.add_argument("--dataset", type=dataset, default=None,
                   help="a hub dataset id, a folder of parquet files, a parquet file, or a folder with data.jsonl "
                        "(default: --synthetic scenes)")
    p.add_argument("--split", default="validation", help="the dataset's split")
    p.add_argument("--config", default=None, help="the hub dataset's configuration name (e.g. DocVQA)")
    p.add_argument("--schema", choices=SCHEMAS, default=None,
                   help="the dataset's columns and metric (default: told by the dataset's id or folder name)")
    p.add_argument("--metric", choices=METRICS, default=None, help="score answers by this (default: the schema's)")
    p.add_argument("--limit", type=cli.bounded_int(1, 10**9), default=None, help="evaluate the first N items only")
    p.add_argument("--synthetic", type=cli.bounded_int(1, 100_000), default=16,
                   help="without --dataset: this many synthetic scenes")
    p.add_argument("--kinds", type=cli.comma_list(SCENE_KINDS), default=",".join(SCENE_KINDS[:5]),
                   help=f"synthetic scene kinds, comma-separated, of {','.join(SCENE_KINDS)} (fine_print, box_word "
                        "and shape_colour are the pocket model's suite)")
    p.add_argument("--size", type=cli.bounded_int(64, 8192), default=896, help="synthetic scene side in px")
    p.add_argument("--seed", type=int, default=1234, help="seed of the synthetic scenes and the random removal order")
    p.add_argument("--baselines", type=cli.comma_list(BASELINES, allow_empty=True), default=",".join(BASELINES),
                   help=f"baselines to run, comma-separated (\"\" for none): {pipelines.describe(BASELINES)}")
    p.add_argument("--strategies", type=cli.comma_list(STRATEGIES, allow_empty=True), default=",".join(STRATEGIES),
                   help="ARR strategies to run, comma-separated (\"\" for none)")
    p.add_argument("--ablations", type=cli.ablation_list, default="",
                   help=f"ARR ablations to run under {ABLATION_STRATEGY}, comma-separated, or \"all\" (default none): "
                        + ablations.describe())
    cli.add_budget(p, DEFAULT_BUDGET)
    p.add_argument("--max-new-tokens", type=cli.bounded_int(*cli.MAX_NEW_TOKENS), default=None,
                   help="answer length limit (default: the schema's, lmms-eval's for Qwen2-VL: docvqa 32, textvqa 128, "
                        "chartqa 16; 16 for JSONL sets and synthetic scenes)")
    cli.add_max_cells(p)
    cli.add_fastv_layer(p)
    p.add_argument("--faithfulness", action="store_true",
                   help="for every ARR strategy row (not the ablations), also measure the deletion / random / "
                        "insertion curves of the reference answer (3 x (steps + 1) teacher-forced forwards per item)")
    p.add_argument("--faithfulness-steps", type=cli.bounded_int(1, 100), default=10,
                   help="points per faithfulness curve, minus one")
    p.add_argument("--device", type=cli.device, default=None,
                   help="cpu, cuda or cuda:N (default: cuda when available; cuda:LOCAL_RANK under torchrun)")
    p.add_argument("--out", type=cli.output_folder, default=None,
                   help="results folder (default: a fresh runs/eval-YYYYmmdd-HHMMSS); an existing one is resumed")
    args = p.parse_args(argv)
    if not args.baselines and not args.strategies and not args.ablations:
        p.error("argument --baselines: empty, and so are --strategies and --ablations: nothing to evaluate")
    cli.check_budget(p, args, args.max_cells)
    if args.faithfulness and not args.strategies:
        p.error("argument --faithfulness: needs an ARR row (--strategies)")
    args.out = args.out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}"
    return args


# ----------------------------------------------------------------------------- one item


def evaluate_item(model: ARRCOCQwen, source: Source, item: Item, rows: list[str], metric: str,
                  args: argparse.Namespace) -> list[dict]:
    """Every row's answer to one item, scored: one result dict per row. An item without reference answers (a test
    split) is answered with score None and no faithfulness curves; a benchmark metric also gets the lenient one
    as an extra field."""
    from arr_coc.eval.faithfulness import faithfulness_curves
    from arr_coc.eval.metrics import box_recall_precision
    from arr_coc.pipelines.answer import tension_record

    image, question = item.open(), source.prompt(item)
    results = []
    for row in rows:
        pipeline, _, strategy = row.partition(":")
        pipeline, _, ablation = pipeline.partition("-")  # "arr-no-gestalt" -> arr under the no-gestalt ablation
        a = cli.answer(model, image, question, pipeline, max_new_tokens=args.max_new_tokens,
                       strategy=strategy or None, budget=args.budget, max_cells=args.max_cells,
                       ablation=ablation or None, fastv_layer=args.fastv_layer, tensions=cli.budget_settings(args))
        result = dict(item=item.index, id=item.id, kind=item.kind, row=row, prediction=a.text, answers=item.answers,
                      score=METRICS[metric](a.text, item.answers) if item.answers else None,
                      visual_tokens=a.tokens["total_visual"], gflops=round(sum(a.gflops.values()), 1),
                      ttft_ms=round(a.ttft_ms, 2), total_ms=round(a.timings_ms["total"], 2))
        if metric != LENIENT and item.answers:
            result[LENIENT] = METRICS[LENIENT](a.text, item.answers)
        if a.arr is not None:  # ARR's tensions on this item: e, λ, K (and f under the adaptive budget)
            result.update(tension_record(a.arr))
        if a.arr is not None and item.box is not None:
            recall, precision = box_recall_precision(a.views.box_coverage(item.box), a.arr.indices[0])
            result.update(box_recall=recall, box_precision=precision, fallback=a.arr.fallback[0])
        if a.arr is not None and not ablation and args.faithfulness and item.answers:  # after the first reference
            curves = faithfulness_curves(model, a.observation, a.arr, item.answers[0], args.faithfulness_steps, args.seed)
            result["faithfulness"] = curves.to_json()
        results.append(result)
    return results


# ----------------------------------------------------------------------------- the results folder


def row_names(args: argparse.Namespace) -> list[str]:
    """The rows to evaluate: the stock baselines, ARR under each strategy ("arr:topk", ...), then each ablation
    ("arr-raster:topk", ...)."""
    return (cli.names(args.baselines) + [f"arr:{s}" for s in cli.names(args.strategies)]
            + [f"arr-{a}:{ABLATION_STRATEGY}" for a in cli.names(args.ablations)])


def run_settings(args: argparse.Namespace, source: Source, metric: str, checkpoint: str) -> dict:
    """
    Everything that decides the results in --out: every flag but --device and --out (where the run happens),
    with the dataset's schema, the metric and the checkpoint as resolved. Resuming under other settings is
    refused, naming the ones that differ.
    """
    synthetic = not args.dataset
    return dict(dataset=source.name, split=None if synthetic else args.split, config=args.config,
                schema=source.schema, metric=metric, limit=args.limit, synthetic=args.synthetic if synthetic else None,
                synthetic_kinds=args.kinds if synthetic else None, size=args.size if synthetic else None,
                seed=args.seed, model=args.model,
                checkpoint=checkpoint, rows=row_names(args), prompt=source.prompt_template,
                prompt_reference=SCHEMAS[source.schema].reference, budget=args.budget,
                **adaptive_bounds(args),
                max_new_tokens=args.max_new_tokens,
                max_cells=args.max_cells, fastv_layer=args.fastv_layer,
                faithfulness_steps=args.faithfulness_steps if args.faithfulness else None)


def adaptive_bounds(args: argparse.Namespace) -> dict:
    """--min-budget and --max-budget, where a row uses them (--budget auto or the arr-auto-budget row); else
    nothing, so that a folder from before the adaptive budget resumes."""
    used = args.budget == AUTO or "auto-budget" in cli.names(args.ablations)
    return dict(min_budget=args.min_budget, max_budget=args.max_budget) if used else {}


class ResultsFolder:
    """--out: the settings, each process's appended results, and the merged results.jsonl."""

    def __init__(self, folder: str, process: Process):
        self.folder, self.process = Path(folder), process  # made when the first thing is written, not before
        self.part = self.folder / f"part-{process.rank}.jsonl"

    def check_settings(self, settings: dict) -> None:
        """Rank 0 records the settings; resuming under others would mix two runs' results, so it is refused."""
        path = self.folder / "run.json"
        if path.is_file():
            before = json.loads(path.read_text())
            changed = [f"{k}: {before.get(k)!r} there, {settings.get(k)!r} now"
                       for k in dict.fromkeys([*before, *settings]) if before.get(k) != settings.get(k)]
            if changed:
                raise InputError(f"{self.folder} holds the results of another run ({'; '.join(changed)}); "
                                 "choose another --out")
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings, indent=2))

    def read(self) -> list[dict]:
        """Every finished result on disk: results.jsonl and all parts (a line cut short by a crash is dropped)."""
        results = []
        for path in [self.folder / "results.jsonl", *sorted(self.folder.glob("part-*.jsonl"))]:
            if path.is_file():
                for line in path.read_text().splitlines():
                    try:
                        results.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
        return results

    def append(self, results: list[dict]) -> None:
        """One item's results, whole lines, flushed: an interruption loses at most the item being evaluated."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.part.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in results))

    def merge(self, rows: list[str]) -> list[dict]:
        """Rank 0, after every process is done: all results, one per (item, row), in order -> results.jsonl."""
        unique = {(r["item"], r["row"]): r for r in self.read() if r["row"] in rows}
        merged = [unique[key] for key in sorted(unique, key=lambda key: (key[0], rows.index(key[1])))]
        tmp = self.folder / "results.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in merged))
        tmp.replace(self.folder / "results.jsonl")
        for part in self.folder.glob("part-*.jsonl"):
            part.unlink()
        return merged


def pending(items: Iterable[Item], done: set[tuple[int, str]], rows: list[str], process: Process) -> Iterable[Item]:
    """This process's share of the items (by index) that still lack a row's result."""
    for item in items:
        if item.index % process.world_size == process.rank and any((item.index, row) not in done for row in rows):
            yield item


# ----------------------------------------------------------------------------- the command


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch  # after parsing: --help and bad flags answer without torch
    from tqdm.auto import tqdm

    from arr_coc import distributed
    from arr_coc.eval import report
    from arr_coc.relevance.layer import CheckpointError

    process = distributed.start(args.device)
    folder = ResultsFolder(args.out, process)
    try:
        if args.dataset:
            source = open_source(args.dataset, args.split, args.config, args.schema, args.limit)
        else:
            source = synthetic_source(args.limit or args.synthetic, tuple(cli.names(args.kinds)), args.seed, args.size)
        metric = args.metric or source.metric
        args.max_new_tokens = args.max_new_tokens or SCHEMAS[source.schema].max_new_tokens
        model, checkpoint = cli.load_model(args.model, args.checkpoint, process.device, quiet=not process.is_main)
        rows = row_names(args)
        settings = run_settings(args, source, metric, checkpoint)
        if process.is_main:
            folder.check_settings(settings)
        done = {(r["item"], r["row"]) for r in folder.read()}
        model.warmup()  # CUDA graphs of the common shapes, captured before the clock starts
        process.barrier()
        start = time.perf_counter()
        with torch.no_grad():
            for item in tqdm(pending(source.items, done, rows, process), desc="evaluate", unit="item",
                             disable=not process.is_main):
                todo = [row for row in rows if (item.index, row) not in done]
                folder.append(evaluate_item(model, source, item, todo, metric, args))
    except (InputError, CheckpointError, OutOfMemory) as e:
        process.log(f"error: {e}")
        if folder.read():
            process.log(f"the results finished so far are kept in {args.out}; run the same command again to resume")
        return 2
    process.barrier()
    seconds = time.perf_counter() - start
    if process.is_main:
        results = folder.merge(rows)
        items = len({r["item"] for r in results})
        unscored = len({r["item"] for r in results if r["score"] is None})
        fresh = items - len({item for item, _ in done})
        header = dict(settings, model_name=model.vlm.name, items=items, unscored_items=unscored,
                      versions=cli.versions(),
                      throughput=dict(processes=process.world_size, items=fresh, seconds=round(seconds, 2),
                                      items_per_s=round(fresh / seconds, 3) if fresh else None))
        summary = report.summarise(results, rows)
        paths = report.write_report(args.out, summary, header, results)
        print(f"{items} items, model {model.vlm.name}, checkpoint {checkpoint}, {process.world_size} process(es): "
              f"{fresh} evaluated now in {seconds:.1f} s")
        print(report.markdown_table(summary, metric))
        if unscored:
            print(f"{unscored} of {items} items have no reference answers: answered but not scored, "
                  "and left out of the accuracy")
        print("wrote " + ", ".join(str(p) for p in paths))
    distributed.finish(process)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
