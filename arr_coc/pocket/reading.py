"""
Dense reading supervision for pocket training: every merged visual token learns which characters it holds.

A from-scratch ViT with 14 px patches does not learn glyphs at arbitrary sub-patch offsets from one answer per
page. Measured on one H100 (ViT 6x256 + a linear head naming one of 32 keys, 24 px text anywhere on 112 px pages,
2000 steps of 64 pages): chance (0.03) from the answer alone; 0.96 when, beside it, each merged token also names
the characters whose centres fall in its 28 px cell, in reading order ("slots"). That second loss is this module.

The head is a linear map from the merger's output (exactly the visual tokens the LLM reads) to SLOTS characters
per cell, so the text becomes linearly decodable from each token. It exists in training only: it is never part of
the exported model, which stays the stock Qwen2VLForConditionalGeneration.

    head = ReadingHead(hidden_size)
    with MergerOutputHook(model) as tokens:      # captures the merger's output of the next forward
        loss = model(**inputs).loss
    loss = loss + head(tokens.value, reading)    # reading: glyph_targets(...) of every page, concatenated
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from arr_coc.synth.fineprint import BOX_WORDS, FILLER, KEYS, Glyph
from arr_coc.vlm.views import CELL

ALPHABET = "".join(sorted(set("".join(KEYS + BOX_WORDS + FILLER)) | set("0123456789:")))  # every drawn character
SLOTS = 6  # characters named per 28 px cell (font 10 holds ~5 per line; more are dropped, ~never on targets)
NONE = 0  # the class of an empty slot; ALPHABET[i] is class i + 1


def glyph_targets(glyphs: list[Glyph], width: int, height: int, slots: int = SLOTS) -> np.ndarray:
    """Per merged cell (raster order, as the ViT's merged tokens), the classes of the characters whose centres fall
    in it, in reading order (line by line, left to right); NONE pads. int64 [cells, slots]."""
    gw, gh = width // CELL, height // CELL
    cells: dict[int, list[tuple[float, float, int]]] = {}
    for g in glyphs:
        col, row = min(int(g.x // CELL), gw - 1), min(int(g.y // CELL), gh - 1)
        if col >= 0 and row >= 0:
            cells.setdefault(row * gw + col, []).append((g.y, g.x, ALPHABET.index(g.char) + 1))
    target = np.full((gh * gw, slots), NONE, dtype=np.int64)  # [cells, slots]
    for cell, chars in cells.items():
        ordered = [c for _, _, c in sorted(chars)][:slots]
        target[cell, :len(ordered)] = ordered
    return target


class ReadingHead(nn.Module):
    """Linear: a visual token -> SLOTS character classes. Its loss is mean cross-entropy over every slot."""

    def __init__(self, hidden_size: int, slots: int = SLOTS):
        super().__init__()
        self.slots = slots
        self.proj = nn.Linear(hidden_size, slots * (len(ALPHABET) + 1))

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(tokens).float().view(tokens.shape[0], self.slots, -1)  # [N, slots, classes]

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy over every slot, mean or sum; a target of -100 (a gestalt view's tokens) is ignored."""
        logits = self.logits(tokens)  # [N, slots, classes]
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)

    @torch.no_grad()
    def accuracy(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """Share of drawn characters (non-empty slots) named right; targets below NONE (ignored) do not count."""
        ink = targets > NONE
        return float(((self.logits(tokens).argmax(-1) == targets) & ink).sum() / ink.sum().clamp(min=1))


class MergerOutputHook:
    """Context manager: holds the merger's output ([N, hidden], every page's merged tokens in order) of the model's
    next forward, through a hook on its ViT."""

    def __init__(self, model):
        self.visual = model.model.visual
        self.value: torch.Tensor | None = None

    def _keep(self, module, args, output):
        self.value = output.pooler_output  # [N, hidden]: the visual tokens the LLM reads

    def __enter__(self):
        self.handle = self.visual.register_forward_hook(self._keep)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
