"""
python -m arr_coc.commands.evidence: whether an ARR layer may be its model's default (issue 61). It runs evaluate's
arr:topk row with the layer and with the untrained prior on the held-out layout families (slide, box_grid), fresh
pages of every kind a family carries, and writes evidence.json beside the checkpoint: per family and kind, the items,
box recall's mean with a 95% bootstrap interval (arr_coc.eval.intervals.bootstrap_mean), exact match with its 95% Wilson
interval, for both layers; the seed, the commit, the files' sha256, and the verdict. The layer passes only if, on
every held-out family, its box recall beats the prior's with the intervals apart, no kind's exact match is below the
prior's with the intervals apart, and the run is at the rule's scale (arr_coc.checkpoints.RULE: 896², >= 96 pages a
kind and family, 64 saccades). Only a passing evidence.json makes a checkpoint the default
(arr_coc.relevance.layer.choose_checkpoint); otherwise the app and every command use the prior.

Each (layer, family) is one evaluate folder under --work; run the same command again to resume (finished items are
kept), and the prior's folders are shared by every checkpoint measured with the same --work.

    python -m arr_coc.commands.evidence --checkpoint pocket-fineprint --model pocket          # the rule's run
    python -m arr_coc.commands.evidence --checkpoint pocket-fineprint --pages 8 --out runs/evidence-small.json

Exit codes: 0 when written (whatever the verdict), 2 on bad input, 130 when stopped (rerun to resume).
"""

import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from arr_coc.commands import cli
from arr_coc.checkpoints import (CONFIG_FILE, EVIDENCE_FILE, PACKAGE, PRIOR, POCKET_KINDS, RULE, WEIGHTS_FILE,
                                 DefaultRule, file_digests, label, resolve_checkpoint)
from arr_coc.eval.data import families_flag
from arr_coc.flags import bounded_int, config_parser, device_flag, flag, parse_config, seed_flag
from arr_coc.synth.families import FAMILIES, HELD_OUT

SEED = 6101  # fresh pages: no earlier sweep drew this seed (evaluate's default is 1234)
JUDGED_ROW = "arr:topk"  # the row judged: ARR as served


@dataclass
class EvidenceConfig:
    """The default rule's flags, each field one (arr_coc.flags.flag)."""
    checkpoint: str = flag(None, "the layer to judge: a name under checkpoints/ or a folder with config.json",
                           required=True)
    model: str | None = cli.model_flag("pocket", "the VLM the layer is for", "Default: pocket")
    pages: int = flag(RULE.pages, f"pages a kind and family (the rule asks for at least {RULE.pages}; fewer: a "
                                  "verdict that fails on its scale)", bounded_int(1, 100_000))
    size: int = flag(RULE.size, f"page area, about size^2 px (the rule's: {RULE.size})", bounded_int(64, 8192))
    budget: int = flag(RULE.budget, f"saccades (the rule's: {RULE.budget})", bounded_int(1, cli.MAX_CELLS))
    families: tuple[str, ...] = flag(HELD_OUT, "layout families, comma-separated (the rule's: every held-out "
                                               "one)", families_flag, shown="held-out")
    seed: int = seed_flag(SEED, "the pages (the same for both layers: the items are paired)")
    work: str | None = flag(None, "evaluate's folders, one per layer and family, resumed when run again (default: "
                                  "runs/evidence/SIZEpx-PAGESp-bBUDGET-sSEED)", cli.output_folder)
    out: str | None = flag(None, f"where the evidence goes (default: the checkpoint's own {EVIDENCE_FILE})",
                           cli.output_file)
    device: str | None = device_flag()


@dataclass
class Measure:
    """One layer's numbers on one family and kind (or "all" its kinds)."""
    items: int  # pages scored
    box_recall: list[float]  # [mean, low, high]: the asked box's share among the saccades, 95% bootstrap
    correct: int  # answered exactly
    exact_match: list[float]  # [rate, low, high]: 95% Wilson


@dataclass
class Verdict:
    passes: bool  # whether the layer may be its model's default
    measured: list[str] = field(default_factory=list)  # why the numbers refuse it (none: they do not)
    scale: list[str] = field(default_factory=list)  # why the run is not at the rule's scale (none: it is)


def parse_args(argv=None) -> EvidenceConfig:
    p = config_parser(EvidenceConfig, __doc__)
    args = parse_config(EvidenceConfig, argv, p)
    folder = Path(resolve_checkpoint(args.checkpoint))
    if not (folder / CONFIG_FILE).is_file():
        p.error(f"argument --checkpoint: {args.checkpoint} is no checkpoint folder here (no {CONFIG_FILE}); evidence "
                "is written beside the checkpoint it judges")
    args.checkpoint = str(folder)
    args.work = args.work or f"runs/evidence/{args.size}px-{args.pages}p-b{args.budget}-s{args.seed}"
    args.out = args.out or str(folder / EVIDENCE_FILE)
    return args


def family_kinds(family: str) -> list[str]:
    """The pocket suite's kinds a layout family carries, in the suite's order."""
    return [kind for kind in POCKET_KINDS if kind in FAMILIES[family].kinds]


def evaluate_argv(args: EvidenceConfig, layer: str, family: str) -> list[str]:
    """evaluate's command line for one layer ('prior' or a folder) on one family: arr:topk alone, every kind the
    family carries, exactly --pages of each (evaluate cycles the kinds)."""
    kinds = family_kinds(family)
    return ["--model", args.model, "--checkpoint", layer, "--synthetic", str(args.pages * len(kinds)),
            "--kinds", ",".join(kinds), "--families", family, "--size", str(args.size), "--seed", str(args.seed),
            "--baselines", "", "--strategies", JUDGED_ROW.split(":")[1], "--budget", str(args.budget),
            "--out", str(Path(args.work) / f"{work_name(layer)}-{family}"),
            *(["--device", args.device] if args.device else [])]


def work_name(layer: str) -> str:
    """A layer's evaluate folders' name: "prior", or the checkpoint's name and the start of its weights' sha256 (a
    retrained layer of the same name does not resume the old one's results)."""
    if layer == "prior":
        return layer
    return f"{label(layer)}-{(file_digests(layer)[WEIGHTS_FILE] or 'none')[:12]}"


def measured(records: list, kinds: list[str]) -> dict[str, Measure]:
    """evaluate's records of one layer on one family -> {kind: Measure, ..., "all": Measure}."""
    from arr_coc.eval.intervals import bootstrap_mean, wilson

    def measure(rows: list) -> Measure:
        recall = [r.box_recall for r in rows if r.box_recall is not None]
        correct = int(sum(r.score for r in rows))
        mean = sum(recall) / len(recall) if recall else 0.0
        return Measure(len(rows), [mean, *bootstrap_mean(recall)], correct,
                       [correct / max(len(rows), 1), *wilson(correct, len(rows))])

    return {**{kind: measure([r for r in records if r.kind == kind]) for kind in kinds}, "all": measure(records)}


def read_records(folder: Path) -> list:
    """A finished evaluate folder's results (results.jsonl), the judged row's."""
    from arr_coc.eval.records import EvalRecord

    lines = (folder / "results.jsonl").read_text().splitlines()
    return [r for r in map(EvalRecord.from_json, map(json.loads, lines)) if r.row == JUDGED_ROW]


def verdict(prior: dict[str, dict[str, Measure]], layer: dict[str, dict[str, Measure]], args: EvidenceConfig,
            rule: DefaultRule = RULE) -> Verdict:
    """The rule over both layers' measures ({family: {kind: Measure, "all": Measure}}) and the run's scale: it passes
    only where nothing refuses it. Intervals apart: one's low end above the other's high end (eval.report.against)."""
    from arr_coc.eval.report import against

    scale = [f"{what} {have} where the rule asks for {want}" for what, have, want, ok in (
        ("size", args.size, rule.size, args.size == rule.size),
        ("budget", args.budget, rule.budget, args.budget == rule.budget),
        ("pages a kind and family", args.pages, f"at least {rule.pages}", args.pages >= rule.pages),
        ("families", ",".join(args.families), f"every held-out one ({','.join(HELD_OUT)})",
         set(HELD_OUT) <= set(args.families))) if not ok]
    refused = []
    for family in args.families:
        ours, theirs = layer[family]["all"].box_recall, prior[family]["all"].box_recall
        if against(ours[1:], theirs[1:]) != "above":
            refused.append(f"{family}: box recall {shown(ours)} does not beat the prior's {shown(theirs)} with the "
                           "intervals apart")
        for kind in family_kinds(family):
            ours, theirs = layer[family][kind].exact_match, prior[family][kind].exact_match
            if against(ours[1:], theirs[1:]) == "below":
                refused.append(f"{family} {kind}: exact match {shown(ours)} is below the prior's {shown(theirs)} with "
                               "the intervals apart")
    return Verdict(not refused and not scale, refused, scale)


def shown(value: list[float]) -> str:
    """[mean, low, high] as the verdict quotes it: '0.71 [0.64, 0.78]'."""
    return f"{value[0]:.2f} [{value[1]:.2f}, {value[2]:.2f}]"


def commit() -> dict:
    """The code the evidence was measured with: the repo's commit and whether its tracked files had changes (None
    outside a git checkout, e.g. after pip install)."""
    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", *argv], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    changes = git("status", "--porcelain", "--untracked-files=no") if head else None
    return dict(commit=head, uncommitted_changes=None if changes is None else bool(changes))


def measure_layers(args: EvidenceConfig) -> dict[str, dict[str, dict[str, Measure]]] | int:
    """evaluate's arr:topk row for the prior and the layer on every family (resumed where --work has it) -> each
    layer's measures {"prior" or the checkpoint's name: {family: {kind: Measure}}}, or evaluate's exit code where
    one of its runs did not finish."""
    from arr_coc import evaluate

    layers = {}
    for layer, name in (("prior", PRIOR), (args.checkpoint, label(args.checkpoint))):
        layers[name] = by_family = {}
        for family in args.families:
            argv = evaluate_argv(args, layer, family)
            cli.log(f"evidence: {name} on {family} ({args.pages} pages a kind)")
            if code := evaluate.main(argv):
                return code
            by_family[family] = measured(read_records(Path(argv[argv.index("--out") + 1])), family_kinds(family))
    return layers


def main(argv=None) -> int:
    args = parse_args(argv)
    layers = measure_layers(args)
    if isinstance(layers, int):
        return layers
    name = label(args.checkpoint)
    ruling = verdict(layers[PRIOR], layers[name], args)
    evidence = dict(checkpoint=name, model=args.model, rule=asdict(RULE), row=JUDGED_ROW, pages=args.pages, size=args.size,
                    budget=args.budget, families=list(args.families), seed=args.seed, **commit(),
                    files=file_digests(args.checkpoint), versions=cli.versions(),
                    layers={layer: {family: {kind: asdict(m) for kind, m in kinds.items()}
                                    for family, kinds in by_family.items()} for layer, by_family in layers.items()},
                    verdict=asdict(ruling))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(evidence, indent=1) + "\n", encoding="utf-8")
    print(table(layers, args.families))
    print(f"{name}: {'passes' if ruling.passes else 'fails'}" + "".join(f"\n- {why}" for why in ruling.measured
                                                                        + ruling.scale))
    print(f"wrote {args.out}")
    return 0


def table(layers: dict[str, dict[str, dict[str, Measure]]], families: tuple[str, ...]) -> str:
    """Markdown: every family and kind, each layer's box recall and exact match with their 95% intervals."""
    heads = " | ".join(f"{layer}: box recall | {layer}: exact match" for layer in layers)
    lines = [f"| family | kind | items | {heads} |", "|---|---|---|" + "---|---|" * len(layers)]
    for family in families:
        for kind, m in next(iter(layers.values()))[family].items():
            cells = [f"{shown(by[family][kind].box_recall)} | {shown(by[family][kind].exact_match)}"
                     for by in layers.values()]
            lines.append(f"| {family} | {kind} | {m.items} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        cli.log("stopped; rerun the same command to resume")
        sys.exit(130)
