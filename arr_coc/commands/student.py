"""
python -m arr_coc.commands.student: how much of the teacher's map and of the asked box ARR's saccades hold (issue
#52), for several ARR layers on one set whose teacher maps are cached (python -m arr_coc.commands.teacher --data).

Each item is observed once (the frozen VLM's part: gestalt, the prior pass and its states, textures); every layer
then scores it and selects --top saccades (topk, as ARR serves them). Per layer: the teacher's mass inside them
(teacher_top) and, on items with a box, the share of the box's cells among them (box recall), each a mean over the
items with its 95% Wilson interval (conservative for a mean of values in [0, 1]), and on how many items each layer
beats the first one listed (paired). 'teacher' in --layers is the teacher map's own top cells: the ceiling.

    python -m arr_coc.commands.student --model pocket --data data/heldout --distill runs/teacher-heldout \
        --layers prior,pocket-fineprint,runs/distilled --top 64 --out runs/student.json
"""

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from arr_coc.commands import cli
from arr_coc.flags import bounded_int, config_parser, device_flag, flag, parse_config


@dataclass
class StudentConfig:
    """The student check's flags, each field one (arr_coc.flags.flag)."""
    model: str | None = cli.model_flag("pocket", "the frozen VLM the layers were trained for", "Default: pocket")
    data: str = flag(None, "the set (a JSONL folder, parquet or hub id) whose teacher maps --distill holds",
                     required=True)
    distill: str = flag(None, "the teacher's cached maps of --data (python -m arr_coc.commands.teacher --data)",
                        required=True)
    layers: str = flag("prior", "ARR layers to compare, comma-separated: checkpoint names, folders, 'prior', or "
                                "'teacher' (the teacher map's own top cells: the ceiling); the first is the one the "
                                "others are paired against")
    top: int = flag(64, "saccades each layer selects (topk)", bounded_int(1, 65536))
    split: str = flag("validation", "the --data set's split")
    limit: int | None = flag(None, "read at most this many items", bounded_int(1, 10**9))
    out: str | None = flag(None, "also write the results here as JSON")
    device: str | None = device_flag()


@dataclass
class LayerResult:
    """One layer's numbers over the items."""
    layer: str  # as named in --layers
    n: int  # items with a teacher's map
    teacher_top: list[float]  # [mean, low, high]: the teacher's mass inside the selected cells
    boxed: int  # items with a box
    box_recall: list[float]  # [mean, low, high]: the share of the box's cells selected
    beats_first: list[int]  # [teacher_top wins, box recall wins, items] against the first layer, item by item


def observed_items(model, args: StudentConfig) -> list[tuple]:
    """Every item with a teacher's map, observed once -> [(observation, target [GH, GW], box coverage or None)]."""
    from arr_coc.distill.cache import TargetCache
    from arr_coc.distill.student import on_grid
    from arr_coc.eval.sets import open_source
    from arr_coc.pipelines import arr_scene

    cache, source, items = TargetCache(args.distill), open_source(args.data, args.split, limit=args.limit), []
    for item in source.items:
        if item.id in cache:
            o = arr_scene.observe(model.parts, model.views(item.open()), model.check_question(source.prompt(item)))
            grid = o.views.candidate_grid
            coverage = None if item.box is None else o.views.box_coverage(item.box)  # [GH, GW]
            items.append((o, on_grid(cache[item.id].map, grid), coverage))
            cli.log(f"observed {len(items)}: {item.id}")
    return items


def per_item(model, layer, items: list[tuple], top: int) -> list[tuple[float, float | None]]:
    """A layer's (teacher mass in its `top` saccades, box recall or None) on each observed item; layer None: the
    teacher map's own `top` cells."""
    import torch

    from arr_coc.distill.student import mass_at
    from arr_coc.eval.metrics import box_recall_precision
    from arr_coc.pipelines import arr_scene

    rows = []
    with torch.no_grad():
        for o, target, coverage in items:
            if layer is None:  # the teacher's own top cells
                cells = target.flatten().topk(min(top, target.numel())).indices
            else:
                maps = arr_scene.score(o, layer.graphed_score)
                cells = arr_scene.select(layer, maps, o.views.candidate_grid, len(o.gestalt), top).indices[0].cpu()
            rows.append((mass_at(target, cells), None if coverage is None else box_recall_precision(coverage, cells)[0]))
    return rows


def summary(name: str, rows: list, first: list) -> LayerResult:
    from arr_coc.eval.intervals import wilson

    mass = [m for m, _ in rows]
    recall = [r for _, r in rows if r is not None]
    wins = [sum(a[i] is not None and a[i] > b[i] for a, b in zip(rows, first)) for i in (0, 1)]
    return LayerResult(name, len(mass), [sum(mass) / max(len(mass), 1), *wilson(sum(mass), len(mass))],
                       len(recall), [sum(recall) / max(len(recall), 1), *wilson(sum(recall), len(recall))],
                       [*wins, len(rows)])


def main(argv=None) -> int:
    args = parse_config(StudentConfig, argv, config_parser(StudentConfig, __doc__))
    from arr_coc.errors import InputError
    from arr_coc.relevance.layer import CheckpointError, choose_checkpoint

    try:
        model = cli.load_vlm(args.model, args.device)
        items = observed_items(model, args)
        results, first = [], None
        for name in [n.strip() for n in args.layers.split(",") if n.strip()]:
            folder = None if name == "teacher" else choose_checkpoint(name, model.vlm.family, model.vlm.hidden_size)
            layer = None if name == "teacher" else model.load_layer(folder) if folder else model.prior_layer()
            rows = per_item(model, layer, items, args.top)
            first = first or rows
            results.append(summary(name, rows, first))
            r = results[-1]
            print(f"{name}: teacher mass in top-{args.top} {r.teacher_top[0]:.3f} [{r.teacher_top[1]:.3f}, "
                  f"{r.teacher_top[2]:.3f}] (n={r.n}); box recall {r.box_recall[0]:.3f} [{r.box_recall[1]:.3f}, "
                  f"{r.box_recall[2]:.3f}] (n={r.boxed}); beats the first on {r.beats_first[0]} / "
                  f"{r.beats_first[1]} of {r.beats_first[2]}")
    except (InputError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(json.dumps(dict(config=asdict(args), results=[asdict(r) for r in results]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
