"""
pocket-qwen2-vl's held-out check: the suite as specified (arr_coc.synth.fineprint.SPEC) on new seeds, native and
gestalt views, scored by teacher-forced exact match (every answer token the argmax: exactly when greedy decoding
produces the answer); under torchrun each process scores its shard.

    accuracy = evaluate_heldout(model, tokenizer, image_processor(), device, pages=96, sizes=(896, 1792))
    unseen = evaluate_heldout(model, tokenizer, image_processor(), device, 96, (896,), style=LAYOUTS)  # new layouts
"""

from __future__ import annotations

import random
from functools import lru_cache

import torch

from arr_coc import distributed
from arr_coc.pocket.data import CURRICULUM, GESTALT_TOKENS, IGNORE, collate, model_inputs
from arr_coc.synth.fineprint import PAGE_KINDS, SPEC, PageStyle, make_page
from arr_coc.vlm.views import fit_grid

EVAL_SEED = 10**9  # held-out pages use seeds from here on; training seeds stay far below


# -----------------------------------------------------------------------------
# held-out evaluation


def gestalt_view(image, max_tokens: int = GESTALT_TOKENS):
    """The image resized (aspect kept, multiples of 28) to at most max_tokens merged tokens: ARR's gestalt."""
    from PIL import Image

    gh, gw = fit_grid(image.width, image.height, max_tokens)
    return image.resize((gw * 28, gh * 28), Image.BICUBIC)


@lru_cache(maxsize=None)  # the same pages at every evaluation of a run: drawn once
def heldout(kind: str, size: int, n: int, stage: int | None = None,
            style: PageStyle | None = None) -> tuple[tuple, ...]:
    """n held-out (image, question, answer) of one kind at size x size, new seeds: in `style` if given (e.g.
    LAYOUTS, the layouts training never draws), else the stage's, else the suite as specified."""
    style = style or (SPEC if stage is None else CURRICULUM[stage].style)
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
                     process: distributed.Process | None = None, style: PageStyle | None = None) -> dict:
    """{size: {view: {kind: accuracy}}} on held-out pages, native and gestalt views (`pages` a kind), in `style`
    (default: the suite as specified)."""
    model.eval()
    result = {}
    for size in sizes:
        result[str(size)] = {}  # str keys: the same in memory and in state.json
        for view in ("full", "gestalt"):
            result[str(size)][view] = {}
            for kind in PAGE_KINDS:
                items = heldout(kind, size, pages, style=style)
                if view == "gestalt":
                    items = [(gestalt_view(im), q, a) for im, q, a in items]
                result[str(size)][view][kind] = exact_match(model, tokenizer, processor, items, device,
                                                            batch=4 if size > 1000 and view == "full" else 16,
                                                            process=process)
    model.train()
    return result
