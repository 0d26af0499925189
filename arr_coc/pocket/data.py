"""
pocket training's data: the curriculum's stages, the pages and conversations of each training batch (a pure function
of seed, stage and index), their token ids, labels and M-RoPE positions, the dense targets of every visual token,
and the stream the DataLoader's workers draw them from.

    images, conversations, readings, gestalt_first, bindings, values = batch_pages(index, seed, stage, 8192)
    batch = collate(tokenizer, images, conversations, readings, gestalt_first, bindings, values)
    inputs = model_inputs(batch, image_processor(), image_token_id, "cuda")
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, replace

import numpy as np
import torch

from arr_coc.pocket.binding import CHANNELS, DIGITS, binding_targets
from arr_coc.pocket.pointing import digit_targets, pointing_targets, value_cells
from arr_coc.pocket.reading import reading_targets
from arr_coc.synth.families import FAMILIES, TRAINED, make_family_page
from arr_coc.synth.fineprint import PAGE_KINDS, SPEC, PageStyle, make_page
from arr_coc.vlm.positions import mrope_position_ids, raster_block
from arr_coc.vlm.views import CELL, PIPELINE, fit_grid, make_views

READ_PAGE = "Read the page."  # the transcription question: dense supervision of every glyph, as OCR pre-training
IGNORE = -100
GESTALT_TOKENS = PIPELINE.gestalt_max_tokens  # ARR's gestalt view: at most this many merged tokens
MAX_PAGES = 96  # at most this many pages a batch (the first stage's pages are small)
WORKER_NICENESS = 10  # page workers run this much below the training process: on a busy host the CPU goes first to
# the process that feeds the GPU (it is host-bound: thousands of small operators a step), the workers catch up after


@dataclass(frozen=True)
class Stage:
    """One step of the curriculum. The model moves on once it reads this stage's own held-out pages (its `gate`
    kinds at PASS_MARK), or after `budget` steps at it, whichever comes first: the curriculum never stalls."""
    sides: tuple[int, int]  # page side range in px (each side drawn separately; aspect kept within 3:4..4:3)
    styles: tuple[PageStyle, ...]  # what the pages hold: each page draws one of these, uniformly
    turns: int  # at most this many questions per page (a multi-turn conversation)
    read: float  # share of conversations that open with READ_PAGE (the page's transcript)
    budget: int = 10**9  # move on after this many steps at this stage, passed or not
    gate: tuple[str, ...] = ("fine_print",)  # the kinds whose held-out pages must reach PASS_MARK to move on early
    families: float = 0.0  # share of batches whose pages come from the trained layout families (families.TRAINED)
    glance: float = 0.0  # share of batches whose pages are shown whole at the gestalt's size only (glance_pages)

    @property
    def style(self) -> PageStyle:
        """The style of the stage's own held-out check pages: its first."""
        return self.styles[0]


# Reading is supervised densely from the start (arr_coc.pocket.reading), so the print goes anywhere from the first stage;
# the stages grow the pages and shrink the print.
_LARGE = PageStyle(fields=(1, 2), field_font=(20, 28), boxes=(1, 2), word_font=(20, 28), shapes=(1, 2), clutter=0.1)
_MEDIUM = PageStyle(fields=(1, 4), field_font=(16, 26), boxes=(1, 3), word_font=(16, 26), shapes=(1, 3), clutter=0.3)
_MID = PageStyle(fields=(2, 8), field_font=(13, 22), boxes=(2, 5), word_font=(13, 22), clutter=0.5)
_SMALLER = PageStyle(fields=(4, 16), field_font=(11, 19), boxes=(3, 8), word_font=(12, 19), clutter=0.8)
# the suite's hardest corner, half of the late stages' pages: its smallest print on its most crowded pages
SMALL_PRINT = PageStyle(fields=(16, 32), field_font=(10, 12), word_font=(11, 13))
# the last two stages: the suite and its hardest corner, half their shape_colour pages with the shapes over scattered
# fields (with clean backgrounds only, shapes over print, fineprint.LAYOUTS, held out, were read at 0.27: step 47213)
_LATE = tuple(replace(style, fields_under_shapes=0.5) for style in (SPEC, SMALL_PRINT))
GLANCE_SHARE = 0.15  # the last two stages: this share of batches shows each page whole at the gestalt's size, with
# the questions such a view answers (issue #65: at 1792² the question->gestalt attention peaked on the asked box on
# 0.25-0.44 of dense held-out pages, though the box's colour is visible in that view; a VLM trained at every size
# sees pages shrunk so; this one rarely did)
FAMILY_SHARE = 0.6  # the last two stages: this share of batches from the trained layout families (issue #51), the
# rest from the suite's own pages; the held-out families (families.HELD_OUT) are never drawn
# every stage but the last has a step budget; the first two's are ~1.3x the steps the shipped line took to pass their
# checks from scratch (~16.5k and ~7.5k), the later ones' what got it past stage 2, where it had stalled for 20k steps
CURRICULUM = (
    Stage((112, 224), (_LARGE,), turns=2, read=0.5, budget=20_000, gate=("fine_print", "box_word")),
    Stage((168, 336), (_MEDIUM,), turns=4, read=0.5, budget=10_000, gate=("fine_print", "box_word")),
    Stage((224, 560), (_MID,), turns=6, read=0.35, budget=300),
    Stage((336, 896), (_SMALLER, SMALL_PRINT), turns=8, read=0.25, budget=300),
    Stage((448, 1344), _LATE, turns=8, read=0.15, budget=400, families=FAMILY_SHARE, glance=GLANCE_SHARE),
    Stage((448, 1792), _LATE, turns=8, read=0.1, families=FAMILY_SHARE, glance=GLANCE_SHARE),  # the last stage
)
PASS_MARK = 0.7  # a stage may end early when held-out exact match on its own pages reaches this on its gate kinds:
# its remaining errors (which field a key names) keep being trained on the next stage, whose pages hold more fields
REVIEW = 0.2  # share of batches drawn from an earlier stage than the current one, so that no stage is forgotten
KIND_WEIGHTS = (0.5, 0.2, 0.3)  # how often each of PAGE_KINDS is drawn (run 20 on): fine_print, short of its target,
# and shape_colour, whose shapes over print were read at 0.09 (runs 16-19: 0.6 / 0.3 / 0.1; runs 13-15 drew box_word
# most, 0.35 / 0.5 / 0.15, until pointing bound it)
REVERSED = 0.3  # share of a page's training questions asked the other way round (reversed_questions)
GESTALT_FIRST = 0.2  # share of batches whose conversations show the page's gestalt view (<= 256 tokens) first, then
# the page: two image blocks, as ARR's prompt has (and as the real Qwen saw multi-image prompts in training)


# -----------------------------------------------------------------------------
# conversations -> tensors


def conversation(questions: list[tuple[str, str]], images: int = 1) -> list[dict]:
    """`images` images, then question/answer turns (the images go with the first question)."""
    messages = []
    for i, (q, a) in enumerate(questions):
        content = [{"type": "image"}] * images + [{"type": "text", "text": q}] if i == 0 else q
        messages += [{"role": "user", "content": content}, {"role": "assistant", "content": a}]
    return messages


def encode(tokenizer, questions: list[tuple[str, str]], image_tokens: list[int]) -> tuple[list[int], list[int]]:
    """Token ids of a conversation with its image blocks (image_tokens: each one's token count, in order)
    expanded, and labels on the answers (+ <|im_end|>) only."""
    text = tokenizer.apply_chat_template(conversation(questions, len(image_tokens)), tokenize=False)
    first, *rest = text.split("<|image_pad|>")  # one pad per image, in order
    text = first + "".join("<|image_pad|>" * n + after for n, after in zip(image_tokens, rest, strict=True))
    spans, at = [], 0
    for _, a in questions:  # each answer's characters and its <|im_end|>, in order
        start = text.index("<|im_start|>assistant\n" + a + "<|im_end|>", at) + len("<|im_start|>assistant\n")
        at = start + len(a) + len("<|im_end|>")
        spans.append((start, at))
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    labels = [t if any(s <= o0 and o1 <= e for s, e in spans) and o1 > o0 else IGNORE
              for t, (o0, o1) in zip(enc["input_ids"], enc["offset_mapping"])]
    return enc["input_ids"], labels


def collate(tokenizer, images, conversations, readings=None, gestalt_first: bool = False, bindings=None,
            values=None) -> dict:
    """
    Pages (PIL, one size, multiples of 28 px) + their conversations -> one right-padded batch: token ids, labels,
    attention mask, M-RoPE position ids and the pages as uint8 [B, H, W, 3]; with `readings` (each page's
    reading_targets) also every visual token's reading targets, concatenated, and with `bindings` (each page's
    binding_targets) its binding targets and where each suite answer must look (pointing_targets: point_queries
    [P, 2], point_targets [P, L]), and with `values` (each page's pointing.value_cells) where each `fine_print`
    answer's digits must look (digit_targets: point_digit_queries [D, 2], point_digit_targets [D, L]). Pixels travel
    between processes as bytes, 8x smaller than the processor's float patches; `model_inputs` lays them out on the
    GPU exactly as the stock processor does. gestalt_first: each conversation shows the page's gestalt view (ARR's, <= 256 tokens,
    resized on the GPU by `model_inputs`) before the page itself; its tokens have no reading targets.
    """
    w, h = images[0].size
    page = (h // 28, w // 28)  # the page's cell grid
    blocks = ([raster_block(fit_grid(w, h, GESTALT_TOKENS))] if gestalt_first else []) + [raster_block(page)]
    sizes = [len(block.positions) for block in blocks]
    rows = [encode(tokenizer, qa, sizes) for qa in conversations]
    length = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    for i, (ids, lab) in enumerate(rows):
        input_ids[i, :len(ids)], labels[i, :len(lab)], attention[i, :len(ids)] = torch.tensor(ids), torch.tensor(lab), 1
    pages = torch.from_numpy(np.stack([np.asarray(im.convert("RGB"), dtype=np.uint8) for im in images]))  # [B, H, W, 3]
    image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    # M-RoPE positions drawn here, in the workers: not per row on the GPU
    position_ids = torch.cat([mrope_position_ids(row[None], image_token_id, blocks)  # [3, 1, L] per row
                              for row in input_ids], 1)  # [3, B, L]
    batch = dict(input_ids=input_ids, attention_mask=attention, labels=labels, pages=pages, position_ids=position_ids)
    if gestalt_first:
        batch["gestalt_grid"] = torch.tensor(blocks[0].grid)
    if readings is not None:
        unread = np.full((sizes[0], readings[0].shape[1]), IGNORE, dtype=np.int64)  # a gestalt's tokens: no targets
        batch["reading"] = torch.from_numpy(np.concatenate([part for r in readings  # [visual tokens, slots]
                                                            for part in ([unread, r] if gestalt_first else [r])]))
    if bindings is not None:
        unbound = np.full((sizes[0], bindings[0].shape[1]), IGNORE, dtype=np.int64)
        batch["binding"] = torch.from_numpy(np.concatenate([part for b in bindings  # [visual tokens, channels]
                                                            for part in ([unbound, b] if gestalt_first else [b])]))
        point_at = pointing_targets(conversations, labels, input_ids, image_token_id, bindings)
        batch["point_queries"], batch["point_targets"] = point_at.queries, point_at.targets  # [P, 2], [P, L]
    if values is not None:
        digits = digit_targets(conversations, labels, input_ids, image_token_id, values, sizes[-1])
        batch["point_digit_queries"], batch["point_digit_targets"] = digits.queries, digits.targets  # [D, 2], [D, L]
    return batch


def model_inputs(batch: dict, processor, image_token_id: int, device) -> dict:
    """A collated batch -> Qwen2VLForConditionalGeneration's inputs on `device` (pixel patches as the processor's;
    with a gestalt grid, each page's gestalt view, then the page)."""
    from arr_coc.vlm.vision import image_patches
    from arr_coc.vlm.views import resize

    host_only = ("pages", "reading", "binding", "gestalt_grid")  # laid out below, or not the model's
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items() if k not in host_only}
    pages = batch["pages"].to(device, non_blocking=True).permute(0, 3, 1, 2).float() / 255.0  # [B, 3, H, W]
    out["pixel_values"], out["image_grid_thw"] = image_patches(pages, processor)  # [B*N, 1176], [B, 3]
    if "gestalt_grid" in batch:
        B, grid = len(pages), tuple(batch["gestalt_grid"].tolist())
        gestalts = torch.cat([resize(page[None], grid) for page in pages])  # [B, 3, gh*28, gw*28]: ARR's resize
        small, small_thw = image_patches(gestalts, processor)  # [B*n, 1176], [B, 3]
        out["pixel_values"] = torch.cat([small.view(B, -1, small.shape[-1]),  # [B, n + N, 1176]: gestalt, page
                                         out["pixel_values"].view(B, -1, small.shape[-1])], 1).flatten(0, 1)
        out["image_grid_thw"] = torch.stack([small_thw, out["image_grid_thw"]], 1).flatten(0, 1)  # [2B, 3]
    out["mm_token_type_ids"] = (out["input_ids"] == image_token_id).int()
    return out


def page_size(rng: random.Random, sides: tuple[int, int], by_area: bool = False) -> tuple[int, int]:
    """A (width, height) in multiples of 28 px within `sides`, aspect between 3:4 and 4:3. The width is uniform over
    its cells, or with `by_area` drawn in proportion to its square: a batch holds image_tokens // (w * h) pages, so
    then every width gets about as many pages (uniform widths give 448 px six times the pages of 1344-1792 px)."""
    lo, hi = sides[0] // 28, sides[1] // 28
    w = rng.choices(range(lo, hi + 1), [c * c for c in range(lo, hi + 1)])[0] if by_area else rng.randint(lo, hi)
    h = rng.randint(max(lo, math.ceil(w * 3 / 4)), min(hi, max(lo, math.floor(w * 4 / 3))))
    return w * 28, h * 28


def batch_pages(index: int, seed: int, stage: int, image_tokens: int, max_pages: int = MAX_PAGES, world: int = 1,
                by_area: bool = False):
    """The pages, conversations, reading targets, gestalt_first flag, binding targets and value cells of training
    batch `index` at curriculum `stage` (a REVIEW share of batches from an earlier stage; page sizes by_area as
    page_size's): a pure function of them. Under
    torchrun, process r of N takes batches r, r + N, r + 2N, ... (PageStream); the N batches of one step share
    their stage, page size and gestalt_first, so no process waits on another's larger pages (attention grows with
    the square of a page's patches)."""
    shape = random.Random(f"arr_coc:pocket:{seed}:{stage}:{index // world}")  # one draw a step
    s = CURRICULUM[shape.randrange(stage) if stage and shape.random() < REVIEW else stage]
    w, h = page_size(shape, s.sides, by_area)
    gestalt_first = shape.random() < GESTALT_FIRST
    family = shape.choice(TRAINED) if s.families and shape.random() < s.families else None
    if family is not None:  # the family's own aspect at the drawn page's area
        w, h = family_page_size(shape, family, w * h)
    rng = random.Random(f"arr_coc:pocket:{seed}:{stage}:{index}:pages")  # this batch's own pages
    if s.glance and shape.random() < s.glance:  # whole pages at the gestalt's size (the step's one draw more)
        return glance_pages(rng, s, family, w, h, image_tokens, max_pages)
    tokens = w * h // 784 + (math.prod(fit_grid(w, h, GESTALT_TOKENS)) if gestalt_first else 0)  # per conversation
    n = min(max_pages, max(2, image_tokens // tokens))
    images, conversations, readings, bindings, values = [], [], [], [], []
    for _ in range(n):
        page = draw_page(rng, s, family, w, h)
        pool = [(q.question, q.answer) for q in page.questions]
        for i, qa in enumerate(reversed_questions(page)[:len(pool)]):  # mark i is question i's target
            if rng.random() < REVERSED:
                pool[i] = qa
        k = rng.randint(1, min(s.turns, len(pool)))
        turns = rng.sample(pool, k)
        images.append(page.image)
        conversations.append([(READ_PAGE, page.transcript)] + turns if rng.random() < s.read else turns)
        readings.append(reading_targets(page.glyphs, w, h))
        bindings.append(binding_targets(page.marks, w, h))
        values.append(value_cells(page.marks, page.glyphs, w))
    return images, conversations, readings, gestalt_first, bindings, values


def draw_page(rng: random.Random, stage: Stage, family: str | None, w: int, h: int,
              kinds: tuple[str, ...] = PAGE_KINDS):
    """One training page of one of `kinds`: of a trained layout family (its kinds among them, weighted as
    KIND_WEIGHTS), or of the suite in one of the stage's styles."""
    if family is None:
        style = rng.choice(stage.styles) if len(stage.styles) > 1 else stage.styles[0]
        return make_page(rng.choices(kinds, [KIND_WEIGHTS[PAGE_KINDS.index(k)] for k in kinds])[0],
                         rng.getrandbits(40), w, h, style)
    assert family in TRAINED, family  # a held-out family is never trained on
    kinds = tuple(k for k in FAMILIES[family].kinds if k in kinds)
    kind = rng.choices(kinds, [KIND_WEIGHTS[PAGE_KINDS.index(k)] for k in kinds])[0]
    return make_family_page(family, kind, rng.getrandbits(40), w, h)


# -----------------------------------------------------------------------------
# glances: whole pages at the gestalt's size


GLANCE_PAGES = 8  # at most this many pages a glance batch: each is drawn at its full size before it is shrunk, so a
# batch of image_tokens // 256 of them (32) cost the page workers 16x a large page's batch (run 37: the GPU waited for
# pages 75% of the time, 37-60 pages/s)
GLANCE_KINDS = ("box_word", "shape_colour")  # the kinds whose marks a glance can see: boxes' and shapes' colours
UNSEEN = ("word", "key") + DIGITS  # binding channels a glance cannot see (print): no targets there
ROWS, COLUMNS = ("top", "middle", "bottom"), ("left", "centre", "right")  # a page's thirds


def glance_pages(rng: random.Random, stage: Stage, family: str | None, w: int, h: int, image_tokens: int,
                 max_pages: int):
    """batch_pages' tuple for a glance batch: each page drawn at (w, h), then shown whole at the gestalt's size only
    (ARR's gestalt view: fit_grid at GESTALT_TOKENS, views.resize), one image block, with the questions that view
    answers (glance_questions); its tokens learn the colours and shapes they hold (binding's ink, shape and inside
    channels) and nothing of print (no reading targets, no word, key or digit targets). A normal VLM's
    mixed-resolution training; never sparse cells, never ARR. A family without box or shape pages: the suite's."""
    if family is not None and not set(FAMILIES[family].kinds) & set(GLANCE_KINDS):
        family = None
    grid = fit_grid(w, h, GESTALT_TOKENS)  # (rows, cols) of the glance's merged tokens
    size = (grid[1] * CELL, grid[0] * CELL)  # the glance's (width, height) in px
    empty = np.full_like(reading_targets([], *size), IGNORE)  # [cells, slots]: print unread
    images, conversations, readings, bindings, values = [], [], [], [], []
    while len(images) < min(max_pages, GLANCE_PAGES, max(2, image_tokens // math.prod(grid))):
        page = draw_page(rng, stage, family, w, h, GLANCE_KINDS)
        pool = glance_questions(page.marks, w, h)
        if not pool:
            continue
        images.append(make_views(page.image).pil("gestalt"))  # ARR's own gestalt view of the page, as uint8 RGB
        conversations.append(rng.sample(pool, rng.randint(1, min(stage.turns, len(pool)))))
        readings.append(empty)
        bindings.append(glance_bindings(page.marks, w, h, size))
        values.append({})
    return images, conversations, readings, False, bindings, values


def glance_bindings(marks, w: int, h: int, size: tuple[int, int]) -> np.ndarray:
    """binding_targets of a w x h page's marks shown at `size` (width, height): each mark's box scaled (outwards),
    its border at least 1 px; the UNSEEN channels IGNORE. int64 [cells, channels]."""
    sx, sy = size[0] / w, size[1] / h
    small = [replace(m, box=scaled(m.box, sx, sy), border=max(1, round(m.border * sx)) if m.border else 0)
             for m in marks]
    targets = binding_targets(small, *size)  # [cells, channels]
    targets[:, [CHANNELS.index(c) for c in UNSEEN]] = IGNORE
    return targets


def glance_questions(marks, w: int, h: int) -> list[tuple[str, str]]:
    """The questions a page's glance answers: where each box is, by its colour (the pointing loss points the answer
    at the box's tokens, as for "What word is in the red box?"), each shape's colour and each colour's shape; a
    colour or shape that two marks share is not asked."""
    boxes = [m for m in marks if m.kind == "box"]
    shapes = [m for m in marks if m.kind == "shape"]
    out = [(f"Where is the {m.colour} box?", where(m.box, w, h)) for m in boxes
           if [b.colour for b in boxes].count(m.colour) == 1]
    out += [(f"What colour is the {m.shape}?", m.colour) for m in shapes if [s.shape for s in shapes].count(m.shape) == 1]
    out += [(f"Which shape is {m.colour}?", m.shape) for m in shapes if [s.colour for s in shapes].count(m.colour) == 1]
    return out


def where(box, w: int, h: int) -> str:
    """A box's place on a w x h page by its centre's third: "top left", "top", ..., "centre", ..., "bottom right"."""
    row = ROWS[min(2, int(3 * (box[1] + box[3]) / 2 / h))]
    col = COLUMNS[min(2, int(3 * (box[0] + box[2]) / 2 / w))]
    return {("middle", "centre"): "centre"}.get((row, col), col if row == "middle" else row if col == "centre"
                                                else f"{row} {col}")


def scaled(box, sx: float, sy: float) -> tuple[int, int, int, int]:
    """A pixel box scaled by (sx, sy), rounded outwards: its marks keep at least one pixel."""
    return (math.floor(box[0] * sx), math.floor(box[1] * sy), max(math.floor(box[0] * sx) + 1, math.ceil(box[2] * sx)),
            max(math.floor(box[1] * sy) + 1, math.ceil(box[3] * sy)))


def family_page_size(rng: random.Random, family: str, area: int) -> tuple[int, int]:
    """A (width, height) in multiples of 28 px of about `area` px^2 in the family's aspect range."""
    a = rng.uniform(*FAMILIES[family].aspect)
    w = max(4, round(math.sqrt(area * a) / 28))
    return w * 28, max(4, round(area / (w * 28) / 28)) * 28


def reversed_questions(page) -> list[tuple[str, str]]:
    """Training-only questions that ask each of the page's targets the other way round: the box's colour from its
    word, the shape from its colour, the key from its value. They teach the LLM to read a mark's colour, shape or key
    off the tokens it holds, the binding that the suite's questions (word from colour, value from key) use
    in the opposite direction; the input and output embeddings are tied, so both directions share one code."""
    values = [m.text for m in page.marks if m.kind == "field"]
    out = []
    for m in page.marks:
        if m.kind == "box":
            out.append((f"What colour is the box around {m.text}?", m.colour))
        elif m.kind == "shape":
            out.append((f"Which shape is {m.colour}?", m.shape))
        elif m.kind == "field" and values.count(m.text) == 1:
            out.append((f"Which key has the value {m.text}?", m.key))
    return out


class PageStream(torch.utils.data.IterableDataset):
    """This process's batches of steps start, start+1, ... of one stage, drawn by the DataLoader's workers (worker
    k of n: every n-th step from start + k). Step i's global batch is batches i*world .. i*world + world-1, one a
    process: the same stream for the same world size (and by_area), resumed or not."""

    def __init__(self, folder: str, seed: int, stage: int, start: int, image_tokens: int, max_pages: int,
                 rank: int = 0, world: int = 1, by_area: bool = False):
        self.folder, self.seed, self.stage, self.start = folder, seed, stage, start
        self.image_tokens, self.max_pages, self.rank, self.world = image_tokens, max_pages, rank, world
        self.by_area = by_area  # batch_pages' page sizes

    def __iter__(self):
        from transformers import AutoTokenizer

        torch.set_num_threads(1)  # many workers: one thread each, or they thrash the cores
        info = torch.utils.data.get_worker_info()
        if info is not None:  # a DataLoader worker, not the training process itself (workers=0)
            os.nice(WORKER_NICENESS)
        k, n = (info.id, info.num_workers) if info else (0, 1)
        tokenizer = AutoTokenizer.from_pretrained(self.folder)
        step = self.start + k
        while True:
            index = step * self.world + self.rank
            yield collate(tokenizer, *batch_pages(index, self.seed, self.stage, self.image_tokens, self.max_pages,
                                                  self.world, self.by_area))
            step += n
