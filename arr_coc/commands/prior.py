"""
python -m arr_coc.commands.prior: calibrate a model's prior readout (issue 61, part 2; arr_coc.distill.prior): on
--pages synthetic pages of the trained layout families (never the held-out ones), every layer, head and row rule of
the question->gestalt attention, plain and relative to a generic question (ViCrop), scored by the box recall of
the prior map's --top-cells top cells; the best one, where it beats today's readout there, is written as prior.json
beside the model (a folder's own; for a hub id under checkpoints/priors/), which the prior pass then reads. Works
for any Qwen-VL loaded by from_pretrained (hub id or folder): the pages are generated, no data set is read.

--heldout N then measures the prior map alone on N fresh pages of the held-out families (today's readout and the
chosen one, box recall of the top cells, 95% bootstrap intervals); --judge runs evaluate's arr:topk row with
both readouts on the held-out families at the default rule's scale (arr_coc.commands.evidence's pieces: box recall
at 64 saccades, exact match per kind, Wilson intervals) and writes the verdict beside prior.json (prior_evidence.json).

    python -m arr_coc.commands.prior --model pocket --pages 96 --heldout 96
    python -m arr_coc.commands.prior --model pocket --judge --pages-judged 96          # the rule's run (resumable)
    python -m arr_coc.commands.prior --model Qwen/Qwen2-VL-2B-Instruct --pages 96 --max-layer 14

Cost: a page is drawn, its gestalt encoded, and every layer read twice (the question, the generic question); the
choice itself takes < 1 s. Pocket model on a shared 2-core CPU: 1-5 s a page. Qwen2-VL-2B: about 3.1 TFLOP a page
(arr_coc.vlm.flops: 1.48 for the gestalt, 0.79 a 300-token pass), about a minute a page on a 2-core CPU, well under a
second on one H200 (estimated from the FLOPs, not measured).
"""

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from arr_coc.commands import cli
from arr_coc.checkpoints import RULE
from arr_coc.flags import bounded_int, config_parser, device_flag, flag, parse_config, seed_flag
from arr_coc.settings import PRIOR_READOUTS

PRIOR_EVAL_SEED = 10**9 + 61  # held-out pages (a fresh seed: no earlier run drew it), calibration's far below
PRIOR_EVIDENCE_FILE = "prior_evidence.json"  # --judge's verdict, beside prior.json
JUDGE_SEED = 6161  # --judge's pages: fresh (evidence's own runs drew 6101, evaluate's default is 1234)


@dataclass
class PriorConfig:
    """The prior command's flags, each field one (arr_coc.flags.flag)."""
    model: str | None = cli.model_flag("pocket", "the VLM whose prior to calibrate", "Default: pocket")
    out: str | None = flag(None, "where the readout goes (default: the model folder's prior.json; a hub id's under "
                                 "checkpoints/priors/)", cli.output_file)
    pages: int = flag(96, "calibration pages (trained layout families, boxes known)", bounded_int(1, 100_000))
    top_cells: int = flag(RULE.budget, "top cells of a readout's map whose box recall scores it (the default rule's "
                                       "saccades)", bounded_int(1, cli.MAX_CELLS))
    size: int = flag(RULE.size, "page area of the synthetic pages (about size^2 px)", bounded_int(112, 8192))
    max_layer: int | None = flag(None, "read no layer above this one (a deeper prior costs more: every layer below "
                                       "it runs; default: any)", bounded_int(0, 1000))
    heldout: int = flag(0, "also measure the prior map alone on this many held-out-family pages (today's readout "
                           "and the chosen one)", bounded_int(0, 100_000))
    judge: bool = flag(False, "instead of calibrating, judge the saved readout against today's by the default rule "
                              "(evaluate's arr:topk on the held-out families; resumable)")
    pages_judged: int = flag(RULE.pages, "with --judge: pages a kind and family", bounded_int(1, 100_000))
    work: str | None = flag(None, "with --judge: evaluate's folders (default: runs/prior-evidence/SIZEpx-PAGESp)",
                            cli.output_folder)
    max_cells: int = cli.max_cells_flag()
    device: str | None = device_flag()
    seed: int = seed_flag(0, "the calibration pages")


def readout_path(args: PriorConfig) -> Path:
    from arr_coc.vlm.families import model_path
    from arr_coc.vlm.readout import prior_file

    return Path(args.out) if args.out else prior_file(model_path(args.model))


def calibrate(vlm, args: PriorConfig):
    """Read the calibration pages, choose the readout, save it -> the PriorReadout."""
    from arr_coc.distill.prior import choose_readout, read_prior
    from arr_coc.synth.families import TRAINED, family_pages

    readings = []
    for i, (item, image, question, _, box) in enumerate(family_pages(TRAINED, args.pages, args.size, args.seed,
                                                                     "prior")):
        readings.append(read_prior(vlm, image, question, box, args.max_cells))
        cli.log(f"calibration page {i + 1}/{args.pages} {item}")
    readout = choose_readout(readings, vlm.name, args.top_cells, args.max_layer)
    cli.log(f"chosen: {readout.describe()}, box recall of the top {args.top_cells} {readout.recall:.3f} on "
            f"{args.pages} pages (today's readout {readout.default_recall:.3f}) -> {readout.save(readout_path(args))}")
    return readout


def measure(vlm, readout, args: PriorConfig) -> dict:
    """--heldout: per held-out family, the prior map's box recall of the top cells under today's readout and the
    chosen one (mean, 95% bootstrap interval, pages)."""
    from arr_coc.distill.prior import read_prior, readout_map, top_recall
    from arr_coc.eval.intervals import bootstrap_mean
    from arr_coc.synth.families import HELD_OUT, family_pages
    from arr_coc.vlm.readout import DEFAULT

    recalls = {family: {"today": [], "chosen": []} for family in HELD_OUT}
    for i, (item, image, question, _, box) in enumerate(family_pages(HELD_OUT, args.heldout, args.size, PRIOR_EVAL_SEED,
                                                                     "heldout")):
        reading = read_prior(vlm, image, question, box, args.max_cells)
        for name, chosen in (("today", DEFAULT), ("chosen", readout)):
            recalls[item.split(":")[0]][name].append(top_recall(readout_map(reading, chosen), reading, args.top_cells))
        cli.log(f"held-out page {i + 1}/{args.heldout} {item}")
    result = {}
    for family, by in recalls.items():
        result[family] = {name: [sum(v) / max(len(v), 1), *bootstrap_mean(v), len(v)] for name, v in by.items()}
        print(f"{family}: prior map's box recall of the top {args.top_cells}, {vlm.name} at {args.size}^2 (n="
              f"{len(by['today'])}): today's " + ", chosen ".join(
                  f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi, _ in (result[family]["today"],
                                                                        result[family]["chosen"])))
    return result


def judge_runs(args: PriorConfig):
    """--judge's evaluate runs, today's readout then the calibrated one, on every held-out family (evidence's
    command lines, with --prior-readout) -> ({readout: {family: {kind: Measure}}}, the evidence config), or
    evaluate's exit code where a run did not finish."""
    from arr_coc import evaluate
    from arr_coc.commands import evidence
    from arr_coc.synth.families import HELD_OUT

    work = args.work or f"runs/prior-evidence/{args.size}px-{args.pages_judged}p-b{RULE.budget}"
    ev = evidence.EvidenceConfig(checkpoint="prior", model=args.model, pages=args.pages_judged, size=args.size,
                                 budget=RULE.budget, families=HELD_OUT, seed=JUDGE_SEED, work=work, device=args.device)
    layers = {}
    for which in PRIOR_READOUTS[::-1]:  # "default" (today's), then "calibrated"
        layers[which] = {}
        for family in HELD_OUT:
            argv = evidence.evaluate_argv(ev, "prior", family)
            argv[argv.index("--out") + 1] = out = str(Path(work) / f"prior-{which}-{family}")
            cli.log(f"judge: the {which} readout on {family} ({args.pages_judged} pages a kind)")
            if code := evaluate.main([*argv, "--prior-readout", which]):
                return code, ev
            layers[which][family] = evidence.measured(evidence.read_records(Path(out)), evidence.family_kinds(family))
    return layers, ev


def judge(args: PriorConfig) -> int:
    """--judge: the saved readout against today's by the default rule (evidence.verdict), written beside it."""
    from arr_coc.commands import evidence
    from arr_coc.vlm.readout import PriorReadout

    path = readout_path(args)
    if args.out or PriorReadout.load(path) is None:
        print(f"error: --judge reads the readout the model loads ({path}): calibrate it there first (no --out)",
              file=sys.stderr)
        return 2
    layers, ev = judge_runs(args)
    if isinstance(layers, int):
        return layers
    ruling = evidence.verdict(layers["default"], layers["calibrated"], ev)
    result = dict(readout=PriorReadout.load(path).describe(), model=args.model, rule=asdict(RULE), row=evidence.ROW,
                  pages=args.pages_judged, size=args.size, budget=RULE.budget, seed=JUDGE_SEED, **evidence.commit(),
                  readouts={which: {family: {kind: asdict(m) for kind, m in kinds.items()}
                                    for family, kinds in by.items()} for which, by in layers.items()},
                  verdict=asdict(ruling))
    path.with_name(PRIOR_EVIDENCE_FILE).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(evidence.table(layers, ev.families))
    print(f"calibrated readout: {'passes' if ruling.passes else 'fails'}"
          + "".join(f"\n- {why}" for why in ruling.measured + ruling.scale))
    return 0


def main(argv=None) -> int:
    args = parse_config(PriorConfig, argv, config_parser(PriorConfig, __doc__))
    from arr_coc.errors import InputError

    if args.judge:
        return judge(args)
    try:
        vlm = cli.load_vlm(args.model, args.device).vlm
        readout = calibrate(vlm, args)
        if args.heldout:
            result = measure(vlm, readout, args)
            readout_path(args).with_name(f"{readout_path(args).stem}_heldout.json").write_text(
                json.dumps(dict(readout=readout.describe(), size=args.size, budget=args.top_cells, seed=PRIOR_EVAL_SEED,
                                families=result), indent=1) + "\n")
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in asdict(readout).items() if k != "scores"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
