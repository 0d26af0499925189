"""
Compare the pipelines on a dataset: the set's accuracy metric, visual tokens, TTFT, total time and GFLOPs per
row, box recall where items have target boxes, and (with --faithfulness) whether ARR's answers depend on
its saccades.

Rows are the baselines (the stock views full, gestalt, budget; the published token reducers divprune, visionzip,
fastv, pixelprune_n at ARR's visual-token count, pixelprune at its own), ARR-COC under each allocation strategy
(arr:topk, arr:logpolar, arr:grid, arr:random), the oracle beside them (ARR's ceiling, on the items with an asked
box: the candidate cells the box touches forced into the budget, the budget's most relevant of them where they are
more, recorded as box_clipped; the rest chosen by ARR under topk; fed to the LLM as ARR feeds its saccades; its box
recall is 1 wherever the box fits; the items without a box are skipped for it and counted; --no-oracle leaves it
out) and, with --ablations, ARR with one part switched off under topk (arr-information:topk, ...,
arr-no-gestalt:topk; arr_coc.relevance.ablation), all on the same items and the same visual tokens: the design's
critical experiment at a fixed budget. Three more --ablations switch one tension on, with a fixed value, against
arr:topk where each is at its prior: arr-explore:topk (e = 0.25), arr-diversify:topk (lambda = 2) and
arr-auto-budget:topk (the adaptive budget). Every ARR row records its tensions per item in results.jsonl (under
"tensions": explore, diversify, particularize, budget K, auto_budget, structure); report.md adds the mean visual
tokens and accuracy per scene kind. --budget auto puts every ARR row on the adaptive budget (the reducers keep as
many tokens).

--budgets runs that experiment at several budgets (a budget sweep): every row but full, gestalt, pixelprune and
arr-auto-budget:topk (which read no fixed budget, and run once) at each budget (budget, arr:random and the oracle
among them by default), each budget being a number of saccades and every other row reading ARR's visual tokens at
it; the report gets a table per budget and accuracy curves against visual tokens and TTFT, one per row. A sweep is
of fixed budgets: it is refused with --budget (auto included). A budget over an image's candidate grid is skipped
for that image, with one line saying so. With --refixate TAU, each strategy also gets a row with ARR's second look
(arr+refix:topk, ...: a second round of --refixate-budget saccades, default half the first look's K, when the
answer's confidence is below TAU; in a sweep, at each budget); each of its results records whether it fired, both
confidences and the first answer's own score, and report.md says how often it fires and the accuracy with and
without it.

    python -m arr_coc.evaluate --model tiny --synthetic 16 --out runs/eval-synthetic
    python -m arr_coc.evaluate --dataset lmms-lab/DocVQA --config DocVQA --split validation --limit 500 --out runs/docvqa
    python -m arr_coc.evaluate --dataset data/chartqa --schema chartqa --limit 100 --faithfulness --out runs/chartqa
    python -m arr_coc.evaluate --model tiny --checkpoint tiny-text-vs-distractor --baselines "" --strategies topk \
        --ablations all --out runs/eval-ablations
    python -m arr_coc.evaluate --model pocket --synthetic 64 --kinds fine_print,box_word,shape_colour --baselines "" \
        --strategies topk --refixate 0.9 --out runs/eval-refixate
    torchrun --nproc-per-node 2 -m arr_coc.evaluate --dataset lmms-lab/textvqa --limit 1000 --out runs/textvqa
    python -m arr_coc.evaluate --model tiny --synthetic 16 --budgets 64,128,273,529,1024 --out runs/eval-sweep
    python -m arr_coc.evaluate --model pocket --synthetic 384 --kinds fine_print,box_word --families held-out \
        --size 896 --strategies topk,random --budgets 16,32,64,273 --out runs/eval-heldout-896   # + budget, oracle

--looks one,two_scale runs each strategy's ARR row under each look: arr:topk (one look) and arr+two_scale:topk (the
region around the relevance peak re-read as a crop of --crop-tokens native cells, whose own prior pass chooses the
cells inside it: arr_coc.pipelines.two_scale); the crop's tokens count in the row's visual tokens, and the reducers
and the budget view at ARR's count read as many as the two-scale row (never fewer than any ARR row).

    python -m arr_coc.evaluate --model pocket --checkpoint prior --synthetic 48 --kinds fine_print,box_word \
        --families box_grid --size 1792 --budgets 64,273 --baselines full,pixelprune_n --strategies topk \
        --looks one,two_scale --out runs/eval-two-scale

--conversation asks each page of the pocket suite (--kinds of fine_print, box_word, shape_colour) up to --turns of
its own questions, every row twice: in one conversation (ARR reading each question anew: a new block of saccades
a turn) and each question alone; report.md gives exact match by turn index, per kind, with 95% intervals
(arr_coc.eval.conversations). FastV cannot hold a conversation and is left out of the rows then.

    python -m arr_coc.evaluate --model pocket --conversation --synthetic 96 --kinds box_word,fine_print \
        --baselines full --strategies topk --budget 64 --out runs/eval-conversation

--out holds run.json (the settings, with the prompt every item is asked and where it comes from), results.jsonl
(one line per item and row, in order, with its budget in a sweep; an item without reference answers has score
null), report.md, report.json and the plots (arr_coc.eval.report). While running, each process appends its
finished items to part-RANK.jsonl; run the same command again to resume: finished items are skipped. A different command
(every flag counts but --device) is refused, naming what differs. Under torchrun the items are shared out
by index and the merged results equal a one-process run, item for item.

Ctrl-C stops it with "stopped; rerun the same command to resume" and exit code 130; a line cut short by an
interruption is trimmed off the part file before it is appended to. Should rows still end up evaluated on
different items (a sweep's budget skipped over an image's grid, a lost result), the report says so loudly, on
stdout and at the top of report.md, naming the items each row lacks.

Without --model, the default model loads, or, where the hub cannot be reached (checked at once, or
HF_HUB_OFFLINE=1) and the local cache lacks it, the pocket model, with a note; run.json records the one that ran.

Exit codes: 0 on success; 130 when stopped by Ctrl-C; 2 on bad input (a bad flag, a model or dataset that
cannot be loaded, a dataset without the schema's columns, an unreadable image, an --out made with other
settings), with one line on stderr; the results written so far are kept. A --dataset path that does not exist (one that is not here and
whose schema neither --schema nor its name tells), an unusable --device and an --out that is a file or cannot
be written are refused before anything loads; --out is made only once there is something to write.
"""

from __future__ import annotations  # type hints name the model without importing torch

import argparse
import json
import time
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from arr_coc import pipelines
from arr_coc.commands import cli
from arr_coc.pipelines import BASELINES
from arr_coc.relevance.config import STRATEGIES
from arr_coc.errors import InputError, OutOfMemory
from arr_coc.eval.data import SCENE_KINDS, families_flag
from arr_coc.eval.metrics import LENIENT, METRICS
from arr_coc.eval.records import EvalRecord
from arr_coc.eval.rows import ORACLE, ORACLE_STRATEGY, REFIX, look_mark, row_look, split_row
from arr_coc.eval.sets import SCHEMAS, Item, Source, check_questions, guess_schema, open_source, synthetic_source
from arr_coc.flags import config_parser, device_flag, flag, one_of, parse_config, seed_flag, with_flags_of
from arr_coc.relevance import ablation as ablations
from arr_coc.settings import LOOKS, PRIOR_READOUTS, REFIXATE_GUIDES, PipelineConfig

if TYPE_CHECKING:
    from arr_coc.runtime.distributed import Process
    from arr_coc.model import ARRCOCQwen

ABLATION_STRATEGY = "topk"  # the strategy of the ablation rows: ARR's default row, the one they are compared with
TIMING_FIELDS = ("ttft_ms", "total_ms")  # the only fields of a result that differ between two identical runs


def dataset(text: str) -> str:
    """An argparse type: a local file or folder that exists, or a hub id (name or owner/name, fetched on load)."""
    path = Path(text)
    looks_local = (not cli.HUB_ID.fullmatch(text) or path.suffix in (".parquet", ".jsonl")
                   or (path.parent != Path(".") and path.parent.is_dir()))  # data/chartqa: under a local folder
    if looks_local and not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist; a hub dataset id looks like owner/name")
    return text


def check_dataset(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A --dataset that is not here is a hub id only if its schema is known (--schema, or told by the id): else it is
    a path that does not exist (data/does-not-exist), and is named so now, before anything loads."""
    if not args.dataset or args.schema or Path(args.dataset).exists():
        return
    try:
        guess_schema(args.dataset)
    except InputError:
        p.error(f"argument --dataset: {args.dataset} does not exist (no such file or folder); for a hub dataset of "
                f"that id, pass --schema ({', '.join(SCHEMAS)})")


@with_flags_of("gestalt_tokens", pipelines.OPTIONS)  # then each pipeline's own settings (--fastv-layer, ...)
@dataclass
class EvalConfig:
    """evaluate's flags, each field one (arr_coc.flags.flag), in --help's order: the model, the items, the rows and
    how they run, where it runs and writes."""
    model: str | None = cli.model_flag()
    checkpoint: str | None = cli.checkpoint_flag()
    dataset: str | None = flag(None, "a hub dataset id, a folder of parquet files, a parquet file, or a folder with "
                                     "data.jsonl (default: --synthetic scenes)", dataset)
    split: str = flag("validation", "the dataset's split")
    config: str | None = flag(None, "the hub dataset's configuration name (e.g. DocVQA)")
    schema: str | None = flag(None, "the dataset's columns and metric (default: told by the dataset's id or folder "
                                    "name)", cli.one_of(SCHEMAS))
    metric: str | None = flag(None, "score answers by this (default: the schema's)", cli.one_of(METRICS))
    limit: int | None = flag(None, "evaluate the first N items only", cli.bounded_int(1, 10**9))
    synthetic: int = flag(16, "without --dataset: this many synthetic scenes", cli.bounded_int(1, 100_000))
    kinds: str = flag(",".join(SCENE_KINDS[:5]), f"synthetic scene kinds, comma-separated, of {','.join(SCENE_KINDS)} "
                                                "(fine_print, box_word and shape_colour are the pocket model's suite)",
                      cli.comma_list(SCENE_KINDS))
    size: int = flag(896, "synthetic scene side in px", cli.bounded_int(64, 8192))
    held_out_layouts: bool = flag(False, "the pocket suite's pages (fine_print, box_word, shape_colour) in the layouts "
                                         "pocket training never draws: rotated clutter, boxes in rows, print under the "
                                         "shapes (fineprint.LAYOUTS)")
    families: tuple[str, ...] = flag((), "the pocket suite's pages drawn by these layout families (comma-separated "
                                         "names, or 'held-out' / 'trained'; synth/families.py), each page about "
                                         "--size^2 px in its own aspect", families_flag, shown="–")
    seed: int = seed_flag(1234, "the synthetic scenes and the random removal order")
    baselines: str = flag(",".join(BASELINES), f"baselines to run, comma-separated (\"\" for none): "
                                              f"{pipelines.describe(BASELINES)}",
                          cli.comma_list(BASELINES, allow_empty=True))
    strategies: str = flag(",".join(STRATEGIES), "ARR strategies to run, comma-separated (\"\" for none)",
                           cli.comma_list(STRATEGIES, allow_empty=True))
    ablations: str = flag("", f"ARR ablations to run under {ABLATION_STRATEGY}, comma-separated, or \"all\" (default "
                              "none): " + ablations.describe(), cli.ablation_list, shown="none")
    no_oracle: bool = flag(False, "leave out the oracle row, which runs beside ARR's rows by default: ARR with the "
                                  "asked box's cells forced into its budget (the most relevant of them where they "
                                  "are more), the rest by its own relevance, fed as ARR feeds; on items with a box "
                                  "only")
    budget: int | str = cli.budget_flag(group="budget")
    min_budget: int = cli.min_budget_flag()
    max_budget: int = cli.max_budget_flag()
    budgets: list[int] | None = flag(None, "a budget sweep: saccade counts, comma-separated (e.g. 64,128,273,529,1024); "
                                           "every row but full, gestalt and arr-auto-budget runs at each, reading ARR's "
                                           "visual tokens at that budget (fixed budgets: not with --budget, auto "
                                           "included)", cli.int_list(1, cli.MAX_CELLS), group="budget")
    max_new_tokens: int | None = flag(None, "answer length limit (default: the schema's, lmms-eval's for Qwen2-VL: "
                                            "docvqa 32, textvqa 128, chartqa 16; 16 for JSONL sets and synthetic "
                                            "scenes)", cli.new_tokens)
    max_cells: int = cli.max_cells_flag()
    gestalt_tokens: int = cli.gestalt_tokens_flag()
    refixate: float | None = cli.refixate_flag()
    refixate_budget: int | None = cli.refixate_budget_flag()
    refixate_guide: str = cli.refixate_guide_flag()
    looks: str = cli.looks_flag()
    crop_tokens: int = cli.crop_tokens_flag()
    prior_readout: str = flag(PRIOR_READOUTS[0], "the prior pass's readout: the model's calibrated one (its "
                                                 "prior.json: python -m arr_coc.commands.prior; today's where it has "
                                                 "none) or today's (every head, the question's rows, the middle layer)",
                              one_of(PRIOR_READOUTS))
    faithfulness: bool = flag(False, "for every ARR strategy row (not the ablations), also measure the deletion / "
                                     "random / insertion curves of the reference answer (3 x (steps + 1) "
                                     "teacher-forced forwards per item)")
    faithfulness_steps: int = cli.faithfulness_steps_flag()
    conversation: bool = flag(False, "ask each pocket-suite page up to --turns of its questions, in one conversation "
                                     "and each alone, and report accuracy by turn (synthetic pages of fine_print, "
                                     "box_word, shape_colour)")
    turns: int = flag(4, "with --conversation: at most this many questions a page", cli.bounded_int(2, 16))
    device: str | None = device_flag(torchrun=True)
    out: str | None = flag(None, "results folder (default: a fresh runs/eval-YYYYmmdd-HHMMSS); an existing one is "
                                 "resumed", cli.output_folder)
    fallback: bool = False  # not a flag: --model left out, so the pocket model may stand in offline (default_model)


def parse_args(argv=None) -> EvalConfig:
    p = build_parser()
    args = parse_config(EvalConfig, argv, p)
    cli.default_model(args)
    check(p, args)
    args.out = args.out or cli.default_folder(p, "--out", f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
    return args


def build_parser() -> argparse.ArgumentParser:
    """The command's flags, EvalConfig's fields (lmms-eval's engine reads its model_args through it too)."""
    return config_parser(EvalConfig, __doc__)


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The refusals that need more than one flag, each one line on stderr and exit 2; --budgets comes back sorted,
    without repeats."""
    cli.check_fastv_layer(p, args)  # where the model's depth is known before it loads
    check_dataset(p, args)
    if not args.baselines and not args.strategies and not args.ablations:
        p.error("argument --baselines: empty, and so are --strategies and --ablations: nothing to evaluate")
    cli.check_budget(p, args, args.max_cells)
    cli.check_gestalt_tokens(p, args)
    for budget in args.budgets or []:
        if budget > args.max_cells:
            p.error(f"argument --budgets: {budget} exceeds --max-cells {args.max_cells}")
    args.budgets = sorted(set(args.budgets)) if args.budgets else None
    if args.faithfulness and not args.strategies:
        p.error("argument --faithfulness: needs an ARR row (--strategies)")
    if args.refixate is not None and not args.strategies:
        p.error("argument --refixate: needs an ARR row (--strategies) to look again")
    cli.check_refixate(p, args)
    if "looks" in p.given and not args.strategies:
        p.error("argument --looks: needs an ARR row (--strategies) to look with")
    cli.check_look(p, args, cli.names(args.looks))
    if args.held_out_layouts:
        check_pocket_pages(p, args, "--held-out-layouts", "draws")
    if args.families:
        check_pocket_pages(p, args, "--families", "draws")
    if args.conversation:
        check_conversation(p, args)
    elif "turns" in p.given:
        p.error("argument --turns: only used with --conversation")
    for name in ("synthetic", "kinds", "size"):
        if name in p.given and args.dataset:
            p.error(f"argument --{name}: draws synthetic scenes, not with --dataset (--limit takes a set's first items)")


def check_pocket_pages(p: argparse.ArgumentParser, args: argparse.Namespace, flag: str, does: str) -> None:
    """A flag that only the pocket suite's synthetic pages take (no --dataset, no other --kinds): refused otherwise."""
    from arr_coc.synth.fineprint import PAGE_KINDS

    others = sorted(set(cli.names(args.kinds)) - set(PAGE_KINDS))
    if args.dataset or others:
        p.error(f"argument {flag}: {does} the pocket suite's synthetic pages ({', '.join(PAGE_KINDS)}), not "
                + (f"--dataset {args.dataset}" if args.dataset else f"--kinds {', '.join(others)}"))


def check_conversation(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--conversation: the pocket suite's synthetic pages, rows that can hold a conversation, one budget."""
    check_pocket_pages(p, args, "--conversation", "asks")
    for flag, given in (("--budgets", args.budgets), ("--refixate", args.refixate is not None),
                        ("--faithfulness", args.faithfulness), ("--ablations", cli.names(args.ablations))):
        if given:
            p.error(f"argument {flag}: not with --conversation")
    if not [row for row in conversation_rows(args)]:
        p.error("argument --conversation: no row can hold a conversation (FastV cannot)")


def conversation_rows(args: argparse.Namespace) -> list[str]:
    """--conversation's rows: the baselines that can hold a conversation, then ARR under each strategy."""
    return ([b for b in cli.names(args.baselines) if b not in pipelines.FAST_ENGINE_ONLY]
            + [f"arr:{s}" for s in cli.names(args.strategies)])


# ----------------------------------------------------------------------------- one item


Job = tuple[str, int | None]  # (row, budget): None for the one --budget, and in a sweep for the rows that read none


def beyond_grid(row: str, budget: int, views, refixate_budget: int | None) -> str | None:
    """Why a row cannot run at this budget on this image (more saccades than candidate cells, counting a second
    look's should it fire), or None."""
    from arr_coc.pipelines.refixation import second_look_saccades

    gh, gw = views.candidate_grid
    _, _, ablation, refix = split_row(row)
    needed = ablations.get(ablation).saccade_budget(budget, views.gestalt_grid[0] * views.gestalt_grid[1])
    if refix:  # the second look reads cells the first did not
        needed += second_look_saccades(refixate_budget, needed)
    if needed <= gh * gw:
        return None
    return f"{needed} saccades exceed the {gh}x{gw} = {gh * gw} candidate cells"


def skip_reason(row: str, budget: int | None, item: Item, views, refixate_budget: int | None) -> str | None:
    """Why a job cannot run on this item (the oracle row on an item without an asked box; in a sweep, a budget over
    the image's grid: beyond_grid), or None."""
    if row == ORACLE and item.box is None:
        return "the item has no asked box to force in"
    return None if budget is None else beyond_grid(row, budget, views, refixate_budget)


def evaluate_item(model: ARRCOCQwen, source: Source, item: Item, jobs: list[Job], metric: str,
                  args: argparse.Namespace) -> tuple[list[EvalRecord], list[tuple[Job, str]]]:
    """Every job's answer to one item, scored: (one EvalRecord per job, the jobs skipped here with why). The oracle
    row is ARR under ORACLE_STRATEGY with the cells the asked box touches forced in (ARR's Options.include, on the
    candidate grid of the views every row reads). In a sweep, a result records its budget."""
    image, question = item.open(), source.prompt(item)
    oracle = item.box is not None and any(row == ORACLE for row, _ in jobs)
    views = model.views(image, args.max_cells, args.gestalt_tokens) if args.budgets or oracle else None  # what
    # budgets fit, and the oracle's grid
    results, skipped = [], []
    for row, budget in jobs:
        if why := skip_reason(row, budget, item, views, args.refixate_budget):
            skipped.append(((row, budget), why))
            continue
        pipeline, strategy, ablation, refix = split_row(row)  # "arr-no-gestalt:topk": arr under the no-gestalt ablation
        include = None
        if row == ORACLE:  # the asked box's cells, as box recall counts them (any a cell's share of the box > 0)
            pipeline, strategy, include = "arr", ORACLE_STRATEGY, views.box_coverage(item.box) > 0  # [GH, GW]
        request = cli.request(args, strategy=strategy, budget=args.budget if budget is None else budget,
                              ablation=ablation, refixate=args.refixate if refix else None, include=include,
                              look=look_of(row, args))
        a = cli.answer(model, image if include is None else views, question, pipeline, request)
        results.append(scored(model, item, row, budget, a, metric, args, include))
    return results, skipped


def look_of(row: str, args: argparse.Namespace) -> str:
    """The look a row's request carries (ARR's Options.look): an ARR row's own (rows.row_look; the oracle's one look); a
    baseline's the two-scale look where --looks runs it, so that the reducers and the budget view at ARR's count
    (arr.arr_visual_tokens) count its crop's tokens too and never read fewer than any ARR row."""
    if split_row(row)[0] in ("arr", ORACLE):
        return row_look(row)
    return LOOKS[1] if LOOKS[1] in cli.names(args.looks) else LOOKS[0]


def scored(model: ARRCOCQwen, item: Item, row: str, budget: int | None, a, metric: str, args: argparse.Namespace,
           include=None) -> EvalRecord:
    """One row's answer to an item, scored, as its EvalRecord. An item without reference answers (a test split) is
    scored None and gets no faithfulness curves; a benchmark metric also gets the lenient one as an extra field;
    the oracle row (`include`: the cells it forced in) says whether its box held more cells than its budget."""
    from arr_coc.eval.faithfulness import faithfulness_curves
    from arr_coc.eval.metrics import box_recall_precision, peak_on_box
    from arr_coc.pipelines.answer import tension_record

    _, _, ablation, refix = split_row(row)
    score = (lambda text: METRICS[metric](text, item.answers) if item.answers else None)  # noqa: E731
    result = EvalRecord(item=item.index, id=item.id, kind=item.kind, family=item.family or None, row=row,
                        budget=budget, sweep=bool(args.budgets), prediction=a.text, answers=item.answers,
                        score=score(a.text), visual_tokens=a.tokens.total_visual, gflops=round(a.compute.total, 1),
                        ttft_ms=round(a.ttft_ms, 2), total_ms=round(a.timings.total, 2), confidence=a.confidence)
    if a.fixations:  # whether the second look fired, and the first answer as it was before it
        result.refixated, result.confidences = a.refixated, [f.confidence for f in a.fixations]
        result.first_prediction, result.first_score = a.fixations[0].text, score(a.fixations[0].text)
    if metric != LENIENT and item.answers:
        result.contains = METRICS[LENIENT](a.text, item.answers)
    if a.arr is not None:  # its tensions (its first look's): e, λ, K, and f under the adaptive budget
        result.tensions = tension_record(a.arr)
    if item.box is not None:  # did it read the asked place: every row, on the candidate grid (cells_read)
        coverage = a.views.box_coverage(item.box)
        result.box_recall, result.box_precision = box_recall_precision(coverage, cells_read(a))
        result.fallback = a.arr.fallback[0] if a.arr is not None else None
        if a.arr is not None and a.arr.participatory_prior is not None:  # [1, GH, GW]: the prior's peak cell
            result.prior_peak = peak_on_box(coverage, a.arr.participatory_prior[0])
    if include is not None and a.arr is not None:  # the box's cells beyond the budget: only the most relevant of
        # them were forced in (an ARR that read the native view whole read them all)
        result.box_clipped = int(include.sum()) > a.arr.indices.shape[1]
    faithful = a.arr is not None and not ablation and not refix and row != ORACLE  # ARR's strategy rows
    if faithful and args.faithfulness and item.answers:  # of the 1st reference
        curves = faithfulness_curves(model.parts, a.observation, a.arr, item.answers[0], args.faithfulness_steps,
                                     args.seed)
        result.faithfulness = curves.to_json()
    return result


def cells_read(a):
    """The candidate cells [M] an answer read as their own: ARR's saccades (both rounds' under a second look); a
    reducer's kept tokens on the candidate grid (eval.metrics.cells_on_grid), VisionZip's merged context tokens left
    out (their features are not their cell's); a stock view's every cell (full, gestalt, budget: recall 1)."""
    import torch

    from arr_coc.eval.metrics import cells_on_grid

    if a.arr is not None:
        return torch.cat([f.arr.indices[0] for f in a.fixations]) if a.fixations else a.arr.indices[0]
    GH, GW = a.views.candidate_grid
    if a.kept is None:
        return torch.arange(GH * GW)
    own = a.kept if a.merged is None else a.kept[~(a.kept[:, None] == a.merged[None].cpu()).all(-1).any(1)]
    return cells_on_grid(own, a.views.native_grid, a.views.candidate_grid)


# ----------------------------------------------------------------------------- the results folder


def row_names(args: argparse.Namespace) -> list[str]:
    """The rows to evaluate: the stock baselines, ARR under each strategy and look ("arr:topk", "arr+two_scale:topk",
    ...), with --refixate ARR with its second look under each ("arr+refix:topk", ...), the oracle wherever an ARR
    row runs (unless --no-oracle), then each ablation ("arr-raster:topk", ...)."""
    marks = [look_mark(look) for look in cli.names(args.looks)]  # "" for one look, "+two_scale" for two
    arr = [f"arr{mark}:{s}" for s in cli.names(args.strategies) for mark in marks]
    refix = ([f"arr{mark}{REFIX}:{s}" for s in cli.names(args.strategies) for mark in marks]
             if args.refixate is not None else [])
    oracle = [ORACLE] if not args.no_oracle and (args.strategies or args.ablations) else []
    return (cli.names(args.baselines) + arr + refix + oracle
            + [f"arr-{a}:{ABLATION_STRATEGY}" for a in cli.names(args.ablations)])


def job_list(args: argparse.Namespace) -> list[Job]:
    """What to evaluate on each item, in order: every row once at --budget; in a sweep, the rows that read no
    fixed budget (budget_free) once, then every other row at each budget."""
    rows = row_names(args)
    if not args.budgets:
        return [(row, None) for row in rows]
    free = [row for row in rows if budget_free(row)]
    return [(row, None) for row in free] + [(row, b) for b in args.budgets for row in rows if row not in free]


def budget_free(row: str) -> bool:
    """Whether no fixed budget changes a row: full and gestalt, and ARR on its adaptive budget (arr-auto-budget)."""
    return row in pipelines.BUDGET_FREE or ablations.get(split_row(row)[2]).auto_budget


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
                **({"held_out_layouts": True} if args.held_out_layouts else {}),  # absent: folders before it resume
                **({"families": list(args.families)} if args.families else {}),
                seed=args.seed, model=args.model,
                checkpoint=checkpoint, rows=row_names(args), prompt=source.prompt_template,
                prompt_reference=SCHEMAS[source.schema].reference,
                budget=None if args.budgets else args.budget, budgets=args.budgets, **adaptive_bounds(args),
                max_new_tokens=args.max_new_tokens, max_cells=args.max_cells, fastv_layer=args.fastv_layer,
                **({"gestalt_tokens": args.gestalt_tokens}  # absent at the default: older folders resume
                   if args.gestalt_tokens != PipelineConfig.gestalt_max_tokens else {}),
                **({"pixelprune_tau": args.pixelprune_tau} if args.pixelprune_tau else {}),  # absent at 0: older
                # folders resume
                refixate=args.refixate, refixate_budget=args.refixate_budget,
                **({"refixate_guide": args.refixate_guide}  # absent at the default: older folders resume
                   if args.refixate_guide != REFIXATE_GUIDES[0] else {}),
                **({"looks": args.looks, "crop_tokens": args.crop_tokens}  # absent at one look: older folders resume
                   if args.looks != LOOKS[0] else {}),
                **({"prior_readout": args.prior_readout}  # absent at the default: older folders resume (main adds
                   if args.prior_readout != PRIOR_READOUTS[0] else {}),  # the calibrated readout's own, prior_readout)
                faithfulness_steps=args.faithfulness_steps if args.faithfulness else None,
                conversation_turns=args.turns if args.conversation else None)


def prior_readout(model: ARRCOCQwen, which: str) -> dict:
    """--prior-readout on the loaded model: "default" puts today's readout in place of its calibrated one -> the
    run's settings entry, the readout described where it is not today's (absent then, so older folders resume, and a
    folder measured with today's readout never resumes under a calibrated one)."""
    from arr_coc.vlm.readout import DEFAULT

    if which == "default":
        model.vlm.prior_readout = DEFAULT
    readout = model.vlm.prior_readout
    return {} if readout.choice == DEFAULT.choice else {"prior_readout": readout.describe()}


def adaptive_bounds(args: argparse.Namespace) -> dict:
    """--min-budget and --max-budget, where a row uses them (--budget auto or the arr-auto-budget row); else
    nothing, so that a folder from before the adaptive budget resumes."""
    return dict(min_budget=args.min_budget, max_budget=args.max_budget) if cli.reads_adaptive_budget(args) else {}


class OtherRun(InputError):
    """--out holds another run's results (ResultsFolder.check_settings): they are left as they are, and this
    command cannot resume them."""


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
                raise OtherRun(f"{self.folder} holds the results of another run ({'; '.join(changed)}); choose "
                               "another --out, or resume that run with its own settings")
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings, indent=2))

    def read(self) -> list[EvalRecord]:
        """Every finished result on disk: results.jsonl and all parts (a line cut short by a crash is dropped, and
        so is one that is no result of evaluate's: a --conversation run's, which another run's settings refuse)."""
        results = []
        for path in [self.folder / "results.jsonl", *sorted(self.folder.glob("part-*.jsonl"))]:
            if path.is_file():
                for line in path.read_text().splitlines():
                    try:
                        results.append(EvalRecord.from_json(json.loads(line)))
                    except (json.JSONDecodeError, TypeError):  # cut short, or not an EvalRecord's fields
                        continue
        return results

    def append(self, results: list[EvalRecord]) -> None:
        """One item's results, whole lines, flushed: an interruption loses at most the item being evaluated (and
        the line it cut short is trimmed off before the next append, not glued to its first line)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.trim()
        with self.part.open("a") as f:
            f.write("".join(json.dumps(r.to_json()) + "\n" for r in results))

    def trim(self) -> None:
        """Cut this process's part file back to its last newline: a line cut short by an interruption, which read()
        skips, goes, so that what is appended next starts a line of its own."""
        if not self.part.is_file():
            return
        with self.part.open("rb+") as f:
            if f.seek(0, 2) == 0:
                return
            f.seek(-1, 2)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            f.truncate(f.read().rfind(b"\n") + 1)

    def merge(self, jobs: list[Job]) -> list[EvalRecord]:
        """Rank 0, after every process is done: all results, one per (item, row, budget), in order -> results.jsonl."""
        unique = {(r.item, *job_of(r)): r for r in self.read() if job_of(r) in jobs}
        merged = [unique[key] for key in sorted(unique, key=lambda key: (key[0], jobs.index(key[1:])))]
        tmp = self.folder / "results.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r.to_json()) + "\n" for r in merged))
        tmp.replace(self.folder / "results.jsonl")
        for part in self.folder.glob("part-*.jsonl"):
            part.unlink()
        return merged


def job_of(result: EvalRecord) -> Job:
    """The (row, budget) a result answers (budget None outside a sweep: results made before sweeps resume too)."""
    return result.row, result.budget


def pending_total(items: Iterable[Item], done: set[tuple], jobs: list[Job], process: Process) -> int | None:
    """How many items `pending` yields, for the progress bar: counted where the items are a list (synthetic scenes,
    a JSONL set); None for a streamed dataset, whose length is unknown until it is read."""
    return sum(1 for _ in pending(items, done, jobs, process)) if isinstance(items, list) else None


def pending(items: Iterable[Item], done: set[tuple], jobs: list[Job], process: Process) -> Iterable[Item]:
    """This process's share of the items (by index) that still lack a job's result."""
    for item in items:
        if item.index % process.world_size == process.rank and any((item.index, *job) not in done for job in jobs):
            yield item


# ----------------------------------------------------------------------------- the command


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return evaluate_conversations(args) if args.conversation else evaluate_all(args)
    except KeyboardInterrupt:  # Ctrl-C: every finished item is on disk, line by whole line
        kept = any(Path(args.out).glob("*.jsonl"))
        cli.log("stopped; rerun the same command to resume" + (f" (finished items are kept in {args.out})" if kept else ""))
        return 130


def evaluate_all(args: argparse.Namespace) -> int:
    """The command after parsing: load, evaluate what --out lacks, merge, report; the exit code."""
    from arr_coc.runtime import distributed  # after parsing: --help and bad flags answer without torch
    from arr_coc.relevance.layer import CheckpointError

    process = distributed.start(args.device)
    folder = ResultsFolder(args.out, process)
    try:
        if args.dataset:
            source = open_source(args.dataset, args.split, args.config, args.schema, args.limit)
        else:
            source = synthetic_source(args.limit or args.synthetic, tuple(cli.names(args.kinds)), args.seed, args.size,
                                      args.held_out_layouts, args.families)
        metric = args.metric or source.metric
        args.max_new_tokens = args.max_new_tokens or SCHEMAS[source.schema].max_new_tokens
        model, checkpoint = cli.load_model(args.model, args.checkpoint, process.device, quiet=not process.is_main,
                                           fallback=args.fallback)
        args.model = model.vlm.name  # "pocket" where the default model fell back to it: run.json records it
        check_questions(source, model.check_question)  # their tokens: refused now, not at their item
        jobs = job_list(args)
        settings = {**run_settings(args, source, metric, checkpoint), **prior_readout(model, args.prior_readout)}
        if process.is_main:
            folder.check_settings(settings)
        done = {(r.item, *job_of(r)) for r in folder.read()}
        model.warmup()  # CUDA graphs of the common shapes, captured before the clock starts
        process.barrier()
        start = time.perf_counter()
        skipped = evaluate_items(model, source, jobs, done, metric, args, folder, process)
    except (InputError, CheckpointError, OutOfMemory) as e:
        process.log(f"error: {e}")
        if folder.read() and not isinstance(e, OtherRun):  # another run's results: this command cannot resume them
            process.log(f"the results finished so far are kept in {args.out}; run the same command again to resume")
        return 2
    process.barrier()
    seconds = time.perf_counter() - start
    for (row, budget), (count, why) in skipped.items():
        process.log(f"skipped {row}{'' if budget is None else f' at budget {budget}'} on {count} item(s): {why}")
    if process.is_main:
        report_run(args.out, folder.merge(jobs), jobs, settings, done, seconds, process)
    distributed.finish(process)
    return 0


def evaluate_items(model: ARRCOCQwen, source: Source, jobs: list[Job], done: set[tuple], metric: str,
                   args: argparse.Namespace, folder: ResultsFolder, process: Process) -> dict[Job, list]:
    """The run loop: this process's items that lack a job, each item's results appended to --out as it finishes
    -> a sweep's jobs skipped over an image's grid: {job: [items, the last reason]}."""
    import torch
    from tqdm.auto import tqdm

    skipped: dict[Job, list] = {}
    with torch.no_grad():
        for item in tqdm(pending(source.items, done, jobs, process), desc="evaluate", unit="item",
                         total=pending_total(source.items, done, jobs, process), disable=not process.is_main):
            todo = [job for job in jobs if (item.index, *job) not in done]
            results, skips = evaluate_item(model, source, item, todo, metric, args)
            folder.append(results)
            for job, why in skips:
                skipped[job] = [skipped.get(job, [0])[0] + 1, why]
    return skipped


def report_run(out: str, results: list[EvalRecord], jobs: list[Job], settings: dict, done: set[tuple], seconds: float,
               process: Process) -> None:
    """The main process's end of a run: report.md, report.json and the plots into --out, the tables on stdout.
    `results` are every process's, merged; `done` the jobs finished before this run; `seconds` this run's."""
    from arr_coc.eval import report

    metric, model_name, checkpoint = settings["metric"], settings["model"], settings["checkpoint"]
    items = len({r.item for r in results})
    unscored = len({r.item for r in results if r.score is None})
    fresh = items - len({item for item, *_ in done})
    header = dict(settings, model_name=model_name, items=items, unscored_items=unscored,
                  versions=cli.versions(),
                  throughput=dict(processes=process.world_size, items=fresh, seconds=round(seconds, 2),
                                  items_per_s=round(fresh / seconds, 3) if fresh else None))
    summary = report.summarise(results, [report.label(*job) for job in jobs])
    paths = report.write_report(out, summary, header, results)
    print(f"{items} items, model {model_name}, checkpoint {checkpoint}, {process.world_size} process(es): "
          f"{fresh} evaluated now in {seconds:.1f} s")
    if uneven := report.uneven_items(results, list(summary)):
        print(f"warning: {report.uneven_line(uneven, items)}; a budget over an image's grid is skipped (said "
              "above), any other gap is a lost result: rerun the same command to fill it")
    print(report.markdown_tables(summary, metric))
    if per_kind := report.kind_table(summary, metric):
        print(per_kind)
    if refixation := report.refixation_summary(results):
        print(report.refixation_table(refixation))
    if oracle := report.oracle_line(results):
        print(oracle)
    if unscored:
        print(f"{unscored} of {items} items have no reference answers: answered but not scored, "
              "and left out of the accuracy")
    print("wrote " + ", ".join(str(p) for p in paths))


def evaluate_conversations(args: argparse.Namespace) -> int:
    """--conversation: load, ask every page's questions in one conversation and alone, write the report -> the exit
    code."""
    import torch
    from tqdm.auto import tqdm

    from arr_coc.eval import conversations
    from arr_coc.relevance.layer import CheckpointError

    try:
        model, checkpoint = cli.load_model(args.model, args.checkpoint, args.device, fallback=args.fallback)
        prior_readout(model, args.prior_readout)
        args.max_new_tokens = args.max_new_tokens or SCHEMAS["suite"].max_new_tokens
        rows = conversation_rows(args)
        if set(cli.names(args.baselines)) & set(pipelines.FAST_ENGINE_ONLY):
            cli.log(f"note: {', '.join(pipelines.FAST_ENGINE_ONLY)} cannot hold a conversation: left out")

        def ask(image, question, pipeline, strategy, conversation):
            return cli.answer(model, image, question, pipeline, cli.request(args, strategy=strategy, refixate=None),
                              conversation=conversation)

        with torch.no_grad():
            results = conversations.evaluate_conversations(
                model, ask, rows, cli.names(args.kinds), args.limit or args.synthetic, args.seed, args.size,
                args.turns, lambda pages: tqdm(pages, desc="conversations", unit="page"))
    except (InputError, CheckpointError, OutOfMemory) as e:
        cli.log(f"error: {e}")
        return 2
    settings = dict(run_settings(args, Source("synthetic", "suite", []), "exact", checkpoint), rows=rows,
                    model_name=model.vlm.name, versions=cli.versions())
    paths = conversations.write(args.out, results, settings)
    print(conversations.markdown(results))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
