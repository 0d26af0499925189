"""
Dense binding supervision for pocket training: every merged visual token learns what its cell belongs to.

The reading head (arr_coc.pocket.reading) taught the pocket model glyphs, but not which colour, shape or key they go
with: its wrong `box_word` answers were the word of another box, its wrong `shape_colour` answers another shape's
colour, and its wrong `fine_print` answers (at 13 px and up) another field's value. So beside the characters, each
28 px cell names, in nine channels:

    ink     the colour of the box border or shape it touches        (none, or one of COLOURS)
    shape   the kind of shape it touches                            (none, or one of SHAPES)
    inside  the colour of the box whose interior its centre is in   (none, or one of COLOURS)
    word    the word in the box whose interior its centre is in     (none, or one of BOX_WORDS)
    key     the KEY of the field whose print it holds               (none, or one of KEYS)
    digit1..digit4  the field's value, digit by digit               (none, or 0-9)

The word and the digits travel to every token of their box or field, so that finding the box by its colour, or
the field by its key, finds the answer in any of its tokens (measured: with the first four channels alone, the
tokens named the box's colour right 0.99 of the time, yet 10 of 16 wrong `box_word` answers were another box's).

Three channels are taught a second time in the LLM's own words (aligned_loss): a token inside the orange box is
drawn towards the embedding of " orange", a token of the box holding "lemon" towards "lemon", a field's tokens
towards its key. The head alone left the colour linearly readable (0.99) but useless as a lookup key: asked for the
orange box's word, the model answered another box's, at chance even with two boxes; asked the other way round (the
colour of the box around "lemon"), it learned to answer in 1400 steps. The aligned loss is meant to let a question's
word find the tokens that hold it by plain similarity, with the answer's word there to be copied; after 914 steps
(run 14, the model card) `box_word` had not moved.

Each label is drawn, not computed from boxes: every mark is drawn again into a mask with the page's own drawing
calls, and a cell takes the label it holds the most pixels of. Like the reading head, the linear head on the
merger's output exists in training only and is never exported.

    targets = binding_targets(page.marks, width, height)   # int64 [cells, channels]
    loss = loss + BindingHead(hidden_size)(visual_tokens, targets)
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import nn

from arr_coc.synth.fineprint import BOX_WORDS, COLOURS, KEYS, SHAPES, Mark, draw_shape
from arr_coc.vlm.views import CELL

DIGITS = ("digit1", "digit2", "digit3", "digit4")  # a field's value, NNNN
CHANNELS = ("ink", "shape", "inside", "word", "key") + DIGITS
CLASSES = {"ink": ("none",) + tuple(sorted(COLOURS)), "shape": ("none",) + SHAPES,
           "inside": ("none",) + tuple(sorted(COLOURS)), "word": ("none",) + tuple(BOX_WORDS),
           "key": ("none",) + tuple(KEYS)} | {d: ("none",) + tuple("0123456789") for d in DIGITS}  # class 0: nothing
ALIGNED = {"inside": " {}", "word": "{}", "key": " {}"}  # channels also taught in the LLM's word embeddings: how
# each class's name is written where the LLM meets it (in the question: " orange", " LIMIT"; as the answer: "lemon")
ALIGN_TEMPERATURE = 10.0  # aligned_loss's logits: this times the cosine between a token and each class's embedding
MIN_PIXELS = 8  # a cell touches a mark when at least this many of its 784 pixels are the mark's


def _draw(channel: str, mark: Mark, draw: ImageDraw.ImageDraw, box) -> int:
    """Draw `mark`'s part of `channel` (value 1) at `box` (the mark's box in the mask); its class, or 0 if none."""
    x0, y0, x1, y1 = box
    if channel == "ink" and mark.kind == "box":
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], outline=1, width=mark.border)
    elif channel in ("ink", "shape") and mark.kind == "shape":
        draw_shape(draw, mark.shape, box, 1)
    elif channel in ("inside", "word") and mark.kind == "box":
        b = mark.border
        draw.rectangle([x0 + b, y0 + b, x1 - 1 - b, y1 - 1 - b], fill=1)
    elif (channel == "key" or channel in DIGITS) and mark.kind == "field":
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=1)
    else:
        return 0
    label = (mark.text[DIGITS.index(channel)] if channel in DIGITS else
             {"ink": mark.colour, "shape": mark.shape, "inside": mark.colour, "word": mark.text,
              "key": mark.key.rpartition(" ")[2]}[channel])  # a compound key (families.py: "MAX SPEED") binds its stem
    return CLASSES[channel].index(label)


def binding_targets(marks: list[Mark], width: int, height: int) -> np.ndarray:
    """Per merged cell (raster order, as the ViT's merged tokens), each channel's class: int64 [cells, channels]."""
    gh, gw = height // CELL, width // CELL
    target = np.zeros((len(CHANNELS), gh, gw), dtype=np.int64)  # [channels, gh, gw]
    best = np.full((len(CHANNELS), gh, gw), MIN_PIXELS - 1, dtype=np.int64)  # the pixel count of each cell's label
    for mark in marks:
        c0, r0 = mark.box[0] // CELL, mark.box[1] // CELL  # the cells the mark's box covers
        c1, r1 = min(gw, math.ceil(mark.box[2] / CELL)), min(gh, math.ceil(mark.box[3] / CELL))
        if c1 <= c0 or r1 <= r0:
            continue
        local = (mark.box[0] - c0 * CELL, mark.box[1] - r0 * CELL, mark.box[2] - c0 * CELL, mark.box[3] - r0 * CELL)
        for i, channel in enumerate(CHANNELS):
            mask = Image.new("L", ((c1 - c0) * CELL, (r1 - r0) * CELL), 0)
            label = _draw(channel, mark, ImageDraw.Draw(mask), local)
            if not label:
                continue
            counts = np.asarray(mask, dtype=np.int64).reshape(r1 - r0, CELL, c1 - c0, CELL).sum((1, 3))  # [r, c]
            if channel in ("inside", "word"):  # the interior holds the cell's centre, not merely a corner of it
                counts = counts * (np.asarray(mask)[CELL // 2::CELL, CELL // 2::CELL] > 0)
            win = counts > best[i, r0:r1, c0:c1]
            best[i, r0:r1, c0:c1][win] = counts[win]
            target[i, r0:r1, c0:c1][win] = label
    return target.reshape(len(CHANNELS), -1).T.copy()  # [cells, channels]


class BindingHead(nn.Module):
    """Linear: a visual token -> each channel's classes. Its loss is the cross-entropy summed over channels."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.sizes = [len(CLASSES[c]) for c in CHANNELS]
        self.proj = nn.Linear(hidden_size, sum(self.sizes))

    def logits(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        return list(self.proj(tokens).float().split(self.sizes, dim=-1))  # channels x [N, classes]

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy over every (token, channel), mean or sum; a target of -100 (a gestalt's token) is ignored."""
        return sum(nn.functional.cross_entropy(logits, targets[:, i], reduction=reduction)
                   for i, logits in enumerate(self.logits(tokens))) / (len(CHANNELS) if reduction == "mean" else 1)

    @torch.no_grad()
    def accuracy(self, tokens: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """Per channel, the share of labelled cells (class > 0) named right."""
        out = {}
        for i, (channel, logits) in enumerate(zip(CHANNELS, self.logits(tokens))):
            marked = targets[:, i] > 0
            out[channel] = float(((logits.argmax(-1) == targets[:, i]) & marked).sum() / marked.sum().clamp(min=1))
        return out


def aligned_ids(tokenizer) -> dict[str, torch.Tensor]:
    """Per ALIGNED channel, the token id of each class's name (classes 1..; each name is a single token): int64 [C]."""
    ids = {}
    for channel, form in ALIGNED.items():
        names = [tokenizer(form.format(c), add_special_tokens=False)["input_ids"] for c in CLASSES[channel][1:]]
        assert all(len(n) == 1 for n in names), f"a {channel} name is not a single token"
        ids[channel] = torch.tensor([n[0] for n in names])
    return ids


def aligned_loss(tokens: torch.Tensor, targets: torch.Tensor, embeddings: torch.Tensor,
                 ids: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed over the marked cells of each ALIGNED channel: cross-entropy of ALIGN_TEMPERATURE x the cosine between
    the token and the (fixed) embedding of each class's name. tokens [N, H], targets [N, channels], embeddings [V, H]."""
    unit = nn.functional.normalize(tokens.float(), dim=-1)  # [N, H]
    loss = unit.new_zeros(())
    for channel, channel_ids in ids.items():
        target = targets[:, CHANNELS.index(channel)]  # [N] class, 0 = none, -100 = a gestalt's token
        marked = target > 0
        names = nn.functional.normalize(embeddings[channel_ids.to(embeddings.device)].float(), dim=-1)  # [C, H]
        logits = ALIGN_TEMPERATURE * unit[marked] @ names.T  # [M, C]
        loss = loss + nn.functional.cross_entropy(logits, target[marked] - 1, reduction="sum")
    return loss


def aligned_count(targets: torch.Tensor) -> torch.Tensor:
    """How many (cell, channel) labels aligned_loss sums over: the marked cells of the ALIGNED channels."""
    return (targets[:, [CHANNELS.index(c) for c in ALIGNED]] > 0).sum()
