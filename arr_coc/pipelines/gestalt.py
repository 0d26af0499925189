"""
gestalt: the stock model on the low-res gestalt view alone (ARR with zero saccades).

    answer = pipelines.load("gestalt").answer(parts, views, "What is here?", Request())   # its tokens, then its Answer
"""

from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.stock import answer_view
from arr_coc.vlm.views import Views

VIEW = "gestalt"  # the Views view this baseline reads


def answer(parts: Parts, views: Views, question: str, request: Request):
    return answer_view(parts, "gestalt", VIEW, views, question, request)
