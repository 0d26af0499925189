"""
pixelprune_n: PixelPrune at ARR's token count (arr_coc/pipelines/pixelprune.py has the method): of the cells its
predictive coder keeps, the n most unique (each one's distance to the nearest other kept cell), n being what ARR's
LLM reads at the same budget (all of them when fewer are unique), encoded at their true places.

    answer = finished(pipelines.load("pixelprune_n").answer(parts, views, "What is here?", Request(budget=273)))
"""

from arr_coc.pipelines.pixelprune import answer_pruned
from arr_coc.pipelines.request import Parts, Request
from arr_coc.vlm.views import Views


def answer(parts: Parts, views: Views, question: str, request: Request):
    return answer_pruned(parts, "pixelprune_n", views, question, request, at_arr_count=True)
