"""
budget: the stock model on one view resized to about ARR's token count at the request's budget (gestalt +
saccades: 529 at the default 273 saccades on a square image; arr_coc.pipelines.stock.answer_view).

    answer = pipelines.load("budget").answer(parts, image, "What is here?", Request())
"""

from arr_coc.pipelines.answer import Answer, Parts, Request
from arr_coc.pipelines.stock import answer_view

VIEW = "budget"  # the Views view this baseline reads


def answer(parts: Parts, image, question: str, request: Request) -> Answer:
    return answer_view(parts, "budget", VIEW, image, question, request)
