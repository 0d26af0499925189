"""
The prior's calibration (issue 61, part 2): which layer, heads and query rows of the question->gestalt attention the
prior pass reads (arr_coc.vlm.readout.PriorReadout), chosen once per model on synthetic pages whose asked boxes are
known, as the teacher's heads are (arr_coc.distill.teacher): each page's gestalt is encoded and every query row's
attention to it is read per head at every layer (VLM.prior_rows), for the question and for ViCrop's generic question;
each candidate readout's map is laid on the candidate grid as the pipeline lays the prior (upsample_map), and it
scores the share of the box's cells among its `budget` top cells (box recall). The candidates: every layer x every
row rule (ROWS) x plain or relative x one head, every head, or the 2-4 best single heads of that layer and rule. The
best mean recall wins (ties: the lower layer, plain before relative, then the order tried); it must beat DEFAULT
(today's readout) on those pages, or DEFAULT stays.

    readings = [read_prior(vlm, image, question, box) for _, image, question, _, box in pages]
    readout = choose_readout(readings, vlm.name, budget=64)        # PriorReadout, its scores and DEFAULT's
    readout.save(prior_file("models/pocket-qwen2-vl"))
    python -m arr_coc.commands.prior --model pocket --pages 96
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from arr_coc.relevance.prior import upsample_map
from arr_coc.vlm.base import VLM
from arr_coc.vlm.readout import (DEFAULT, GENERIC_QUESTION, ROWS, PriorReadout, head_weights, prior_index,
                                 relative_attention, row_weights)
from arr_coc.vlm.views import make_views

SEVERAL = (2, 3, 4)  # "several heads": the k best single heads of a layer and row rule, for each k below H
RECALL_CELLS = 64  # top cells a readout's box recall counts (the default rule's saccades)


@dataclass
class PriorReading:
    """What the calibration read of one page: every query row's attention per head at every layer."""
    question: torch.Tensor  # [layers, H, R, Ng] the question's query rows (after the image) to the gestalt tokens
    question_tokens: int  # the question's own tokens: the first of the R rows (the chat template's tail follows)
    generic: torch.Tensor  # [layers, H, Rg, Ng] the same for GENERIC_QUESTION
    generic_tokens: int  # GENERIC_QUESTION's own tokens among the Rg rows
    gestalt_grid: tuple[int, int]  # (gh, gw): Ng = gh * gw
    candidate_grid: tuple[int, int]  # (GH, GW) the cells a prior ranks
    inside: torch.Tensor  # [GH * GW] bool: the candidate cells the asked box touches


def read_prior(vlm: VLM, image, question: str, box, max_cells: int | None = None) -> PriorReading:
    """Encode the page's gestalt as the pipeline does and read every head, row and layer (question and generic)."""
    views = make_views(image, device=vlm.device, cell=vlm.cell, min_pixels=vlm.min_pixels,
                       **({} if max_cells is None else {"max_cells": max_cells}))
    layers = list(range(vlm.num_layers))
    with torch.no_grad():
        gestalt = vlm.encode_view(views.tensor("gestalt"))  # [Ng, D]
        asked, tokens = vlm.prior_rows(question, gestalt, layers)
        generic, generic_tokens = vlm.prior_rows(GENERIC_QUESTION, gestalt, layers)
    inside = views.box_coverage(box).flatten() > 0  # [GH * GW]
    return PriorReading(asked.float().cpu(), tokens, generic.float().cpu(), generic_tokens,
                        tuple(views.gestalt_grid), tuple(views.candidate_grid), inside)


def head_maps(attention: torch.Tensor, tokens: int, rows: str) -> torch.Tensor:
    """[layers, H, R, Ng] -> [layers, H, Ng]: each head's map over the row rule's rows (readout.row_weights, the
    prior pass's own weights, on the R rows after the image)."""
    weights = row_weights(rows, 0, tokens, attention.shape[2])  # [R]
    return torch.einsum("r,lhrn->lhn", weights, attention)


def readout_map(reading: PriorReading, readout: PriorReadout, layer_fraction: float = 0.5) -> torch.Tensor:
    """The prior a readout gives on one page -> [Ng], as the prior pass computes it (weights, then relative)."""
    index = prior_index(readout, layer_fraction, reading.question.shape[0])
    heads = head_weights(readout.heads, reading.question.shape[1])  # [H]
    asked = heads @ head_maps(reading.question, reading.question_tokens, readout.rows)[index]  # [Ng]
    if not readout.relative:
        return asked
    generic = heads @ head_maps(reading.generic, reading.generic_tokens, readout.rows)[index]  # [Ng]
    return relative_attention(asked, generic)


def top_recall(values: torch.Tensor, reading: PriorReading, budget: int = RECALL_CELLS) -> float:
    """The share of the box's cells among the `budget` top candidate cells of a gestalt map [Ng] (upsampled as the
    pipeline's prior; ties in raster order)."""
    cells = upsample_map(values, reading.gestalt_grid, reading.candidate_grid).flatten()  # [GH * GW]
    top = cells.argsort(descending=True, stable=True)[:budget]
    return float(reading.inside[top].sum()) / max(int(reading.inside.sum()), 1)


def mean_recall(readings: list[PriorReading], readout: PriorReadout, budget: int) -> float:
    return sum(top_recall(readout_map(r, readout), r, budget) for r in readings) / max(len(readings), 1)


def candidates(readings: list[PriorReading], budget: int, max_layer: int | None = None) -> dict[PriorReadout, float]:
    """Every candidate readout's mean recall, in the order tried: per layer (up to max_layer), row rule and plain /
    relative, every head, each single head, then the k best single heads (SEVERAL)."""
    layers, num_heads = readings[0].question.shape[:2]
    scores = {}
    for layer in range(layers if max_layer is None else min(layers, max_layer + 1)):
        for rows in ROWS:
            for relative in (False, True):
                base = PriorReadout(layer=layer, rows=rows, relative=relative)
                scores[base] = mean_recall(readings, base, budget)
                single = {h: mean_recall(readings, replace(base, heads=(h,)), budget) for h in range(num_heads)}
                scores.update({replace(base, heads=(h,)): s for h, s in single.items()})
                best = sorted(single, key=lambda h: (-single[h], h))
                for k in (k for k in SEVERAL if k < num_heads):
                    several = replace(base, heads=tuple(sorted(best[:k])))
                    scores[several] = mean_recall(readings, several, budget)
    return scores


def choose_readout(readings: list[PriorReading], model: str, budget: int = RECALL_CELLS,
                   max_layer: int | None = None) -> PriorReadout:
    """The candidate with the best mean box recall on the readings (ties: lower layer, plain, the order tried),
    where it beats DEFAULT's; else DEFAULT -> a PriorReadout carrying its pages, recall, DEFAULT's and every score."""
    scores = candidates(readings, budget, max_layer)
    order = list(scores)
    best = min(order, key=lambda c: (-scores[c], c.layer, c.relative, order.index(c)))
    default = mean_recall(readings, DEFAULT, budget)
    chosen = best if scores[best] > default else DEFAULT
    return replace(chosen, model=model, pages=len(readings), budget=budget,
                   recall=scores[best] if chosen is best else default, default_recall=default,
                   scores={c.describe(): round(s, 4) for c, s in scores.items()})
