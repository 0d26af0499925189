"""
The Microscope's "Where the model looks" panel, less its event (handlers.looks): the teacher's heads for the loaded
VLM, the asked box of an example page, and how the teacher's map (arr_coc.distill.teacher: where the model looks when
it reads the whole native view and gives its own answer) and ARR's relevance and saccades overlap.

    heads = heads_of(model.vlm)                 # under the model's lock: chosen on CALIBRATION_PAGES at first use
    box = example_box(image, "What is the value of PAGE?", Path("assets/examples.json"))   # (x0, y0, x1, y1) or None
    numbers = overlap_of(teacher_map, relevance, saccades, box, image.size)               # an Overlap
    summary = overlap_text(numbers, heads, answer="6407")
"""

import hashlib
import json
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from arr_coc import viz
from arr_coc.distill.teacher import TeacherHeads
from arr_coc.vlm.images import open_image
from arr_coc.vlm.views import to_rgb

CALIBRATION_PAGES = 8  # synthetic pages of the trained families the heads are chosen on at first use (pocket: 37 s on
# a 2-core CPU, the same four heads as on the teacher command's 48)
CALIBRATION_SIZE = 896  # their page area, about this squared (the teacher command's default)
HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # VLM -> its TeacherHeads; written under its lock


def heads_of(vlm) -> TeacherHeads:
    """The teacher's heads for this VLM: chosen once, at first use, on CALIBRATION_PAGES synthetic pages whose answer
    boxes are known (arr_coc.distill.teacher.calibrate, as the teacher command chooses them), then kept. Call it
    holding the model's lock (ARRCOCQwen.serving): it runs the VLM and writes HEADS."""
    if vlm not in HEADS:
        from arr_coc.distill.teacher import calibrate
        from arr_coc.synth.families import TRAINED, family_pages

        pages = family_pages(TRAINED, CALIBRATION_PAGES, CALIBRATION_SIZE, 0, "calibration")
        HEADS[vlm] = calibrate(vlm, [page[1:] for page in pages])[0]
    return HEADS[vlm]


def example_box(image: Image.Image, question: str, examples: Path) -> tuple | None:
    """The asked box (x0, y0, x1, y1 px) of the example in `examples` (assets/examples.json) whose question this is
    and whose pixels these are (an upload of the same file counts); None for any other image or question."""
    pixels = None
    for example in json.loads(Path(examples).read_text()):
        if example.get("box") is None or example["question"].strip() != question.strip():
            continue
        pixels = pixels or digest(image)
        if digest(open_image(Path(examples).parent / example["image"])) == pixels:
            return tuple(example["box"])
    return None


def digest(image: Image.Image) -> str:
    """An image's size and RGB pixels' SHA-1."""
    rgb = to_rgb(image)
    return f"{rgb.size}:{hashlib.sha1(rgb.tobytes()).hexdigest()}"


@dataclass
class Overlap:
    """How the teacher's map and ARR's selection agree, both maps as distributions on ARR's candidate grid."""
    overlap: float  # the sum of the cellwise minimum of the two maps (1: the same map, 0: disjoint)
    teacher_on_saccades: float  # the teacher's mass on the cells ARR's saccades read
    saccade_share: float  # the share of ARR's K saccades among the teacher's K hottest cells
    saccades: int  # K, ARR's saccades
    uniform_on_saccades: float  # a uniform map's mass on them (K / the grid's cells): chance
    teacher_in_box: float | None = None  # the teacher's mass on the cells the asked box touches (None: no box)
    arr_in_box: float | None = None  # ARR's relevance's mass there
    uniform_in_box: float | None = None  # a uniform map's: the box's share of the cells
    teacher_peak_in_box: bool | None = None  # whether the teacher's hottest cell touches the box
    saccades_in_box: int | None = None  # ARR's saccades that touch the box


def overlap_of(teacher, relevance, saccades, box=None, image_size: tuple[int, int] | None = None) -> Overlap:
    """The Overlap of a teacher map (any grid: resampled as viz.teacher_comparison draws it), ARR's relevance
    [gh, gw] and its saccades [K, 2] (row, col), and with a pixel box of an image of image_size, the box's numbers."""
    grid = viz.as_map(relevance).shape
    t, r = viz.on_grid(teacher, grid), viz.on_grid(relevance, grid)  # [gh, gw] each, sums to 1
    cells = viz.as_cells(saccades)
    on = np.zeros(grid, dtype=bool)  # [gh, gw]: the cells ARR's saccades read
    for row, col in cells:
        on[row, col] = True
    hottest = np.argsort(-t, axis=None, kind="stable")[:len(cells)]  # the teacher's K hottest cells, flat
    shared = int(on.flatten()[hottest].sum())
    numbers = Overlap(float(np.minimum(t, r).sum()), float(t[on].sum()), shared / max(len(cells), 1), len(cells),
                      len(cells) / t.size)
    if box is None:
        return numbers
    inside = viz.box_coverage(box, image_size, grid).numpy() > 0  # [gh, gw]
    numbers.teacher_in_box, numbers.arr_in_box = float(t[inside].sum()), float(r[inside].sum())
    numbers.uniform_in_box, numbers.saccades_in_box = float(inside.mean()), int((on & inside).sum())
    numbers.teacher_peak_in_box = bool(inside.flatten()[int(np.argmax(t))])
    return numbers


def overlap_text(numbers: Overlap, heads: TeacherHeads, answer: str) -> str:
    """The panel's summary: what the teacher read, then the overlap numbers as a table (a uniform map's for chance)."""
    rows = [("overlap of the two maps (sum of the cellwise minimum)", f"{numbers.overlap:.3f}", "-"),
            ("teacher's mass on ARR's saccades", f"{numbers.teacher_on_saccades:.3f}",
             f"{numbers.uniform_on_saccades:.3f}"),
            (f"ARR's {numbers.saccades} saccades among the teacher's {numbers.saccades} hottest cells",
             f"{numbers.saccade_share:.3f}", f"{numbers.uniform_on_saccades:.3f}")]
    if numbers.teacher_in_box is not None:
        rows += [("teacher's mass in the asked box", f"{numbers.teacher_in_box:.3f}", f"{numbers.uniform_in_box:.3f}"),
                 ("ARR relevance's mass in the asked box", f"{numbers.arr_in_box:.3f}", f"{numbers.uniform_in_box:.3f}"),
                 ("teacher's hottest cell in the box", "yes" if numbers.teacher_peak_in_box else "no", "-"),
                 ("ARR's saccades touching the box", str(numbers.saccades_in_box), "-")]
    heads_text = ", ".join(f"({layer}, {head})" for layer, head in heads.heads)
    table = "\n".join(f"| {name} | {value} | {chance} |" for name, value, chance in rows)
    box = "" if numbers.teacher_in_box is not None else " This image and question are no example page's: no box."
    return (f"The teacher read the whole native view and answered **{answer!r}**; its map is the attention of that "
            f"answer's tokens to the image at heads {heads_text} (layer, head; chosen for `{heads.model}` on "
            f"{heads.pages} synthetic pages).{box}\n\n| measure | value | a uniform map |\n| --- | --- | --- |\n{table}")



NO_BOX = "oracle: no known asked box for this image and question (only the example pages have one)."
BOX_COLOUR = (0, 255, 0)  # the asked box's outline on the oracle's drawing, as viz.teacher_comparison draws it


def oracle_drawing(image: Image.Image, relevance, saccades, box, image_size: tuple[int, int]) -> Image.Image:
    """The oracle's selection as the Microscope draws ARR's (viz.heatmap_overlay, unnumbered), the asked box (x0, y0,
    x1, y1 px of an image of image_size) outlined in BOX_COLOUR, and a legend saying so."""
    out = viz.heatmap_overlay(image, relevance, saccades, numbered=0, key=False)
    sx, sy = out.width / image_size[0], out.height / image_size[1]
    ImageDraw.Draw(out).rectangle((box[0] * sx, box[1] * sy, box[2] * sx - 1, box[3] * sy - 1), outline=BOX_COLOUR,
                                  width=max(2, out.width // 300))
    return viz.with_legend(out, "oracle: the asked box (green) forced in, the rest by ARR's relevance")


def oracle_text(box_cells: int, saccades: int, found: int) -> str:
    """The oracle's line: the box's cells forced into the K saccades (its K most relevant where it holds more), and
    how many of them ARR's own selection found (box recall: found / the box's cells, as evaluate counts it)."""
    forced = (f"the asked box's {box_cells} cells forced into the {saccades} saccades" if box_cells <= saccades else
              f"the {saccades} most relevant of the asked box's {box_cells} cells forced in (the box holds more "
              "than the budget)")
    return f"oracle: {forced}; ARR found {found} of them (box recall {found / max(box_cells, 1):.2f})."
