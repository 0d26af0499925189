"""
budget: the stock model on one view resized to about ARR's token count at the request's budget (gestalt +
saccades: 529 at the default 273 saccades on a square image; arr_coc.pipelines.stock.answer_view).

    answer = pipelines.load("budget").answer(model, image, "What is here?", Request())
"""

from arr_coc.pipelines.answer import Answer, Request
from arr_coc.pipelines.stock import answer_view

VIEW = "budget"  # the Views view this baseline reads


def answer(model, image, question: str, request: Request) -> Answer:
    return answer_view(model, "budget", VIEW, image, question, request)
