"""
Regenerate the synthetic example images in assets/ with arr_coc.data.make_scene (fixed seeds) and
refresh their entries in assets/examples.json. Entries for other images (the photographs) are kept.

The text_vs_distractor image is listed twice in examples.json, once per question (the text, then the
bright shape): the same pixels with two queries, so ARR's relevance map should move with the question.

Run from the repository root:
    python assets/make_synthetic.py                 # writes assets/synth_*.png and updates assets/examples.json
    python assets/make_synthetic.py --no-json       # images only
"""

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ASSETS = Path(__file__).resolve().parent
sys.path.insert(0, str(ASSETS.parent))  # so `python assets/make_synthetic.py` finds the arr_coc package

from arr_coc.data import make_scene  # noqa: E402


@dataclass
class SyntheticExample:
    file: str  # file name inside assets/
    kind: str  # make_scene kind that draws it
    seed: int  # make_scene seed (fixed, so the file is reproducible)
    size: int  # image side in pixels
    note: str  # what the example shows, for examples.json


EXAMPLES = [
    SyntheticExample("synth_text_distractor.png", "text_vs_distractor", 5, 896,
                     "Synthetic: faint gray text (18 gray levels below the field) next to a bright saturated "
                     "shape. Saliency alone picks the shape; the query asks for the text."),
    SyntheticExample("synth_text_distractor.png", "distractor_query", 5, 896,
                     "Synthetic: the same image as above with the other question, so the target is now the "
                     "bright shape. Compare the two relevance maps."),
    SyntheticExample("synth_noise.png", "noise", 0, 320,
                     "Synthetic: uniform RGB noise, a semantic void with no target; relevance should be flat "
                     "and the allocator may fall back to grid. Stored at 320 px because noise does not compress."),
    SyntheticExample("synth_chart.png", "chart", 2, 896,
                     "Synthetic: matplotlib bar chart; the box is the asked bar and its value label."),
    SyntheticExample("synth_document.png", "document", 1, 896,
                     "Synthetic: dense page of small text with one 'Invoice total' line and an 'Invoice no.' "
                     "decoy; the box is the total's line."),
]


def main() -> None:
    parser = argparse.ArgumentParser(description="Regenerate the synthetic example images in assets/.")
    parser.add_argument("--out", type=Path, default=ASSETS, help="folder to write images (and examples.json) into")
    parser.add_argument("--no-json", action="store_true", help="write the images only; leave examples.json alone")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    entries, written = [], set()
    for ex in EXAMPLES:
        sample = make_scene(ex.kind, ex.seed, ex.size)
        if ex.file not in written:
            sample.image.save(args.out / ex.file, optimize=True)
            written.add(ex.file)
            print(f"wrote {args.out / ex.file} ({ex.kind}, seed {ex.seed}, {ex.size}px)")
        entries.append({
            "image": ex.file,
            "question": sample.question,
            "box": None if sample.box is None else list(sample.box),
            "note": f"{ex.note} Expected answer: {sample.answer}.",
        })

    if not args.no_json:
        path = args.out / "examples.json"
        kept = json.loads(path.read_text()) if path.exists() else []
        kept = [e for e in kept if e.get("image") not in written]
        text = json.dumps(kept + entries, indent=2, ensure_ascii=False)
        text = re.sub(r"\[\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\s*\]", r"[\1, \2, \3, \4]", text)  # boxes on one line
        path.write_text(text + "\n")
        print(f"updated {path}: {len(kept)} other entries kept, {len(entries)} synthetic entries written")


if __name__ == "__main__":
    main()
