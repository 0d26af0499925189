"""
python -m arr_coc.commands.teacher: the self-distillation teacher of issue #52 (arr_coc/distill/teacher.py) for one
model. It picks the heads on synthetic pages with boxes (layout families training draws) unless OUT already holds
them for this model, caches the targets (OUT/index.json + safetensors shards: arr_coc/distill/cache.py) of a VQA
set (--data: a hub id, parquet, or a JSONL; no boxes needed) or, without --data, of the calibration pages, and with
--heldout N measures on N pages of the held-out layout families how often the teacher's peak cell touches the asked
box and how much of its mass lies there (95% Wilson intervals; the mass's is conservative for a mean in [0, 1]).

    python -m arr_coc.commands.teacher --model models/pocket-qwen2-vl --pages 48 --out out/teacher --heldout 48
    python -m arr_coc.commands.teacher --model Qwen/Qwen2-VL-2B-Instruct --out out/docvqa --data lmms-lab/DocVQA
    # (add --config DocVQA --limit 10000): the heads from 48 pages, then DocVQA's maps
"""

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from arr_coc.commands import cli
from arr_coc.flags import bounded_int, config_parser, device_flag, flag, parse_config, seed_flag

EVAL_SEED = 10**9  # held-out pages use seeds from here on (arr_coc.pocket.heldout's), calibration far below


@dataclass
class TeacherConfig:
    """The teacher command's flags, each field one (arr_coc.flags.flag)."""
    model: str | None = cli.model_flag("pocket", "the frozen VLM whose attention teaches", "Default: pocket")
    out: str = flag(None, "the folder of the heads (teacher_heads.json) and the cached targets", cli.output_folder,
                    required=True)
    pages: int = flag(48, "calibration pages (trained layout families, boxes known) the heads are chosen on",
                      bounded_int(1, 100_000))
    heads: int = flag(4, "heads the teacher averages (the best by peak-in-box hits)", bounded_int(1, 4096))
    size: int = flag(896, "page area of the synthetic pages (about size^2 px)", bounded_int(112, 8192))
    data: str | None = flag(None, "a VQA set whose targets to cache (hub id, parquet folder or file, JSONL); default: "
                                  "the calibration pages'")
    split: str = flag("validation", "the --data set's split")
    config: str | None = flag(None, "the --data set's config (e.g. DocVQA)")
    limit: int | None = flag(None, "cache at most this many --data items", bounded_int(1, 10**9))
    heldout: int = flag(0, "also measure on this many held-out-family pages (peak in the box, mass in it)",
                        bounded_int(0, 100_000))
    max_cells: int = cli.max_cells_flag()
    device: str | None = device_flag()
    seed: int = seed_flag(0, "the calibration pages")


def heads_for(vlm, args: TeacherConfig):
    """The heads: OUT's, where they were chosen for this model with --heads of them, else chosen now (and the
    calibration pages' readings, which the default cache reuses)."""
    from arr_coc.distill.teacher import HEADS_FILE, TeacherHeads, calibrate
    from arr_coc.synth.families import TRAINED, family_pages

    saved = Path(args.out) / HEADS_FILE
    if saved.is_file():
        heads = TeacherHeads.load(args.out)
        if heads.model == vlm.name and len(heads.heads) == args.heads:
            cli.log(f"heads {heads.heads} from {saved}")
            return heads, None
    pages = family_pages(TRAINED, args.pages, args.size, args.seed, "calibration")
    heads, readings = calibrate(vlm, [p[1:] for p in pages], args.heads, args.max_cells, cli.log)
    cli.log(f"chosen heads (layer, head): {heads.heads}, peak in the box on {heads.hits} of {heads.pages} pages "
            f"-> {heads.save(args.out)}")
    return heads, [(p[0], r) for p, r in zip(pages, readings)]


def cache_targets(vlm, heads, readings, args: TeacherConfig) -> int:
    """Write the targets of --data (or of the calibration pages' readings) into OUT -> targets added."""
    from arr_coc.distill.cache import TargetWriter
    from arr_coc.distill.teacher import target_of, teach

    added = 0
    with TargetWriter(args.out, vlm.name, heads.heads) as writer:
        if args.data is None:
            for item, reading in readings or ():
                if item not in writer:
                    writer.add(target_of(reading, heads, item, vlm.name))
                    added += 1
            return added
        from arr_coc.eval.sets import open_source

        source = open_source(args.data, args.split, args.config, limit=args.limit)
        for item in source.items:
            if item.id not in writer:
                writer.add(teach(vlm, heads, item.open(), source.prompt(item), item.id, max_cells=args.max_cells))
                added += 1
                cli.log(f"cached {item.id} ({added})")
    return added


def measure(vlm, heads, args: TeacherConfig) -> dict:
    """--heldout: on held-out-family pages, the share whose teacher peak touches the asked box, the teacher's mean
    mass inside it, and the uniform map's (the box's share of the cells), each with a 95% Wilson interval."""
    from arr_coc.distill.teacher import box_mass, read, target_of
    from arr_coc.eval.intervals import interval_text, wilson
    from arr_coc.synth.families import HELD_OUT, family_pages

    peaks, masses, uniform = 0, 0.0, 0.0
    pages = family_pages(HELD_OUT, args.heldout, args.size, EVAL_SEED, "heldout")
    for i, (item, image, question, _, box) in enumerate(pages):
        reading = read(vlm, image, question, heads.layers, None, args.max_cells, box)
        grid_map = target_of(reading, heads, item, vlm.name).map.flatten()  # [n]
        peaks += int(reading.inside[grid_map.argmax()])
        masses += float(box_mass(grid_map, reading.inside))
        uniform += float(reading.inside.float().mean())
        cli.log(f"held-out page {i + 1}/{len(pages)} {item}: peak in box {peaks}, answered {reading.answer!r}")
    n = len(pages)
    result = dict(model=vlm.name, heads=heads.heads, families=list(HELD_OUT), size=args.size, n=n,
                  peak_in_box=[peaks, n, *wilson(peaks, n)], mass_in_box=[masses / n, *wilson(masses, n)],
                  uniform_mass_in_box=[uniform / n, *wilson(uniform, n)])
    print(f"held-out families {', '.join(HELD_OUT)} at {args.size}^2, {vlm.name}, heads {heads.heads}:")
    print(f"  teacher peak inside the asked box: {interval_text(peaks, n)}")
    print(f"  teacher mass inside the asked box: {interval_text(masses, n)} (a uniform map: {interval_text(uniform, n)})")
    return result


def main(argv=None) -> int:
    args = parse_config(TeacherConfig, argv, config_parser(TeacherConfig, __doc__))
    from arr_coc.errors import InputError

    try:
        vlm = cli.load_vlm(args.model, args.device).vlm
        heads, readings = heads_for(vlm, args)
        cli.log(f"{cache_targets(vlm, heads, readings, args)} targets added to {args.out}")
        if args.heldout:
            result = measure(vlm, heads, args)
            (Path(args.out) / "heldout.json").write_text(json.dumps(result, indent=1))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(heads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
