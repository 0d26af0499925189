"""
The stock baselines' one path: one view, the whole vision tower, one image block, generated with the fast
engine (our encoder and decoder) or, under the hf engine, transformers' own forward from pixels end to end
(the reference the fast engine is measured against). full.py, gestalt.py and budget.py each name their view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from arr_coc.pipelines.answer import Answer, Request, finish, generate, token_counts, views_for
from arr_coc.timing import Stopwatch, reset_peak_memory, timed_module

if TYPE_CHECKING:
    from arr_coc.model import ARRCOCQwen


@torch.no_grad()
def answer_view(model: ARRCOCQwen, pipeline: str, view_name: str, image, question: str, request: Request) -> Answer:
    """Answer from the view `view_name` of arr_coc.vlm.views.Views ("native", "gestalt", "budget")."""
    vlm = model.vlm
    watch = Stopwatch(vlm.device)
    reset_peak_memory(vlm.device)
    start = watch.now()
    with watch.section("vision"):
        views = views_for(vlm, model.pipeline, image, request.max_cells)
        view, grid = views.tensor(view_name), views.grid(view_name)  # [1, 3, h, w]
    n = grid[0] * grid[1]
    if vlm.engine == "fast":
        with watch.section("vision"):
            tokens = vlm.encode_view(view)  # [n, D]
        inputs = vlm.prompt(question, [tokens])
        generation, new_tokens = generate(vlm, inputs, watch, request)
    else:
        inputs = vlm.stock_inputs(question, view)
        before = watch.ms["vision"]
        with timed_module(vlm.visual, watch, "vision"):  # vision runs inside the stock prefill
            generation, new_tokens = generate(vlm, inputs, watch, request)
        watch.ms["prefill"] -= watch.ms["vision"] - before  # prefill excl. the vision tower inside it
    tokens = token_counts(inputs.length, n if view_name == "gestalt" else 0, 0, total_visual=n)
    return finish(vlm, pipeline, generation, new_tokens, tokens, watch, start, views, vlm.gflops([n], inputs.length))
