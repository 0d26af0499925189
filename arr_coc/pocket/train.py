"""
pocket-qwen2-vl: a small stock Qwen2-VL trained here, from scratch, to read the fine-print suite (arr_coc.synth.fineprint).

It is the stock `Qwen2VLForConditionalGeneration` at a pocket size (ViT 6x256, LLM 4x256, ~10M parameters)
with its own byte-level BPE tokenizer (Qwen's special tokens and chat template, a vocabulary sized to the task),
trained as a normal VLM is: whole pages at mixed native sizes, laid out exactly as the stock image processor lays
them out (on the GPU; a test pins the two), in multi-turn conversations whose answers carry the loss; a share of
them opens with "Read the page." and the page's transcript, dense supervision of every glyph as OCR pre-training
gives. A share of conversations shows two images, the page's gestalt view (<= 256 tokens) and then the page, as
the real Qwen saw multi-image prompts in training; ARR's prompt has two image blocks. No sparse cells and no ARR:
ARR meets it as it meets the real Qwen.
Its answers are real on fine-print scenes and meaningless elsewhere.

Beside the answers, every visual token learns which characters its cell holds (arr_coc.pocket.reading, a training-only
head): without it the from-scratch ViT never learned glyphs at arbitrary sub-patch offsets. It also learns which
colour, shape, box and field its cell belongs to (arr_coc.pocket.binding), three of those in the LLM's own word
embeddings; a share of questions is asked the other way round (reversed_questions); and one attention head of
the LLM learns to look at each answer's target (arr_coc.pocket.pointing).
Training follows a curriculum (CURRICULUM) that moves on when the model reads each stage's own held-out pages:
large glyphs, few fields and small pages first; then smaller print and more clutter; then the suite as specified
(fineprint.SPEC) at 448-1792 px; a REVIEW share of batches comes from earlier stages. Pages are drawn by
many CPU workers (a DataLoader over an iterable of whole batches); batch i of a stage is a pure function of
(seed, stage, i), so a resumed run continues the same stream.
Held-out accuracy (new seeds, square 896 and 1792 px pages, per kind, native and gestalt views) is teacher-forced
exact match: every answer token is the argmax, which is exactly when greedy decoding produces the answer.

    torchrun --nproc-per-node 4 -m arr_coc.pocket.train --out runs/pocket --minutes 18 --resume   # 4 GPUs, resumable
    python -m arr_coc.pocket.train --out runs/pocket --minutes 8 --resume      # one GPU
    python -m arr_coc.pocket.train --out runs/pocket --export models/pocket-qwen2-vl --steps 0 --resume  # export
    python -m arr_coc.pocket.train --tokenizer-only --export models/pocket-qwen2-vl                        # tokenizer

The exported folder loads with stock transformers alone: AutoTokenizer (with its chat template),
AutoImageProcessor and Qwen2VLForConditionalGeneration.from_pretrained(folder).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from arr_coc import distributed
from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.eval.metrics import interval_text
from arr_coc.pocket.binding import BindingHead, aligned_count, aligned_ids, aligned_loss, binding_targets
from arr_coc.pocket.pointing import Pointing, pointing_targets, use_pointing_attention
from arr_coc.pocket.reading import MergerOutputHook, ReadingHead, glyph_targets
from arr_coc.synth.fineprint import BOX_WORDS, COLOURS, FILLER, KEYS, PAGE_KINDS, SHAPES, SPEC, PageStyle, make_page
from arr_coc.vlm.positions import mrope_position_ids, raster_block
from arr_coc.vlm.views import PIPELINE, fit_grid

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
SYSTEM_PROMPT = "You are a helpful assistant."
READ_PAGE = "Read the page."  # the transcription question: dense supervision of every glyph, as OCR pre-training
EVAL_SEED = 10**9  # held-out pages use seeds from here on; training seeds stay far below
IGNORE = -100
GESTALT_TOKENS = PIPELINE.gestalt_max_tokens  # ARR's gestalt view: at most this many merged tokens


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
CURRICULUM = (
    Stage((112, 224), (_LARGE,), turns=2, read=0.5, gate=("fine_print", "box_word")),
    Stage((168, 336), (_MEDIUM,), turns=4, read=0.5, gate=("fine_print", "box_word")),
    Stage((224, 560), (_MID,), turns=6, read=0.35, budget=300),
    Stage((336, 896), (_SMALLER, SMALL_PRINT), turns=8, read=0.25, budget=300),
    Stage((448, 1344), (SPEC, SMALL_PRINT), turns=8, read=0.15, budget=400),
    Stage((448, 1792), (SPEC, SMALL_PRINT), turns=8, read=0.1),  # the last stage: the suite at every size
)
PASS_MARK = 0.7  # a stage may end early when held-out exact match on its own pages reaches this on its gate kinds:
# its remaining errors (which field a key names) keep being trained on the next stage, whose pages hold more fields
REVIEW = 0.2  # share of batches drawn from an earlier stage than the current one, so that no stage is forgotten
KIND_WEIGHTS = (0.35, 0.5, 0.15)  # how often each of PAGE_KINDS is drawn: box_word, the kind the model binds worst, most
REVERSED = 0.3  # share of a page's training questions asked the other way round (reversed_questions)
GESTALT_FIRST = 0.2  # share of batches whose conversations show the page's gestalt view (<= 256 tokens) first, then
# the page: two image blocks, as ARR's prompt has (and as the real Qwen saw multi-image prompts in training)


@dataclass
class PocketConfig:
    """The pocket model's architecture (stock Qwen2-VL at a pocket size)."""
    vision_depth: int = 6  # ViT blocks
    vision_dim: int = 256  # ViT width
    vision_heads: int = 4  # ViT attention heads
    hidden_size: int = 256  # LLM width (the merger projects the ViT to it)
    layers: int = 4  # LLM decoder layers
    heads: int = 4  # LLM query heads (head_dim 64)
    kv_heads: int = 2  # LLM key/value heads (GQA, as Qwen2-VL)
    intermediate: int = 1024  # LLM MLP width
    vocab: int = 1024  # BPE vocabulary incl. special tokens


@dataclass
class TrainConfig:
    """One training run (resumable)."""
    out: str = "runs/pocket"  # run folder: weights, optimizer, state.json (resume point)
    seed: int = 0  # the data stream's seed
    steps: int = 10**9  # stop after this many steps in total ...
    minutes: float = 8.0  # ... or after this many minutes of this run, whichever comes first
    lr: float = 1e-3  # peak AdamW learning rate
    warmup: int = 300  # linear warm-up steps (after a resume too: the optimizer may be fresh)
    cooldown: float = 0.0  # decay the lr linearly to 5% over the run's last this many minutes (0: none)
    weight_decay: float = 0.05  # AdamW weight decay (matrices only)
    image_tokens: int = 8192  # image tokens per batch: B = image_tokens // tokens per page (bucketed sizes) ...
    max_pages: int = 96  # ... but at most this many pages (the first stage's pages are small)
    workers: int = 14  # page-drawing processes (per training process)
    eval_every: int = 300  # check the stage (held-out pages of its own) every this many steps
    eval_pages: int = 32  # held-out pages per kind and size (stage checks and the suite at the end of a run)
    eval_sizes: tuple[int, ...] = (896, 1792)  # held-out square page sides
    device: str = "cuda"  # where to train (under torchrun on CUDA, each process its own GPU)
    stage: int | None = None  # start at this curriculum stage (None: where the resumed state stands)
    init: str = str(POCKET_FOLDER)  # with resume and no run in `out` yet: continue from this exported folder


# -----------------------------------------------------------------------------
# tokenizer and model


def tokenizer_corpus() -> list[str]:
    """The text the pocket tokenizer is fitted on: every question and answer form, the chat frame, filler."""
    lines = [SYSTEM_PROMPT, "system", "user", "assistant", "What is in this image?", "Describe the image."]
    lines += [f"What is the value of {k}?" for k in KEYS] + [f"{k}: " for k in KEYS]
    lines += [f"What word is in the {c} box?" for c in COLOURS] + list(BOX_WORDS)
    lines += [f"What colour is the {s}?" for s in SHAPES] + list(COLOURS)
    lines += [" ".join(FILLER), "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,:;!?'\"()-"]
    return lines * 4


def build_tokenizer(vocab: int = PocketConfig.vocab):
    """A byte-level BPE (digits split one by one, as Qwen2's) with Qwen's special tokens and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from arr_coc.vlm.qwen2_vl import CHAT_TEMPLATE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tokenizer_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=None, model_max_length=32768)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model_config(tokenizer, arch: PocketConfig = PocketConfig()):
    """The stock Qwen2VLConfig at pocket size; every special id comes from the pocket tokenizer."""
    from transformers import Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    head_dim = arch.hidden_size // arch.heads
    section = [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]  # t, h, w halves: as Qwen's 16/24/24 of 64
    return Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=arch.hidden_size, intermediate_size=arch.intermediate,
                         num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
                         num_key_value_heads=arch.kv_heads, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=section),
                         tie_word_embeddings=True, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=arch.vision_depth, embed_dim=arch.vision_dim, num_heads=arch.vision_heads,
                           mlp_ratio=4, hidden_size=arch.hidden_size, hidden_act="quick_gelu", patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=True)


VISION_ATTENTION = "flash_same_size_pages"  # "flash" in the name: Qwen2-VL's ViT then hands over cu_seqlens whole


def same_size_pages_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
                              cu_seq_lens_q=None, **kwargs):
    """
    Qwen2-VL's vision attention for a batch of pages as one batched sdpa call per image size (one for a batch of
    same-size pages, two with their gestalt views): the same block-diagonal attention as the stock per-image loop
    (which launches 2 x images kernels per block), for training only. The stock ViT asks this of any attention
    whose name holds "flash"; registered under VISION_ATTENTION.
    """
    import torch.nn.functional as F

    _, heads, S, d = query.shape  # [1, H, S, d]: every image's patches, one image after another
    out = torch.empty_like(query)  # [1, H, S, d]
    for rows, n, size in _size_groups(cu_seq_lens_q):
        q, k, v = (t[0][:, rows].view(heads, n, size, d).transpose(0, 1) for t in (query, key, value))
        o = F.scaled_dot_product_attention(q, k, v, scale=scaling)  # [n, H, size, d]
        out[0][:, rows] = o.transpose(0, 1).reshape(heads, -1, d)
    return out.transpose(1, 2), None  # [1, S, H, d], as the interface returns


def _size_groups(cu_seqlens: torch.Tensor) -> list[tuple[torch.Tensor, int, int]]:
    """The images of cu_seqlens [n + 1] grouped by size: (their patch rows [n_size * size], n_size, size) per size."""
    bounds = cu_seqlens.tolist()
    starts, lengths = bounds[:-1], [b - a for a, b in zip(bounds, bounds[1:])]
    groups = []
    for size in sorted(set(lengths)):
        first = torch.tensor([a for a, n in zip(starts, lengths) if n == size], device=cu_seqlens.device)  # [n]
        groups.append(((first[:, None] + torch.arange(size, device=first.device)).flatten(), len(first), size))
    return groups


def use_same_size_pages_attention(model):
    """Switch the model's ViT to same_size_pages_attention (every batch must hold pages of one size)."""
    from transformers import AttentionInterface

    AttentionInterface.register(VISION_ATTENTION, same_size_pages_attention)
    model.config.vision_config._attn_implementation = VISION_ATTENTION
    return model


def image_processor():
    """Qwen2-VL's stock image processor (the PIL one: no torchvision needed), capped like the hub's at 16384 tokens."""
    from arr_coc.vlm.tiny import qwen2_vl_image_processor

    return qwen2_vl_image_processor(max_tokens=16384)


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


def collate(tokenizer, images, conversations, readings=None, gestalt_first: bool = False, bindings=None) -> dict:
    """
    Pages (PIL, one size, multiples of 28 px) + their conversations -> one right-padded batch: token ids, labels,
    attention mask, M-RoPE position ids and the pages as uint8 [B, H, W, 3]; with `readings` (each page's
    glyph_targets) also every visual token's reading targets, concatenated, and with `bindings` (each page's
    binding_targets) its binding targets and where each suite answer must look (pointing_targets: point_queries
    [P, 2], point_targets [P, L]). Pixels travel between processes as
    bytes, 8x smaller than the processor's float patches; `model_inputs` lays them out on the GPU exactly as the
    stock processor does. gestalt_first: each conversation shows the page's gestalt view (ARR's, <= 256 tokens,
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
    return batch


def model_inputs(batch: dict, processor, image_token_id: int, device) -> dict:
    """A collated batch -> Qwen2VLForConditionalGeneration's inputs on `device` (pixel patches as the processor's;
    with a gestalt grid, each page's gestalt view, then the page)."""
    from arr_coc.vlm.qwen2_vl import image_patches
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


def page_size(rng: random.Random, sides: tuple[int, int]) -> tuple[int, int]:
    """A (width, height) in multiples of 28 px within `sides`, aspect between 3:4 and 4:3."""
    lo, hi = sides[0] // 28, sides[1] // 28
    w = rng.randint(lo, hi)
    h = rng.randint(max(lo, math.ceil(w * 3 / 4)), min(hi, max(lo, math.floor(w * 4 / 3))))
    return w * 28, h * 28


def batch_pages(index: int, seed: int, stage: int, image_tokens: int, max_pages: int = TrainConfig.max_pages):
    """The pages, conversations, reading targets, gestalt_first flag and binding targets of training batch `index`
    at curriculum `stage` (a REVIEW share of batches from an earlier stage): a pure function of them. Under
    torchrun, process r of N takes batches r, r + N, r + 2N, ... (PageStream)."""
    rng = random.Random(f"arr_coc:pocket:{seed}:{stage}:{index}")
    s = CURRICULUM[rng.randrange(stage) if stage and rng.random() < REVIEW else stage]
    w, h = page_size(rng, s.sides)
    gestalt_first = rng.random() < GESTALT_FIRST
    tokens = w * h // 784 + (math.prod(fit_grid(w, h, GESTALT_TOKENS)) if gestalt_first else 0)  # per conversation
    n = min(max_pages, max(2, image_tokens // tokens))
    images, conversations, readings, bindings = [], [], [], []
    for _ in range(n):
        style = rng.choice(s.styles) if len(s.styles) > 1 else s.styles[0]
        page = make_page(rng.choices(PAGE_KINDS, KIND_WEIGHTS)[0], rng.getrandbits(40), w, h, style)
        pool = [(q.question, q.answer) for q in page.questions]
        for i, qa in enumerate(reversed_questions(page)[:len(pool)]):  # mark i is question i's target
            if rng.random() < REVERSED:
                pool[i] = qa
        k = rng.randint(1, min(s.turns, len(pool)))
        turns = rng.sample(pool, k)
        images.append(page.image)
        conversations.append([(READ_PAGE, page.transcript)] + turns if rng.random() < s.read else turns)
        readings.append(glyph_targets(page.glyphs, w, h))
        bindings.append(binding_targets(page.marks, w, h))
    return images, conversations, readings, gestalt_first, bindings


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
    process: the same stream for the same world size, resumed or not."""

    def __init__(self, folder: str, seed: int, stage: int, start: int, image_tokens: int, max_pages: int,
                 rank: int = 0, world: int = 1):
        self.folder, self.seed, self.stage, self.start = folder, seed, stage, start
        self.image_tokens, self.max_pages, self.rank, self.world = image_tokens, max_pages, rank, world

    def __iter__(self):
        from transformers import AutoTokenizer

        torch.set_num_threads(1)  # many workers: one thread each, or they thrash the cores
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info else (0, 1)
        tokenizer = AutoTokenizer.from_pretrained(self.folder)
        step = self.start + k
        while True:
            index = step * self.world + self.rank
            yield collate(tokenizer, *batch_pages(index, self.seed, self.stage, self.image_tokens, self.max_pages))
            step += n


# -----------------------------------------------------------------------------
# held-out evaluation


def gestalt_view(image, max_tokens: int = GESTALT_TOKENS):
    """The image resized (aspect kept, multiples of 28) to at most max_tokens merged tokens: ARR's gestalt."""
    from PIL import Image

    gh, gw = fit_grid(image.width, image.height, max_tokens)
    return image.resize((gw * 28, gh * 28), Image.BICUBIC)


@lru_cache(maxsize=None)  # the same pages at every evaluation of a run: drawn once
def heldout(kind: str, size: int, n: int, stage: int | None = None) -> tuple[tuple, ...]:
    """n held-out (image, question, answer) of one kind at size x size: spec style, or a stage's; new seeds."""
    style = SPEC if stage is None else CURRICULUM[stage].style
    out = []
    for i in range(n):
        page = make_page(kind, EVAL_SEED + size * 1000 + i, size, style=style)
        q = random.Random(f"arr_coc:pocket:eval:{kind}:{size}:{stage}:{i}").choice(page.questions)
        out.append((page.image, q.question, q.answer))
    return tuple(out)


@torch.no_grad()
def exact_match(model, tokenizer, processor, items, device, batch: int = 8,
                process: distributed.Process | None = None) -> float:
    """Share of items whose every answer token (and <|im_end|>) is the argmax under teacher forcing; under
    torchrun each process takes its shard of the items and the counts are summed."""
    correct, n = correct_count(model, tokenizer, processor, process.shard(items) if process else items, device, batch)
    if process is not None and process.distributed:
        correct, n = process.sum(torch.tensor([correct, n], dtype=torch.float64)).tolist()
    return correct / max(n, 1)


def correct_count(model, tokenizer, processor, items, device, batch: int = 8) -> tuple[int, int]:
    """(items answered exactly, items): teacher-forced exact match, which is exactly greedy decoding's."""
    correct = 0
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        collated = collate(tokenizer, [im for im, _, _ in chunk], [[(q, a)] for _, q, a in chunk])
        inputs = model_inputs(collated, processor, model.config.image_token_id, device)
        labels = inputs.pop("labels")
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(**inputs).logits  # [B, L, V]
        pred = logits[:, :-1].argmax(-1)  # [B, L-1] prediction of token t+1
        target = labels[:, 1:]
        ok = ((pred == target) | (target == IGNORE)).all(dim=1)
        correct += int(ok.sum())
    return correct, len(items)


def evaluate_heldout(model, tokenizer, processor, device, pages: int, sizes=(896, 1792),
                     process: distributed.Process | None = None) -> dict:
    """{size: {view: {kind: accuracy}}} on held-out pages, native and gestalt views (`pages` a kind)."""
    model.eval()
    result = {}
    for size in sizes:
        result[str(size)] = {}  # str keys: the same in memory and in state.json
        for view in ("full", "gestalt"):
            result[str(size)][view] = {}
            for kind in PAGE_KINDS:
                items = heldout(kind, size, pages)
                if view == "gestalt":
                    items = [(gestalt_view(im), q, a) for im, q, a in items]
                result[str(size)][view][kind] = exact_match(model, tokenizer, processor, items, device,
                                                            batch=4 if size > 1000 and view == "full" else 16,
                                                            process=process)
    model.train()
    return result


# -----------------------------------------------------------------------------
# training


HEAD_FILE = "reading_head.safetensors"  # the training-only ReadingHead, beside the run's weights
BINDING_FILE = "binding_head.safetensors"  # the training-only BindingHead, beside it
SHARD = "15MB"  # every saved file stays under 16 MiB (the device tool brings back no larger file)


def lr_at(step: int, resumed_at: int, cfg: TrainConfig, seconds_left: float = math.inf) -> float:
    """Linear warm-up from each (re)start, then a constant rate (the run length is not known in advance), then,
    with a cool-down, a linear decay to 5% over the run's last cfg.cooldown minutes: the weights to export settle."""
    cooldown = max(0.05, min(1.0, seconds_left / (cfg.cooldown * 60))) if cfg.cooldown else 1.0
    return cfg.lr * min(1.0, (step - resumed_at + 1) / cfg.warmup) * cooldown


class Trainee(nn.Module):
    """The VLM and its training-only heads as one module: what DistributedDataParallel wraps, so that one
    backward all-reduces every trained gradient."""

    def __init__(self, model, reading: ReadingHead, binding: BindingHead, aligned: dict[str, torch.Tensor]):
        super().__init__()
        self.model, self.reading, self.binding = model, reading, binding
        self.aligned = aligned  # aligned_ids(tokenizer): the binding channels also taught in the word embeddings

    def forward(self, inputs: dict, reading: torch.Tensor, binding: torch.Tensor,
                counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(answer, reading, binding) losses, each a sum over this process's batch divided by `counts` [5]: the
        global batch's label counts over the world size, so that DDP's mean of the processes' gradients is the
        gradient of the global batch's mean loss (exactly one process's over the same batch). The binding loss
        holds the binding head's, the aligned names' and the answers' pointing (arr_coc.pocket.pointing)."""
        model_inputs = {k: v for k, v in inputs.items() if not k.startswith("point_")}
        queries = inputs.get("point_queries", torch.zeros(0, 2, dtype=torch.long))
        with MergerOutputHook(self.model) as visual, Pointing(self.model, queries) as pointing:
            answer = self.model(**model_inputs, num_items_in_batch=counts[0]).loss
        reading_loss = self.reading(visual.value, reading, reduction="sum") / counts[1]
        embeddings = self.model.get_input_embeddings().weight.detach()  # [V, H] fixed: the visual tokens move
        binding_loss = (self.binding(visual.value, binding, reduction="sum") / counts[2]
                        + aligned_loss(visual.value, binding, embeddings, self.aligned) / counts[3]
                        + pointing.loss(inputs.get("point_targets", torch.zeros(0, 0, dtype=torch.bool))) / counts[4])
        return answer, reading_loss, binding_loss


def label_counts(inputs: dict, reading: torch.Tensor, binding: torch.Tensor,
                 process: distributed.Process) -> torch.Tensor:
    """The global batch's answer tokens, reading slots, binding labels, aligned binding labels (aligned_count) and
    pointing answers, over the world size: float [5]."""
    pointers = torch.tensor(len(inputs.get("point_queries", ())), device=binding.device)
    local = torch.stack([(inputs["labels"][:, 1:] != IGNORE).sum(), (reading != IGNORE).sum(),
                         (binding != IGNORE).sum(), aligned_count(binding), pointers]).double()  # [5]
    return (process.sum(local) / process.world_size).clamp(min=1).float()


def trained_parameters(model, head=None, binding=None) -> dict:
    """Every trained parameter by name: the VLM's, and the heads' (if any) under "reading_head." / "binding_head."."""
    named = dict(model.named_parameters())
    for prefix, module in (("reading_head", head), ("binding_head", binding)):
        if module is not None:
            named |= {f"{prefix}.{n}": p for n, p in module.named_parameters()}
    return named


def save_shards(tensors: dict[str, torch.Tensor], folder: Path, name: str, limit: int = 15 * 2**20):
    """`tensors` as name-00001.safetensors, ... each under `limit` bytes (the device tool's file limit)."""
    from safetensors.torch import save_file

    for old in folder.glob(f"{name}-*.safetensors"):
        old.unlink()
    shards, size = [{}], 0
    for key, t in tensors.items():
        if size and size + t.nbytes > limit:
            shards, size = shards + [{}], 0
        shards[-1][key], size = t.contiguous(), size + t.nbytes
    for i, shard in enumerate(shards):
        save_file(shard, folder / f"{name}-{i + 1:05d}.safetensors")


def load_shards(folder: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for path in sorted(folder.glob(f"{name}-*.safetensors")) for k, v in load_file(path).items()}


def save_heads(head, binding, folder: Path):
    from safetensors.torch import save_file

    save_file(head.state_dict(), folder / HEAD_FILE)
    save_file(binding.state_dict(), folder / BINDING_FILE)


def save_state(model, head, binding, optimizer, folder: Path, state: dict):
    """Weights (fp32), heads, optimizer moments and state.json, every file under 16 MiB: the resume point."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder / "weights", max_shard_size=SHARD)
    save_heads(head, binding, folder)
    moments = {}
    names = {p: n for n, p in trained_parameters(model, head, binding).items()}
    for p, s in optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            moments[f"{names[p]}.{key}"] = s[key]
        moments[f"{names[p]}.step"] = torch.as_tensor(s["step"], dtype=torch.float32).reshape(1)
    save_shards(moments, folder, "optimizer")
    (folder / "state.json").write_text(json.dumps(state, indent=1))


def load_state(model, head, binding, optimizer, folder: Path) -> dict:
    moments = load_shards(folder, "optimizer")
    for n, p in trained_parameters(model, head, binding).items():
        if f"{n}.exp_avg" in moments:
            optimizer.state[p] = dict(exp_avg=moments[f"{n}.exp_avg"].to(p.device),
                                      exp_avg_sq=moments[f"{n}.exp_avg_sq"].to(p.device),
                                      step=moments[f"{n}.step"].reshape(()).to(p.device))
    return json.loads((folder / "state.json").read_text())


def make_optimizer(model, cfg: TrainConfig, head=None, binding=None):
    params = list(trained_parameters(model, head, binding).values())
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW([dict(params=decay, weight_decay=cfg.weight_decay), dict(params=rest, weight_decay=0.0)],
                             lr=cfg.lr, betas=(0.9, 0.95), fused=cfg.device.startswith("cuda"))


def load_or_init(folder: Path, resume: bool, device, stage: int | None = None, init: Path = POCKET_FOLDER):
    """(model, reading head, tokenizer, state, binding head): the run's if resuming, else the exported folder `init`
    (with the heads it carries; by default the shipped model), else all fresh."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

    tok_folder = folder / "weights" if (folder / "weights" / "tokenizer.json").is_file() else init
    tokenizer = AutoTokenizer.from_pretrained(tok_folder)
    heads = None
    if resume and (folder / "state.json").is_file():
        model = Qwen2VLForConditionalGeneration.from_pretrained(folder / "weights", dtype=torch.float32)
        state, heads = json.loads((folder / "state.json").read_text()), folder
    elif resume and (init / "config.json").is_file():  # a new machine: continue from an exported folder
        model = Qwen2VLForConditionalGeneration.from_pretrained(init, dtype=torch.float32)
        state, heads = json.loads((init / "training_state.json").read_text()), init
    else:
        torch.manual_seed(0)
        model = Qwen2VLForConditionalGeneration._from_config(model_config(tokenizer), dtype=torch.float32)
        state = dict(step=0, stage=0, gpu_seconds=0.0, samples=0, curve=[], runs=[])
    model.config._attn_implementation = "sdpa"
    torch.manual_seed(1)  # the heads start alike on every process
    head, binding = ReadingHead(model.config.vision_config.hidden_size), BindingHead(model.config.vision_config.hidden_size)
    for module, name in ((head, HEAD_FILE), (binding, BINDING_FILE)):
        saved = load_file(heads / name) if heads is not None and (heads / name).is_file() else {}
        if saved and all(saved.get(k, torch.empty(0)).shape == v.shape for k, v in module.state_dict().items()):
            module.load_state_dict(saved)
        elif saved:  # a head of another shape (its targets changed): this one starts fresh
            print(f"pocket: {name} was saved for other targets; starting it afresh", flush=True)
    state.setdefault("stage", 0)
    state.setdefault("stage_start", state["step"])  # a state from before the step budgets: its stage starts now
    if stage is not None and stage != state["stage"]:  # --stage: start (or go back) at this curriculum stage
        state["stage"], state["stage_start"] = stage, state["step"]
    model = use_pointing_attention(use_same_size_pages_attention(model))
    return model.to(device).train(), head.to(device), tokenizer, state, binding.to(device)


def train(cfg: TrainConfig, resume: bool, process: distributed.Process | None = None) -> dict:
    """Train until cfg.minutes or cfg.steps; under torchrun data-parallel (each process its own batches and
    page workers, gradients all-reduced), with rank 0 writing the run folder."""
    from torch.nn.parallel import DistributedDataParallel

    process = process or distributed.start(cfg.device)
    device = torch.device(process.device)
    folder = Path(cfg.out)
    model, head, tokenizer, state, binding = load_or_init(folder, resume, device, cfg.stage, Path(cfg.init))
    optimizer = make_optimizer(model, cfg, head, binding)
    if resume and (folder / "state.json").is_file():
        load_state(model, head, binding, optimizer, folder)
    trainee = Trainee(model, head, binding, aligned_ids(tokenizer))
    trainee = DistributedDataParallel(trainee) if process.distributed else trainee
    if process.is_main:
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(folder / "weights")
    process.barrier()  # the page workers read the tokenizer from the run folder
    processor = image_processor()
    run = dict(start=state["step"], t0=time.time(), seen=0)
    process.log(f"pocket: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, step {state['step']}, "
                f"stage {state['stage']}, {state['gpu_seconds'] / 60:.1f} GPU-minutes so far, "
                f"{process.world_size} process(es)")
    while _train_stage(trainee, model, optimizer, tokenizer, processor, cfg, state, run, process):
        pass  # the stage ended: the next one draws its own pages
    elapsed = time.time() - run["t0"]
    seen = int(process.sum(torch.tensor(run["seen"])).item())
    if device.type == "cuda":  # a CPU run (a test, a smoke run) is no GPU time
        state["gpu_seconds"] += elapsed * process.world_size
    state["samples"] += seen
    _evaluate(model, tokenizer, processor, device, cfg, state, process)
    state["runs"].append(dict(steps=state["step"] - run["start"], seconds=round(elapsed, 1), gpus=process.world_size,
                              pages_per_second=round(seen / elapsed, 1),
                              device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"))
    if process.is_main:
        save_state(model, head, binding, optimizer, folder, state)
    process.barrier()
    return state


def _train_stage(trainee, model, optimizer, tokenizer, processor, cfg: TrainConfig, state: dict, run: dict,
                 process: distributed.Process) -> bool:
    """Train on the current stage's pages until time or steps run out (False) or the stage ends (True)."""
    device = torch.device(process.device)
    stream = PageStream(str(Path(cfg.out) / "weights"), cfg.seed, state["stage"], state["step"], cfg.image_tokens,
                        cfg.max_pages, process.rank, process.world_size)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=cfg.workers,
                                         prefetch_factor=4 if cfg.workers else None, pin_memory=device.type == "cuda")
    losses, waited, last = [], 0.0, time.time()
    window = (time.time(), run["seen"])  # the pages/s of the last 100 steps: the steady rate, without start-up
    for batch in loader:
        waited += time.time() - last  # the GPU idles while the page workers catch up
        # every process stops at the same step: rank 0's clock decides
        out_of_time = process.sum(torch.tensor(float(time.time() - run["t0"] > cfg.minutes * 60
                                                     and process.is_main))).item() > 0
        if state["step"] >= cfg.steps or out_of_time:
            return False
        lr = lr_at(state["step"], run["start"], cfg, cfg.minutes * 60 - (time.time() - run["t0"]))
        inputs = model_inputs(batch, processor, model.config.image_token_id, device)
        loss = _train_step(trainee, optimizer, inputs, lr, batch["reading"].to(device, non_blocking=True),
                           batch["binding"].to(device, non_blocking=True), process)
        if loss is None:  # a bf16 blow-up: the step was skipped, the weights kept
            state["skipped"] = state.get("skipped", 0) + 1
        else:
            losses.append(loss)
        run["seen"] += batch["input_ids"].shape[0]
        state["step"] += 1
        if state["step"] % 100 == 0 and process.is_main:
            answer, reading, bound = np.mean(losses, axis=0) if losses else (float("nan"),) * 3
            elapsed, rate = time.time() - run["t0"], (run["seen"] - window[1]) / (time.time() - window[0])
            window = (time.time(), run["seen"])
            process.log(f"step {state['step']} loss {answer:.4f} reading {reading:.4f} binding {bound:.4f} "
                        f"lr {lr:.2e} stage {state['stage']} {rate * process.world_size:.0f} pages/s "
                        f"(last 100 steps), waiting for pages {waited / elapsed:.0%} of the time")
            state["curve"].append(dict(step=state["step"], loss=round(answer, 4), reading=round(reading, 4),
                                       binding=round(bound, 4)))
            losses = []
        if _stage_ends(model, tokenizer, processor, cfg, state, process):
            return True
        last = time.time()
    return False


def _stage_ends(model, tokenizer, processor, cfg: TrainConfig, state: dict, process: distributed.Process) -> bool:
    """The stage ends on its step budget, or when a check (every cfg.eval_every steps: held-out exact match on its
    own pages, square, its middle size) reaches PASS_MARK on its gate kinds. The last stage never ends."""
    stage = state["stage"]
    if stage == len(CURRICULUM) - 1:
        return False
    if state["step"] - state["stage_start"] >= CURRICULUM[stage].budget:
        ended, why = True, f"its budget of {CURRICULUM[stage].budget} steps"
    elif state["step"] % cfg.eval_every == 0:
        side = sum(CURRICULUM[stage].sides) // 2 // 28 * 28
        device = torch.device(process.device)
        model.eval()
        accuracy = {kind: exact_match(model, tokenizer, processor, heldout(kind, side, cfg.eval_pages, stage), device,
                                      process=process) for kind in PAGE_KINDS}
        model.train()
        ended, why = min(accuracy[k] for k in CURRICULUM[stage].gate) >= PASS_MARK, f"its check at {PASS_MARK}"
        state.setdefault("stage_checks", []).append(dict(step=state["step"], stage=stage, side=side,
                                                         accuracy=accuracy))
        if process.is_main:
            process.log(f"stage {stage} check at step {state['step']} ({side} px): {json.dumps(accuracy)}")
    else:
        return False
    if ended:
        state.setdefault("stage_ends", []).append(dict(stage=stage, step=state["step"], why=why))
        if process.is_main:
            process.log(f"stage {stage} ends at step {state['step']} ({why}) -> stage {stage + 1}")
        state["stage"], state["stage_start"] = stage + 1, state["step"]
    return ended


def backward(trainee, inputs: dict, reading: torch.Tensor, binding: torch.Tensor,
             process: distributed.Process) -> tuple[torch.Tensor, ...]:
    """The losses of this process's batch, normalised by the global batch's label counts, and their backward:
    under DDP the gradients arrive averaged over processes, i.e. the global batch's. (answer, reading, binding)."""
    counts = label_counts(inputs, reading, binding, process)  # [5]
    with torch.autocast(inputs["input_ids"].device.type, dtype=torch.bfloat16, enabled=inputs["input_ids"].is_cuda):
        losses = trainee(inputs, reading, binding, counts)
    sum(losses).backward()
    return losses


def _train_step(trainee, optimizer, inputs: dict, lr: float, reading: torch.Tensor, binding: torch.Tensor,
                process: distributed.Process | None = None) -> tuple[float, float, float] | None:
    """One AdamW step on the answer loss plus the dense reading and binding losses of every visual token;
    (answer, reading, binding) losses of this process's batch, or None (and no update, on every process alike)
    if the gradient is not finite."""
    process = process or distributed.Process(0, 1, str(inputs["input_ids"].device))
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    losses = backward(trainee, inputs, reading, binding, process)
    norm = torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
    if not torch.isfinite(norm):  # the same on every process: the gradients were all-reduced
        return None
    optimizer.step()
    return tuple(float(loss.detach()) for loss in losses)


def _evaluate(model, tokenizer, processor, device, cfg, state, process: distributed.Process | None = None):
    """The suite as specified (held-out, every kind, native and gestalt views): the model card's curve."""
    accuracy = evaluate_heldout(model, tokenizer, processor, device, cfg.eval_pages, cfg.eval_sizes, process)
    state.setdefault("heldout", []).append(dict(step=state["step"], stage=state["stage"], pages=cfg.eval_pages,
                                                accuracy=accuracy))
    for size, views in accuracy.items():
        for view, kinds in views.items():
            cells = [f"{kind} {interval_text(round(acc * cfg.eval_pages), cfg.eval_pages)}" for kind, acc in kinds.items()]
            if process is None or process.is_main:
                print(f"eval step {state['step']} {size} px {view}: " + ", ".join(cells), flush=True)

# -----------------------------------------------------------------------------
# export


def export(run: Path, out: Path):
    """The run's weights as a hub folder: bf16 safetensors in <16 MB shards, tokenizer, processor, card."""
    from transformers import AutoTokenizer, GenerationConfig, Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(run / "weights", dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(run / "weights")
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.pad_token_id, pad_token_id=tokenizer.pad_token_id,
                                               eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
                                               do_sample=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size="15MB")
    tokenizer.save_pretrained(out)
    image_processor().save_pretrained(out)
    state = json.loads((run / "state.json").read_text())
    (out / "training_state.json").write_text(json.dumps(state, indent=1))
    for head in (HEAD_FILE, BINDING_FILE):  # training-only (stock loading never reads them): the next run resumes
        if (run / head).is_file():
            (out / head).write_bytes((run / head).read_bytes())
    return out


def exported_folder(path: str) -> str:
    """--init: a folder that `--export` wrote (its config and training state), or an argparse error."""
    if not all((Path(path) / name).is_file() for name in ("config.json", "training_state.json")):
        raise argparse.ArgumentTypeError(f"{path} is not an exported pocket folder (config.json, training_state.json)")
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=TrainConfig.out, help="run folder (weights, optimizer, state.json)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out, else from the shipped models/pocket-qwen2-vl, else start fresh")
    parser.add_argument("--minutes", type=float, default=TrainConfig.minutes, help="stop after this many minutes")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps, help="stop at this total step count")
    parser.add_argument("--lr", type=float, default=TrainConfig.lr, help="peak learning rate")
    parser.add_argument("--cooldown", type=float, default=TrainConfig.cooldown,
                        help="decay the lr to 5%% over the run's last this many minutes (before an export)")
    parser.add_argument("--image-tokens", type=int, default=TrainConfig.image_tokens, help="image tokens per batch")
    parser.add_argument("--workers", type=int, default=TrainConfig.workers, help="page-drawing worker processes")
    parser.add_argument("--eval-every", type=int, default=TrainConfig.eval_every, help="stage check interval (steps)")
    parser.add_argument("--max-pages", type=int, default=TrainConfig.max_pages, help="at most this many pages a batch")
    parser.add_argument("--eval-pages", type=int, default=TrainConfig.eval_pages, help="held-out pages per kind and size")
    parser.add_argument("--eval-sizes", default="896,1792", help="held-out square page sides, comma-separated")
    parser.add_argument("--seed", type=int, default=TrainConfig.seed, help="the training data stream's seed")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    parser.add_argument("--stage", type=int, default=None, choices=range(len(CURRICULUM)),
                        help="start at this curriculum stage (default: where the resumed run stands)")
    parser.add_argument("--init", type=exported_folder, default=TrainConfig.init,
                        help="with --resume and no run in --out yet: continue from this exported folder")
    parser.add_argument("--export", default=None, help="after training, write the hub folder here")
    parser.add_argument("--tokenizer-only", action="store_true", help="only build the tokenizer into --export")
    args = parser.parse_args(argv)
    if args.tokenizer_only:
        build_tokenizer().save_pretrained(args.export or POCKET_FOLDER)
        return
    cfg = TrainConfig(out=args.out, seed=args.seed, steps=args.steps, minutes=args.minutes, lr=args.lr,
                      cooldown=args.cooldown, image_tokens=args.image_tokens, max_pages=args.max_pages,
                      workers=args.workers, eval_every=args.eval_every, eval_pages=args.eval_pages, device=args.device,
                      stage=args.stage, init=args.init,
                      eval_sizes=tuple(int(v) for v in args.eval_sizes.split(",")))
    process = distributed.start(cfg.device)
    if args.steps > 0 or not (Path(args.out) / "state.json").is_file():
        state = train(cfg, args.resume, process)
        process.log(f"done: step {state['step']}, {state['gpu_seconds'] / 60:.1f} GPU-minutes in all")
    if args.export and process.is_main:
        print(f"exported to {export(Path(args.out), Path(args.export))}")
    distributed.finish(process)


if __name__ == "__main__":
    main()
