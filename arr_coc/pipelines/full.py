"""
full: the stock model as users run it: the native view, capped at max_cells cells, all its tokens.

    answer = pipelines.load("full").answer(parts, views, "What is here?", Request())   # its tokens, then its Answer
"""

from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.stock import answer_view
from arr_coc.vlm.views import Views

VIEW = "native"  # the Views view this baseline reads


def answer(parts: Parts, views: Views, question: str, request: Request):
    return answer_view(parts, "full", VIEW, views, question, request)
