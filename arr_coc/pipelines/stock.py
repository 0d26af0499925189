"""
The stock baselines' one path: one view, the whole vision tower, one image block, generated with the fast
engine (our encoder and decoder) or, under the hf engine, transformers' own forward from pixels end to end
(the reference the fast engine is measured against): steps.read_view, which ARR takes too where the native view
holds no more cells than it would read (arr_scene.native_reason). The pipelines full, gestalt and budget are this
module's functions of those names, each naming its view (their records: arr_coc/pipelines/declared/); the budget
view is sized to what ARR's LLM reads at the request's budget (arr_scene.arr_visual_tokens), so a budget sweep moves
it with ARR.

The published token reducers (divprune.py, visionzip.py) share a second path, answer_reduced: the whole native
view through the vision tower, then a reducer keeps N of its tokens at their places, N being what ARR's LLM
reads at the same budget (arr_scene.arr_visual_tokens). The Answer names the places it kept (Answer.kept) and,
for VisionZip, those that hold merged context (Answer.merged): the app draws them beside ARR's saccades.
"""

from dataclasses import replace
from typing import Callable

import torch

from arr_coc.pipelines.answer import TokenCounts
from arr_coc.pipelines.arr_scene import arr_visual_tokens
from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.steps import finish, generate, read_view, start_watch
from arr_coc.vlm.views import Views, fit_grid


@torch.no_grad()
def answer_view(parts: Parts, pipeline: str, view_name: str, views: Views, question: str, request: Request):
    """Answer from the view `view_name` of the image's views ("native", "gestalt", "budget"): its tokens as they
    come, then its Answer (steps.read_view)."""
    watch, start = start_watch(parts.vlm.device)
    if view_name == "budget":  # about as many tokens as ARR reads at this budget (529 at the default 273)
        with watch.section("vision"):
            n_arr = arr_visual_tokens(parts, views, request, question)
            views = replace(views, budget_grid=fit_grid(views.image.width, views.image.height, n_arr))
    yield from read_view(parts, pipeline, view_name, views, question, request, watch, start)


def full(parts: Parts, views: Views, question: str, request: Request):
    """full: the stock model as users run it: the native view, capped at max_cells cells, all its tokens."""
    return answer_view(parts, "full", "native", views, question, request)


def gestalt(parts: Parts, views: Views, question: str, request: Request):
    """gestalt: the stock model on the low-res gestalt view alone (ARR with zero saccades)."""
    return answer_view(parts, "gestalt", "gestalt", views, question, request)


def budget(parts: Parts, views: Views, question: str, request: Request):
    """budget: the stock model on one view resized to about ARR's token count at the request's budget (gestalt +
    saccades: 529 at the default 273 saccades on a square image)."""
    return answer_view(parts, "budget", "budget", views, question, request)


@torch.no_grad()
def answer_reduced(parts: Parts, pipeline: str, views: Views, question: str, request: Request,
                   encode: Callable, reduce: Callable):
    """
    A token reducer's answer: the whole native view through the vision tower (encode(vlm, view) -> VisualTokens
    and what reduce reads), then reduce(tokens, read, n) -> (n of them at their places, the places [C, 2] of
    merged ones or None), n = arr_visual_tokens (all of them when the view has fewer), one image block, the fast
    engine's prompt. Yields its tokens as they come, then its Answer.
    """
    vlm = parts.vlm
    watch, start = start_watch(vlm.device)
    with watch.section("vision"):
        every, read = encode(vlm, views.tensor("native"))  # [K, D]
    with watch.section("selection"):
        n = min(arr_visual_tokens(parts, views, request, question), len(every))  # as many tokens as ARR reads
        kept, merged = reduce(every, read, n)  # [n, D]
    yield None
    prompt = vlm.prompt(question, [kept])
    generation, new_tokens = yield from generate(vlm, prompt, watch, request)
    tokens = TokenCounts.of_prompt(prompt.length, 0, 0, total_visual=len(kept))
    yield finish(vlm, pipeline, generation, new_tokens, tokens, watch, start, views,
                  vlm.gflops([len(every)], prompt.length), kept=kept.positions, merged=merged)
