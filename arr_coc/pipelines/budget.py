"""
budget: the stock model on one view resized to about ARR's token count at the request's budget (gestalt +
saccades: 529 at the default 273 saccades on a square image; arr_coc.pipelines.stock.answer_view).

    answer = pipelines.load("budget").answer(parts, views, "What is here?", Request())   # its tokens, then its Answer
"""

from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.stock import answer_view
from arr_coc.vlm.views import Views

VIEW = "budget"  # the Views view this baseline reads


def answer(parts: Parts, views: Views, question: str, request: Request):
    return answer_view(parts, "budget", VIEW, views, question, request)
