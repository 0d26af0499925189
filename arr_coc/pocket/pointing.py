"""
The answer points at what it reads: a training-only loss on one attention head of the pocket model's LLM.

Run 13 showed the gap (models/pocket-qwen2-vl/README.md): the model finds a token by its glyphs and reads its colour,
but cannot find a token *by* its colour. Asked for the orange box's word on a page with two boxes, it answers at
chance. So, as the reading and binding heads supervise what each visual token holds, this supervises where the
answer looks: at the position that predicts an answer's first token, head POINT_HEAD of layer POINT_LAYER must put
its attention on the target's tokens, those the binding targets name as the asked box's interior, the asked key's
field or the asked shape. The loss is -log(the head's attention mass on them), summed over questions.

The head's probabilities come from the attention call itself: the LLM runs under POINTING_ATTENTION, which is
sdpa plus, for the one layer and the few query rows asked for, the softmax of that head's scores over the keys the
position may see (causal). Nothing changes in the forward's output; exported models load with plain sdpa.

    point_at = pointing_targets(conversations, bindings, ...)       # in collate: (row, position) and target keys
    with Pointing(model, point_at.queries) as pointing:              # the next forward records the head's rows
        model(**inputs)
    loss = pointing.loss(point_at.targets)

The same head can also be taught to point at each digit as it writes it (digit_targets, `--point-digits`): at the
position that predicts a `fine_print` answer's k-th digit, its mass on the one cell that holds that digit's glyph
(from the page's recorded glyphs). Where `fine_print` fails, the answer is a misread digit of the right field: the
field is found, but nothing says which of its cells holds the digit being written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

from arr_coc.pocket.binding import CHANNELS, CLASSES
from arr_coc.vlm.views import CELL

POINTING_ATTENTION = "sdpa_pointing"  # the LLM's attention in pocket training (registered by use_pointing_attention)
POINT_LAYER = 2  # the supervised layer (of 4): the question's words have reached the answer position by then
POINT_HEAD = 0  # the supervised query head of that layer
VALUE_QUESTION = re.compile(r"What is the value of (\w+)\?")  # fine_print: the answer is its field's NNNN
QUESTIONS = (  # a suite question -> the binding channels whose class names its target (any of them)
    (re.compile(r"What word is in the (\w+) box\?"), ("inside",)),
    (VALUE_QUESTION, ("key",)),
    (re.compile(r"What colour is the (\w+)\?"), ("shape",)),
    # a glance's (data.glance_questions): at the gestalt's size a box's interior may hold no cell's centre
    (re.compile(r"Where is the (\w+) box\?"), ("inside", "ink")),
)


@dataclass
class PointAt:
    """Where a batch's answers must look: one row per suite question with a target on its page."""
    queries: torch.Tensor  # [P, 2] (batch row, position predicting the answer's first token)
    targets: torch.Tensor  # [P, L] bool: the keys (sequence positions) of the target's visual tokens


def pointing_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """sdpa, and on the module that a Pointing holds, the POINT_HEAD's log-softmax at the asked query rows."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    out = ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, scaling=scaling,
                                          dropout=dropout, **kwargs)
    pointing = getattr(module, "pointing", None)
    if pointing is not None:
        rows, positions = pointing.queries.unbind(-1)  # [P] each
        q = query[rows, POINT_HEAD, positions].float()  # [P, d]
        k = key[rows, POINT_HEAD // module.num_key_value_groups].float()  # [P, L, d]
        scores = torch.einsum("pd,pld->pl", q, k) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
        seen = torch.arange(k.shape[1], device=k.device) <= positions[:, None]  # [P, L] causal
        pointing.log_probs = scores.masked_fill(~seen, float("-inf")).log_softmax(-1)  # [P, L]
    return out


def use_pointing_attention(model):
    """Run the model's LLM under pointing_attention (sdpa while no Pointing is active)."""
    from transformers import AttentionInterface

    AttentionInterface.register(POINTING_ATTENTION, pointing_attention)
    model.config.text_config._attn_implementation = POINTING_ATTENTION
    return model


class Pointing:
    """Context manager: the next forward records POINT_HEAD's attention rows at `queries` [P, 2]."""

    def __init__(self, model, queries: torch.Tensor):
        self.attention = model.model.language_model.layers[POINT_LAYER].self_attn
        self.queries, self.log_probs = queries, None

    def __enter__(self):
        if len(self.queries):
            self.attention.pointing = self
        return self

    def __exit__(self, *exc):
        self.attention.pointing = None

    def loss(self, targets: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """Summed over the queries `rows` (all by default): -log(the head's attention mass on each one's target
        keys). targets [P, L] bool, one row a query of `rows`."""
        if self.log_probs is None or not len(targets):
            return torch.zeros((), device=targets.device)
        on_target = self.log_probs[rows].masked_fill(~targets.to(self.log_probs.device), float("-inf"))  # [P, L]
        return -on_target.logsumexp(-1).sum()


def pointing_targets(conversations: list[list[tuple[str, str]]], labels: torch.Tensor, input_ids: torch.Tensor,
                     image_token_id: int, bindings: list[np.ndarray]) -> PointAt:
    """
    For each conversation's suite questions: the position whose logits give the answer's first token (one before
    the turn's first labelled token), and the sequence positions of the page's visual tokens (the last image block,
    raster order, as binding_targets) that the question's target covers. A question whose target covers no token
    (or a transcript, a reversed question) is left out. labels, input_ids [B, L]; bindings: [cells, channels] a page.
    """
    queries, targets = [], []
    page_tokens = len(bindings[0]) if bindings else 0  # one page size a batch
    for row, question, start, page in _answers(conversations, labels, input_ids, image_token_id, page_tokens):
        for pattern, channels in QUESTIONS:
            if match := pattern.fullmatch(question):
                hit = np.any([bindings[row][:, CHANNELS.index(c)] == CLASSES[c].index(match.group(1))
                              for c in channels], 0)  # [cells]
                if hit.any():
                    mask = torch.zeros(labels.shape[1], dtype=torch.bool)
                    mask[page[torch.from_numpy(hit)]] = True
                    queries.append((row, start - 1))
                    targets.append(mask)
                break
    return _point_at(queries, targets, labels.shape[1])


def _answers(conversations: list[list[tuple[str, str]]], labels: torch.Tensor, input_ids: torch.Tensor,
             image_token_id: int, page_tokens: int):
    """Each turn of each conversation: (row, question, the position of its answer's first labelled token, the
    sequence positions of the row's page tokens [cells]: its last image block, page_tokens long)."""
    for row, turns in enumerate(conversations):
        labelled = labels[row] != -100  # [L]
        starts = (labelled & ~torch.cat([labelled.new_zeros(1), labelled[:-1]])).nonzero()[:, 0]  # each answer's first
        page = (input_ids[row] == image_token_id).nonzero()[:, 0][-page_tokens:]  # [cells]
        for (question, _), start in zip(turns, starts.tolist()):
            yield row, question, start, page


def _point_at(queries: list[tuple[int, int]], targets: list[torch.Tensor], length: int) -> PointAt:
    if not queries:
        return PointAt(torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, length, dtype=torch.bool))
    return PointAt(torch.tensor(queries), torch.stack(targets))


def value_cells(marks, glyphs, width: int) -> dict[str, list[int]]:
    """A fine_print page's fields -> the cells (raster order, as its merged tokens) holding each digit of the
    value, in order: {key: [4 cells]}. A field a shape covers part of (its glyphs not all recorded) is left out.
    marks, glyphs: the page's (fineprint.Page)."""
    out = {}
    for m in marks:
        if m.kind != "field":
            continue
        x0, y0, x1, y1 = m.box
        digits = sorted((g for g in glyphs if g.char.isdigit() and x0 <= g.x < x1 and y0 <= g.y < y1),
                        key=lambda g: g.x)  # the value's digits (a KEY has none), left to right
        if "".join(g.char for g in digits) == m.text:
            out[m.key] = [int(g.y // CELL) * (width // CELL) + int(g.x // CELL) for g in digits]
    return out


def digit_targets(conversations: list[list[tuple[str, str]]], labels: torch.Tensor, input_ids: torch.Tensor,
                  image_token_id: int, values: list[dict[str, list[int]]], page_tokens: int) -> PointAt:
    """For each conversation's `fine_print` questions: the positions that predict the answer's digits (the tokenizer
    writes one digit a token) and, for each, the sequence position of the page's visual token whose cell holds that
    digit (value_cells). labels, input_ids [B, L]; values: value_cells a page; page_tokens: a page's merged tokens
    (the last image block of every row)."""
    queries, targets = [], []
    for row, question, start, page in _answers(conversations, labels, input_ids, image_token_id, page_tokens):
        if (match := VALUE_QUESTION.fullmatch(question)) and match.group(1) in values[row]:
            for k, cell in enumerate(values[row][match.group(1)]):  # digit k is predicted at start - 1 + k
                mask = torch.zeros(labels.shape[1], dtype=torch.bool)
                mask[page[cell]] = True
                queries.append((row, start - 1 + k))
                targets.append(mask)
    return _point_at(queries, targets, labels.shape[1])
