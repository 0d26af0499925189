"""
Dense reading supervision for pocket training: every merged visual token learns which characters it holds.

A from-scratch ViT with 14 px patches does not learn glyphs at arbitrary sub-patch offsets from one answer per
page. Measured on one H100 (ViT 6x256 + a linear head naming one of 32 keys, 24 px text anywhere on 112 px pages,
2000 steps of 64 pages): chance (0.03) from the answer alone; 0.96 when, beside it, each merged token also names
the characters whose centres fall in its 28 px cell, in reading order ("slots"). That second loss is this module.

The head is a linear map from the merger's output (exactly the visual tokens the LLM reads) to SLOTS characters
per cell, so the text becomes linearly decodable from each token. It exists in training only: it is never part of
the exported model, which stays the stock Qwen2VLForConditionalGeneration.

A second linear map reads the ViT's last block before the merge: each 14 px patch names the PATCH_SLOTS characters
whose centres fall in it (reading_targets' last columns). The ninth session found the cell head reading 10-12 px
digits at ~0.5 on the shipped weights, where the suite's fine_print answers failed (every error a misread digit
at ink heights 9-10 px, none another field's value): the patch targets say where each character is at twice the
resolution, inside the ViT that must resolve it.

A third linear map asks the same of the merged tokens (`token_patch_weight` > 0): each names its 2 x 2 patches'
characters, the patch head's targets. The thirteenth session's probe found the smallest digits lost in the merge,
not in the ViT (where the answer failed, the patches held 0.91 of the value's characters and the merged tokens
0.44), and the cells' SLOTS in reading order drop a crowded cell's later characters.

    head = ReadingHead(hidden_size, vision_dim)
    with MergerOutputHook(model) as visual:      # captures the merger's input and output of the next forward
        loss = model(**inputs).loss
    loss = loss + head(visual.value, reading, patches=visual.patches)  # reading: reading_targets(...) of every page
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from arr_coc.synth.fineprint import BOX_WORDS, FILLER, KEYS, Glyph
from arr_coc.vlm.views import CELL

ALPHABET = "".join(sorted(set("".join(KEYS + BOX_WORDS + FILLER)) | set("0123456789:")))  # every drawn character
SLOTS = 6  # characters named per 28 px cell (font 10 holds ~5 per line; more are dropped, ~never on targets)
PATCH = CELL // 2  # 14 px: one ViT patch (a cell is 2 x 2 of them)
PATCH_SLOTS = 4  # characters named per patch (font 10 advances ~5.6 px: <= 3 a line)
NONE = 0  # the class of an empty slot; ALPHABET[i] is class i + 1


def glyph_targets(glyphs: list[Glyph], width: int, height: int, slots: int = SLOTS, cell: int = CELL) -> np.ndarray:
    """Per cell of `cell` px (raster order, as the ViT's merged tokens), the classes of the characters whose centres
    fall in it, in reading order (line by line, left to right); NONE pads. int64 [cells, slots]."""
    gw, gh = width // cell, height // cell
    cells: dict[int, list[tuple[float, float, int]]] = {}
    for g in glyphs:
        col, row = min(int(g.x // cell), gw - 1), min(int(g.y // cell), gh - 1)
        if col >= 0 and row >= 0:
            cells.setdefault(row * gw + col, []).append((g.y, g.x, ALPHABET.index(g.char) + 1))
    target = np.full((gh * gw, slots), NONE, dtype=np.int64)  # [cells, slots]
    for cell, chars in cells.items():
        ordered = [c for _, _, c in sorted(chars)][:slots]
        target[cell, :len(ordered)] = ordered
    return target


def patch_targets(glyphs: list[Glyph], width: int, height: int, slots: int = PATCH_SLOTS) -> np.ndarray:
    """Per merged cell (raster order), its 2 x 2 patches' characters, in the ViT's merge-window order (top left, top
    right, bottom left, bottom right), `slots` each. int64 [cells, 4 * slots]."""
    gh, gw = height // CELL, width // CELL
    fine = glyph_targets(glyphs, gw * CELL, gh * CELL, slots, PATCH)  # [2gh * 2gw, slots], raster order of patches
    return fine.reshape(gh, 2, gw, 2, slots).transpose(0, 2, 1, 3, 4).reshape(gh * gw, 4 * slots)


def reading_targets(glyphs: list[Glyph], width: int, height: int) -> np.ndarray:
    """A page's reading targets: each cell's SLOTS characters, then its patches'.
    int64 [cells, SLOTS + 4 * PATCH_SLOTS]."""
    return np.concatenate([glyph_targets(glyphs, width, height), patch_targets(glyphs, width, height)], 1)


class ReadingHead(nn.Module):
    """Linear: a visual token -> SLOTS character classes; and a ViT patch (before the merge) -> PATCH_SLOTS. Its
    loss is cross-entropy over every slot, the cells' and, given the patches, theirs; a cell slot that holds a drawn
    character weighs `ink_weight` (most slots are empty: at 1 the merged tokens' characters are a small share); given
    the patches, a merged token's naming of its patches' characters weighs `token_patch_weight` (0: off)."""

    def __init__(self, hidden_size: int, vision_dim: int | None = None, slots: int = SLOTS,
                 patch_slots: int = PATCH_SLOTS, ink_weight: float = 1.0, token_patch_weight: float = 0.0):
        super().__init__()
        self.slots, self.patch_slots, self.ink_weight = slots, patch_slots, ink_weight
        self.token_patch_weight = token_patch_weight
        self.proj = nn.Linear(hidden_size, slots * (len(ALPHABET) + 1))
        self.patch_proj = nn.Linear(vision_dim or hidden_size, patch_slots * (len(ALPHABET) + 1))
        self.token_patch_proj = nn.Linear(hidden_size, 4 * patch_slots * (len(ALPHABET) + 1))

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(tokens).float().view(tokens.shape[0], self.slots, -1)  # [N, slots, classes]

    def patch_logits(self, patches: torch.Tensor) -> torch.Tensor:
        """patches [4N, E] in merge-window order -> [N, 4 * patch_slots, classes], a cell's patches in a row."""
        return self.patch_proj(patches).float().view(patches.shape[0] // 4, 4 * self.patch_slots, -1)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, reduction: str = "mean",
                patches: torch.Tensor | None = None) -> torch.Tensor:
        """Cross-entropy over every slot, mean or sum; a target of -100 (a gestalt view's tokens) is ignored.
        targets [N, SLOTS] or, with `patches` [4N, E], reading_targets' [N, SLOTS + 4 * PATCH_SLOTS]."""
        logits = self.logits(tokens)  # [N, slots, classes]
        if patches is not None and targets.shape[1] > self.slots:  # reading_targets: the patches' columns too
            logits = torch.cat([logits, self.patch_logits(patches)], 1)  # [N, slots + 4 * patch_slots, classes]
        else:
            targets = targets[:, :self.slots]
        losses = nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # [N, S], 0: ignored
        weights = torch.ones_like(losses)  # [N, S]
        weights[:, :self.slots] += (self.ink_weight - 1) * (targets[:, :self.slots] > NONE)  # the cells' ink
        total = (weights * losses).sum()
        if targets.shape[1] > self.slots:  # the merged tokens name their patches' characters too (weight 0: off)
            token_logits = self.token_patch_proj(tokens).float().view(tokens.shape[0], 4 * self.patch_slots, -1)
            total = total + self.token_patch_weight * nn.functional.cross_entropy(
                token_logits.transpose(1, 2), targets[:, self.slots:], reduction="sum")  # [N, 4 * patch_slots] summed
        return total if reduction == "sum" else total / (targets != -100).sum().clamp(min=1)  # -100: ignore_index

    @torch.no_grad()
    def accuracy(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """Share of drawn characters (non-empty cell slots) the cell head names right; targets below NONE (ignored)
        do not count, nor reading_targets' patch columns."""
        targets = targets[:, :self.slots]
        ink = targets > NONE
        return float(((self.logits(tokens).argmax(-1) == targets) & ink).sum() / ink.sum().clamp(min=1))


class MergerOutputHook:
    """Context manager: holds the merger's output ([N, hidden], every page's merged tokens in order) and input
    ([4N, E], the last ViT block's patches in merge-window order) of the model's next forward, through a hook on
    its ViT."""

    def __init__(self, model):
        self.visual = model.model.visual
        self.value: torch.Tensor | None = None
        self.patches: torch.Tensor | None = None

    def _keep(self, module, args, output):
        self.value = output.pooler_output  # [N, hidden]: the visual tokens the LLM reads
        self.patches = output.last_hidden_state  # [4N, E]: what the merger merges

    def __enter__(self):
        self.handle = self.visual.register_forward_hook(self._keep)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
