"""
pocket-qwen2-vl's held-out check: the suite as specified (arr_coc.synth.fineprint.SPEC) on new seeds, native and
gestalt views, scored by teacher-forced exact match (every answer token the argmax: exactly when greedy decoding
produces the answer); under torchrun each process scores its shard.

    accuracy = evaluate_heldout(model, tokenizer, image_processor(), device, pages=96, sizes=(896, 1792))
    unseen = evaluate_heldout(model, tokenizer, image_processor(), device, 96, (896,), style=LAYOUTS)  # new layouts
    by_group = evaluate_families(model, tokenizer, image_processor(), device, pages=96, sizes=(896, 1792))

    python -m arr_coc.pocket.heldout --model models/pocket-qwen2-vl --pages 96 --sizes 896,1792 --out f.json
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from arr_coc.runtime import distributed
from arr_coc.flags import bounded_int, comma_list, config_parser, device_flag, flag, int_list, names, parse_config
from arr_coc.pocket.data import CURRICULUM, GESTALT_TOKENS, IGNORE, collate, model_inputs
from arr_coc.synth.families import FAMILIES, HELD_OUT, TRAINED, family_size, make_family_page
from arr_coc.synth.fineprint import PAGE_KINDS, SPEC, PageStyle, make_page
from arr_coc.vlm.views import fit_grid

EVAL_SEED = 10**9  # held-out pages use seeds from here on; training seeds stay far below
GROUPS = {  # the layout-family groups every accuracy table reports apart
    "trained": TRAINED,
    "held-out sparse": tuple(f for f in HELD_OUT if not FAMILIES[f].dense),
    "held-out dense": tuple(f for f in HELD_OUT if FAMILIES[f].dense),
}


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


@lru_cache(maxsize=None)
def family_items(group: str, kind: str, size: int, n: int, workers: int = 1, first: int = 0) -> tuple[tuple, ...]:
    """n (image, question, answer) of `kind` on pages of the group's families that carry it (in turn), each of
    about size^2 px in its family's aspect, new seeds (pages first .. first+n-1); drawn by `workers` processes."""
    families = tuple(f for f in GROUPS[group] if kind in FAMILIES[f].kinds)
    jobs = [(group, families[i % len(families)], kind, size, i) for i in range(first, first + n if families else 0)]
    if workers <= 1:
        return tuple(map(_family_item, jobs))
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers) as pool:
        return tuple(pool.map(_family_item, jobs, chunksize=4))


def _family_item(job: tuple) -> tuple:
    group, family, kind, size, i = job
    seed = EVAL_SEED + size * 1000 + i
    page = make_family_page(family, kind, seed, *family_size(family, seed, size))
    q = random.Random(f"arr_coc:pocket:eval:{group}:{kind}:{size}:{i}").choice(page.questions)
    return page.image, q.question, q.answer


@torch.no_grad()
def exact_match(model, tokenizer, processor, items, device, batch: int = 8,
                process: distributed.Process | None = None) -> float:
    """Share of items whose every answer token (and <|im_end|>) is the argmax under teacher forcing; under
    torchrun each process takes its shard of the items and the counts are summed."""
    correct, n = summed_count(model, tokenizer, processor, items, device, batch, process)
    return correct / max(n, 1)


def summed_count(model, tokenizer, processor, items, device, batch: int = 8,
                 process: distributed.Process | None = None) -> tuple[int, int]:
    """correct_count over every process's shard of the items (torchrun), summed: (answered exactly, items)."""
    correct, n = correct_count(model, tokenizer, processor, process.shard(items) if process else items, device, batch)
    if process is not None and process.distributed:
        correct, n = process.sum(torch.tensor([correct, n], dtype=torch.float64)).tolist()
    return int(correct), int(n)


def correct_count(model, tokenizer, processor, items, device, batch: int = 8) -> tuple[int, int]:
    """(items answered exactly, items): teacher-forced exact match, which is exactly greedy decoding's."""
    correct = 0
    by_size: dict[tuple[int, int], list] = {}
    for item in items:  # a batch holds pages of one size
        by_size.setdefault(item[0].size, []).append(item)
    chunks = [same[i:i + batch] for same in by_size.values() for i in range(0, len(same), batch)]
    for chunk in chunks:
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


def evaluate_families(model, tokenizer, processor, device, pages: int, sizes=(896, 1792),
                      process: distributed.Process | None = None, workers: int = 1, first: int = 0,
                      groups=tuple(GROUPS)) -> dict:
    """{group: {size: {view: {kind: [correct, n]}}}} over `groups` of layout families, native and gestalt views
    (pages first .. first+pages-1, drawn by `workers` processes)."""
    model.eval()
    result = {}
    for group in groups:
        result[group] = {}
        for size in sizes:
            result[group][str(size)] = {"full": {}, "gestalt": {}}
            for kind in PAGE_KINDS:
                items = family_items(group, kind, size, pages, workers, first)
                if not items:
                    continue
                for view in ("full", "gestalt"):
                    shown = [(gestalt_view(im), q, a) for im, q, a in items] if view == "gestalt" else list(items)
                    result[group][str(size)][view][kind] = list(summed_count(
                        model, tokenizer, processor, shown, device, 4 if size > 1000 and view == "full" else 16, process))
    model.train()
    return result


@dataclass
class HeldoutConfig:
    """`python -m arr_coc.pocket.heldout`'s flags, each field one (arr_coc.flags.flag)."""
    model: str = flag("models/pocket-qwen2-vl", "an exported pocket folder")
    pages: int = flag(96, "pages a kind, size and family group", bounded_int(1, 10**5))
    sizes: list[int] = flag([896, 1792], "page areas (about size^2 px), comma-separated", int_list(112, 8192))
    device: str | None = device_flag(torchrun=True)
    workers: int | None = flag(None, "page-drawing processes (default: the CPU count, at most 16)",
                               bounded_int(0, 256))
    first: int = flag(0, "index of the first page a row draws (a later start draws pages no earlier check saw)",
                      bounded_int(0, 10**5))
    groups: str = flag(",".join(GROUPS), "family groups to score, comma-separated", comma_list(tuple(GROUPS)))
    out: str | None = flag(None, "write the counts here as JSON")


def main(argv=None) -> dict:
    """Score an exported pocket folder on the layout-family groups; print one line a row, write JSON."""
    import json

    from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

    from arr_coc.pocket.model import image_processor
    from arr_coc.eval.intervals import interval_text

    args = parse_config(HeldoutConfig, argv, config_parser(HeldoutConfig, __doc__))
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.workers = min(16, os.cpu_count() or 1) if args.workers is None else args.workers
    device = torch.device(args.device)
    model = Qwen2VLForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32).to(device)
    result = evaluate_families(model, AutoTokenizer.from_pretrained(args.model), image_processor(), device,
                               args.pages, tuple(args.sizes), workers=args.workers, first=args.first,
                               groups=tuple(names(args.groups)))
    for group, by_size in result.items():
        for size, views in by_size.items():
            for view, kinds in views.items():
                print(f"{group} {size} {view}: " + ", ".join(f"{k} {interval_text(c, n)}" for k, (c, n) in kinds.items()),
                      flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(model=args.model, pages=args.pages, first=args.first, result=result),
                                              indent=1))
    return result


if __name__ == "__main__":
    main()
