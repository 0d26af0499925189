"""
Regenerate the synthetic example images in assets/ and refresh their entries in assets/examples.json.
Entries for other images (the photographs) are kept.

- the square scenes: arr_coc.eval.data.make_scene at fixed seeds (896 px, the old high-res view);
- three pages of the fine-print suite (arr_coc.synth.fineprint.make_page, 896 px), one per kind: the scenes the
  offline pocket model was trained on, with their first question;
- two high-resolution scenes drawn here, whose answer needs the native-resolution candidates
  (docs/ARCHITECTURE.md §1): a 1700x2200 invoice page in 12 px print, and a 2400x900 street with a small green sign.
  At the gestalt view's scale their print is under 4 px high (tests/test_assets.py checks it).

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

from PIL import Image, ImageDraw  # noqa: E402

from arr_coc.eval.data import WORDS, Sample, _clip_box, _font, _rng, make_scene  # noqa: E402
from arr_coc.synth.fineprint import make_page  # noqa: E402


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


POCKET_NOTE = ("Fine-print suite page (arr_coc.synth.fineprint, held-out seed), the kind of scene the offline pocket "
               "model was trained on: its answers are real here and meaningless on the photographs. Picked as the "
               "first held-out seed from 10**9 + 1 on that the shipped pocket model answers right through both full "
               "and ARR (pocket-fineprint); the README's Accuracy section gives how often it does. ")
FINEPRINT = [  # SyntheticExample's kind is a fine-print kind here, drawn by make_page
    SyntheticExample("pocket_fine_print.png", "fine_print", 10**9 + 1, 896,  # the 1st seed tried (steps 47213 and 52777)
                     POCKET_NOTE + "8-32 fields in 10-17 px print; the gestalt cannot read them."),
    SyntheticExample("pocket_box_word.png", "box_word", 10**9 + 1, 896,  # the 1st (step 46408 needed the 2nd)
                     POCKET_NOTE + "A small word in each coloured box; the colour is visible at any scale, the word "
                                   "only at native resolution."),
    SyntheticExample("pocket_shape_colour.png", "shape_colour", 10**9 + 1, 896,  # the 1st
                     POCKET_NOTE + "Large shapes: a question the gestalt alone can answer."),
]


# ----------------------------------------------------------------------------- high-resolution scenes

PAGE_SIZE = (1700, 2200)  # a letter page at 200 dpi
PRINT_PX = 12  # the page's small print (body, table, the asked facts): ~2.7 px at the 14x18-token gestalt
STREET_SIZE = (2400, 900)  # a wide street panorama
SIGN_TEXT_PX = 12  # the street sign's lettering: ~3.7 px at the 10x25-token gestalt
SIGN_NAMES = ("MAPLE AVE", "CEDAR ST", "HARBOR RD", "ORCHARD LN", "BIRCH WAY", "QUARRY RD")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


def text_at(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, px: int, fill=(0, 0, 0)):
    """Draw text with its top-left at xy; return its ink box."""
    font = _font(px)
    draw.text(xy, text, font=font, fill=fill)
    return draw.textbbox(xy, text, font=font)


def union(*boxes) -> tuple[int, int, int, int]:
    return min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)


def filler(rng, draw, width: int, px: int) -> str:
    """A line of filler words at most `width` px wide."""
    tokens = []
    while draw.textlength(" ".join(tokens + ["harvest"]), font=_font(px)) < width:
        tokens.append(rng.choice(WORDS))
    return " ".join(tokens).capitalize()


def invoice_page(seed: int) -> list[Sample]:
    """
    A letter-size invoice at 200 dpi: a large letterhead (what a gestalt sees), then 12 px print: the
    invoice number and due date among other numbers (order no., customer no., issue date), an item table and
    terms. Two questions, one per small-print fact.
    """
    rng, (W, H) = _rng("invoice_page", seed), PAGE_SIZE
    image = Image.new("RGB", PAGE_SIZE, "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, W, 150), fill=(28, 62, 120))  # letterhead band
    text_at(draw, (110, 42), "NORTHWIND SUPPLY CO.", 56, (255, 255, 255))
    text_at(draw, (1250, 210), "INVOICE", 72, (28, 62, 120))
    number = f"INV-{rng.randint(10000, 99999)}-{rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}"
    day, month = rng.randint(1, 28), rng.choice(MONTHS)
    due = f"{rng.randint(1, 28)} {rng.choice(MONTHS)} 2025"
    left, top, pitch = 1250, 320, 22
    facts = [("Order no.", f"PO-{rng.randint(100000, 999999)}"), ("Invoice no.", number),
             ("Customer no.", f"C-{rng.randint(1000, 9999)}"), ("Issued", f"{day} {month} 2025"), ("Due date", due)]
    boxes = {}
    for i, (label, value) in enumerate(facts):
        y = top + i * pitch
        boxes[label] = union(text_at(draw, (left, y), f"{label}:", PRINT_PX),
                             text_at(draw, (left + 110, y), value, PRINT_PX))
    for i, line in enumerate(("Bill to:", "Meadow Lane Workshop", f"{rng.randint(10, 999)} River Road",
                              "Portsmouth PO1 2AB", "United Kingdom")):
        text_at(draw, (110, 320 + i * pitch), line, PRINT_PX)
    y = 520  # the item table
    draw.line((110, y - 8, W - 110, y - 8), fill=(120, 120, 120), width=1)
    for col, head in zip((110, 900, 1150, 1400), ("Description", "Qty", "Unit price", "Amount")):
        text_at(draw, (col, y), head, PRINT_PX)
    for row in range(28):
        y += 26
        qty, price = rng.randint(1, 40), rng.randint(2, 900)
        for col, cell in zip((110, 900, 1150, 1400), (filler(rng, draw, 600, PRINT_PX), str(qty), f"{price}.00",
                                                       f"{qty * price}.00")):
            text_at(draw, (col, y), cell, PRINT_PX)
    y += 60
    text_at(draw, (110, y), "Terms and conditions", 20)
    for _ in range(40):  # paragraphs of small print: everywhere detail, so detail alone does not find the facts
        y += 22
        text_at(draw, (110, y), filler(rng, draw, rng.uniform(0.7, 1.0) * (W - 220), PRINT_PX), PRINT_PX)
    text_at(draw, (110, H - 90), "Thank you for your business.", 28, (28, 62, 120))
    return [Sample(image, "What is the invoice number?", number, _clip_box(boxes["Invoice no."], W, H), "invoice_page"),
            Sample(image, "What is the due date of this invoice?", due, _clip_box(boxes["Due date"], W, H),
                   "invoice_page")]


def street_scene(seed: int) -> list[Sample]:
    """
    A wide street: sky, hills, buildings with windows, trees, a big red SALE billboard (salient, readable even
    in the gestalt) and a small green street sign (4% of the width) in 12 px capitals, which the question asks.
    """
    rng, (W, H) = _rng("street_scene", seed), STREET_SIZE
    image = Image.new("RGB", STREET_SIZE)
    draw = ImageDraw.Draw(image)
    for y in range(560):  # sky: a vertical gradient (one colour per row compresses well)
        t = y / 560
        draw.line((0, y, W, y), fill=(round(90 + 110 * t), round(150 + 70 * t), round(230 + 20 * t)))
    hills = [(0, 560)] + [(x, 560 - rng.randint(60, 200)) for x in range(0, W + 200, 200)] + [(W, 560)]
    draw.polygon(hills, fill=(96, 140, 92))
    draw.rectangle((0, 560, W, 700), fill=(170, 170, 160))  # pavement
    draw.rectangle((0, 700, W, H), fill=(70, 70, 75))  # road
    for x in range(0, W, 160):
        draw.rectangle((x, 795, x + 80, 805), fill=(240, 240, 240))
    x = 40
    while x < W - 200:  # a row of buildings with lit and dark windows
        w, h = rng.randint(180, 320), rng.randint(220, 420)
        colour = rng.choice([(180, 120, 90), (200, 190, 170), (150, 150, 160), (210, 170, 120), (120, 100, 90)])
        draw.rectangle((x, 560 - h, x + w, 560), fill=colour)
        for wy in range(560 - h + 25, 540, 45):
            for wx in range(x + 18, x + w - 30, 40):
                draw.rectangle((wx, wy, wx + 20, wy + 26), fill=rng.choice([(60, 70, 90), (250, 230, 150)]))
        x += w + rng.randint(40, 140)
    sx, sy = 1690, 548  # where the sign stands, on a thin pole at the kerb
    for tx in rng.sample([x for x in range(100, W - 100, 60) if abs(x - sx - 46) > 140], 9):  # trees, not at the sign
        draw.rectangle((tx - 6, 600, tx + 6, 660), fill=(90, 60, 40))
        draw.ellipse((tx - 45, 520, tx + 45, 610), fill=(50, 110, 55))
    draw.rectangle((420, 240, 820, 440), fill=(220, 30, 40))  # the salient distractor: a big billboard
    draw.rectangle((610, 440, 630, 600), fill=(80, 80, 80))
    text_at(draw, (470, 270), "SALE", 120, (255, 255, 255))
    name = rng.choice(SIGN_NAMES)
    draw.rectangle((sx + 44, sy + 20, sx + 48, 700), fill=(110, 110, 110))
    draw.rectangle((sx, sy, sx + 96, sy + 24), fill=(20, 110, 60), outline=(255, 255, 255))
    font = _font(SIGN_TEXT_PX)
    inset = (96 - draw.textlength(name, font=font)) / 2
    box = _clip_box(text_at(draw, (round(sx + inset), sy + 6), name, SIGN_TEXT_PX, (255, 255, 255)), W, H)
    assert sx < box[0] and box[2] < sx + 96, "the street name must fit on the sign"
    return [Sample(image, "What street name is written on the small green sign?", name.title(), box, "street_scene")]


@dataclass
class HighResExample:
    file: str  # file name inside assets/
    draw: object  # seed -> list[Sample] over one image
    seed: int
    note: str  # what the example shows, for examples.json (one per sample)
    colours: int  # PNG palette size: few colours keep the file small, enough keep the text's anti-aliasing


HIGHRES = [
    HighResExample("synth_invoice_page.png", invoice_page, 0,
                   "Synthetic high-resolution page (1700x2200, 200 dpi letter) in 12 px print: the letterhead is all a "
                   "gestalt can read (the print is under 3 px there); the fact sits among other numbers.", 64),
    HighResExample("synth_street_sign.png", street_scene, 0,
                   "Synthetic wide street (2400x900): a small green sign (96 px, 4% of the width) in 12 px capitals "
                   "beside a big red SALE billboard that saliency prefers; the gestalt sees a green blob.", 256),
]


def main() -> None:
    parser = argparse.ArgumentParser(description="Regenerate the synthetic example images in assets/.")
    parser.add_argument("--out", type=Path, default=ASSETS, help="folder to write images (and examples.json) into")
    parser.add_argument("--no-json", action="store_true", help="write the images only; leave examples.json alone")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    pages, entries, written = [], [], set()  # pages: the pocket model's, the app's first examples
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

    for ex in FINEPRINT:
        page = make_page(ex.kind, ex.seed, ex.size)
        page.image.save(args.out / ex.file, optimize=True)
        written.add(ex.file)
        print(f"wrote {args.out / ex.file} ({ex.kind} page, seed {ex.seed}, {ex.size}px)")
        q = page.questions[0]
        pages.append({"image": ex.file, "question": q.question, "box": list(q.box),
                      "note": f"{ex.note} Expected answer: {q.answer}."})

    for ex in HIGHRES:
        samples = ex.draw(ex.seed)
        image = samples[0].image.quantize(ex.colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).convert("RGB")
        image.save(args.out / ex.file, optimize=True)
        written.add(ex.file)
        print(f"wrote {args.out / ex.file} ({samples[0].kind}, seed {ex.seed}, {image.width}x{image.height})")
        entries += [{"image": ex.file, "question": sample.question, "box": list(sample.box),
                     "note": f"{ex.note} Expected answer: {sample.answer}."} for sample in samples]

    if not args.no_json:
        path = args.out / "examples.json"
        kept = json.loads(path.read_text()) if path.exists() else []
        kept = [e for e in kept if e.get("image") not in written]
        text = json.dumps(pages + kept + entries, indent=2, ensure_ascii=False)
        text = re.sub(r"\[\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\s*\]", r"[\1, \2, \3, \4]", text)  # boxes on one line
        path.write_text(text + "\n")
        print(f"updated {path}: {len(kept)} other entries kept, {len(pages + entries)} synthetic entries written")


if __name__ == "__main__":
    main()
