"""
The teacher of issue #52: where the frozen VLM looks when it reads the whole image and gives its answer.

One item (any image and question; no box needed): the `full` native view is encoded, the model's own greedy answer
(or a given one) is teacher-forced, and VLM.answer_attention reads, at a few chosen heads, the attention of the
rows that predict the answer's tokens to every image token. The map (`teacher_map`) is built in four steps:

1. per head, the mean over the answer's rows: [n] (SD-RPN averages over the answer's tokens too);
2. attention sinks dropped: an image token whose hidden state entering the layer has a norm over SINK_RATIO times
   the median image token's (a massive activation, Sun et al. 2024; the sink tokens of VLMs, Kang et al. 2025) gets
   0. SD-RPN reads sinks from extra heads; this rule needs none and drops nothing on the pocket model (its largest
   ratio is 2.5);
3. the chosen heads averaged, laid out on the native cell grid (one merged token = one cell, raster order: [gh, gw]);
4. a small blur (the binomial [1, 2, 1] / 4 along rows and columns, zero-padded), then normalised to sum 1 (a map with
   no mass left is uniform).

The heads are chosen once per model (`calibrate`) on synthetic pages whose answer boxes are known: every head of
every layer is read, a head scores a hit on a page when the peak cell of its own map (steps 1-2) touches the asked
box, and the K heads with the most hits win (ties: more mean map mass inside the box, then lower layer, lower head;
`choose_heads`). They are saved beside the checkpoint or cache as HEADS_FILE (`TeacherHeads`).

    heads, readings = calibrate(vlm, pages)                       # pages: [(image, question, answer, box)]
    heads.save(folder)                                            # teacher_heads.json
    target = teach(vlm, TeacherHeads.load(folder), image, "What is the value of TOTAL?")   # a cache.Target
    python -m arr_coc.commands.teacher --model models/pocket-qwen2-vl --pages 48 --out out/teacher
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from arr_coc.distill.cache import Target
from arr_coc.vlm.base import SINK_RATIO, VLM, AnswerAttention
from arr_coc.vlm.views import make_views

HEADS_FILE = "teacher_heads.json"  # the chosen heads, beside a checkpoint or a cache of targets
BLUR = (0.25, 0.5, 0.25)  # the separable blur of step 4, along rows then columns
DEFAULT_HEADS = 4  # heads the teacher averages (SD-RPN picks 3-4 on LLaVA-1.5 and Qwen2.5-VL)
MAX_ANSWER_TOKENS = 16  # the model's own answer, when none is given, is at most this long


@dataclass
class TeacherHeads:
    """The heads a model's teacher reads, chosen once on pages with boxes; saved as HEADS_FILE."""
    model: str  # the VLM they were chosen for (its name as loaded)
    heads: list[tuple[int, int]]  # (layer, head), best first
    hits: list[int]  # each chosen head's pages with its peak inside the asked box
    pages: int  # calibration pages read
    sink_ratio: float = SINK_RATIO  # the sink rule they were scored under

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / HEADS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def load(cls, folder: str | Path) -> "TeacherHeads":
        data = json.loads((Path(folder) / HEADS_FILE).read_text())
        return cls(data["model"], [tuple(h) for h in data["heads"]], data["hits"], data["pages"], data["sink_ratio"])

    @property
    def layers(self) -> list[int]:
        """The layers the chosen heads sit in, ascending: all the teacher reads."""
        return sorted({layer for layer, _ in self.heads})


@dataclass
class Reading:
    """What the teacher read of one item: every read head's map, before the heads are chosen."""
    maps: torch.Tensor  # [len(layers), H, n] per head: mean over the answer's rows, sinks zeroed (steps 1-2)
    layers: tuple[int, ...]  # the layers read
    grid: tuple[int, int]  # (gh, gw) the native view's cells: n = gh * gw
    answer: str  # the answer that was teacher-forced
    inside: torch.Tensor | None = None  # [n] bool: the cells the asked box touches, where the item has a box


def pooled(maps: torch.Tensor, layers: tuple[int, ...], heads: list[tuple[int, int]],
           grid: tuple[int, int]) -> torch.Tensor:
    """Steps 3-4: the heads' maps [len(layers), H, n] averaged, on the grid, blurred, normalised -> [gh, gw]."""
    chosen = torch.stack([maps[layers.index(layer), head] for layer, head in heads]).mean(0)  # [n]
    cells = chosen.view(1, 1, *grid)  # [1, 1, gh, gw]: one merged token = one cell, raster order
    kernel = torch.tensor(BLUR, dtype=cells.dtype, device=cells.device)
    cells = F.conv2d(cells, kernel.view(1, 1, 3, 1), padding=(1, 0))  # along the rows
    cells = F.conv2d(cells, kernel.view(1, 1, 1, 3), padding=(0, 1))[0, 0]  # along the columns
    total = cells.sum()
    return cells / total if total > 0 else torch.full_like(cells, 1.0 / cells.numel())


def teacher_map(attention: AnswerAttention, heads: list[tuple[int, int]], grid: tuple[int, int],
                ratio: float = SINK_RATIO) -> torch.Tensor:
    """The teacher's map of one item from its answer attention: steps 1-4 -> [gh, gw] float32, sums to 1."""
    return pooled(attention.head_maps(ratio), attention.layers, heads, grid)


def read(vlm: VLM, image, question: str, layers: list[int], answer: str | None = None,
         max_cells: int | None = None, box=None) -> Reading:
    """Encode the image's native view, teacher-force `answer` (None: the model's own greedy answer), read the heads
    of `layers` (steps 1-2) -> Reading; with a pixel box (x0, y0, x1, y1), the cells it touches."""
    views = make_views(image, device=vlm.device, cell=vlm.cell, min_pixels=vlm.min_pixels,
                       **({} if max_cells is None else {"max_cells": max_cells}))
    with torch.no_grad():
        tokens = vlm.encode_view(views.tensor("native"))  # [n, D]
        if answer is None:
            answer = vlm.decode(vlm.generate(vlm.prompt(question, [tokens]), MAX_ANSWER_TOKENS).ids)
        attention = vlm.answer_attention(vlm.prompt(question, [tokens], answer=answer), layers)
    inside = None if box is None else views.box_coverage(box, views.native_grid).flatten() > 0  # [n]
    return Reading(attention.head_maps().cpu(), attention.layers, tuple(tokens.grid), answer, inside)


def teach(vlm: VLM, heads: TeacherHeads, image, question: str, item: str = "", answer: str | None = None,
          max_cells: int | None = None) -> Target:
    """One item's target: the chosen heads' map on the native grid (only their layers read)."""
    reading = read(vlm, image, question, heads.layers, answer, max_cells)
    return target_of(reading, heads, item, vlm.name)


def target_of(reading: Reading, heads: TeacherHeads, item: str, model: str) -> Target:
    """A Reading (of the chosen heads' layers, or of every layer) as the cache's Target."""
    grid_map = pooled(reading.maps, reading.layers, heads.heads, reading.grid)
    return Target(item, reading.grid, grid_map.float(), model, tuple(heads.heads), reading.answer)


def peak_hits(maps: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """Whether each head's peak cell touches the box: maps [L, H, n], inside [n] bool -> [L, H] bool."""
    return inside[maps.argmax(dim=-1)]


def box_mass(maps: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """Each map's share of its mass on the box's cells: maps [..., n], inside [n] bool -> [...]."""
    return (maps * inside).sum(-1) / maps.sum(-1).clamp(min=1e-12)


def choose_heads(hits: torch.Tensor, mass: torch.Tensor, k: int = DEFAULT_HEADS) -> list[tuple[int, int]]:
    """The k heads whose peak lies inside the asked box on most pages: hits [P, L, H] bool, mass [P, L, H] (ties:
    more mean mass inside the box, then lower layer, then lower head) -> [(layer, head)] best first."""
    count, mean = hits.sum(0), mass.mean(0)  # [L, H] each
    L, H = count.shape
    order = sorted(((l, h) for l in range(L) for h in range(H)),
                   key=lambda lh: (-int(count[lh]), -float(mean[lh]), lh[0], lh[1]))
    return order[:k]


def calibrate(vlm: VLM, pages: list[tuple], k: int = DEFAULT_HEADS, max_cells: int | None = None,
              log=lambda message: None) -> tuple[TeacherHeads, list[Reading]]:
    """Read every head of every layer on pages [(image, question, answer, box)] (the model's own answers forced),
    choose the k best -> (TeacherHeads, each page's Reading)."""
    readings = []
    for i, (image, question, _, box) in enumerate(pages):
        readings.append(read(vlm, image, question, list(range(vlm.num_layers)), None, max_cells, box))
        log(f"calibration page {i + 1}/{len(pages)}: answered {readings[-1].answer!r}")
    return chosen_heads(readings, vlm.name, k), readings


def chosen_heads(readings: list[Reading], model: str, k: int = DEFAULT_HEADS) -> TeacherHeads:
    """The k heads of readings of every layer (each with its box's cells) whose peak touches the box most often."""
    hits = torch.stack([peak_hits(r.maps, r.inside) for r in readings])  # [P, L, H]
    mass = torch.stack([box_mass(r.maps, r.inside) for r in readings])  # [P, L, H]
    heads = choose_heads(hits, mass, k)
    count = hits.sum(0)  # [L, H]
    return TeacherHeads(model, heads, [int(count[head]) for head in heads], len(readings))
