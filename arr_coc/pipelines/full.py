"""
full: the stock model as users run it: the native view, capped at max_cells cells, all its tokens.

    answer = pipelines.load("full").answer(parts, image, "What is here?", Request())
"""

from arr_coc.pipelines.answer import Answer, Parts, Request
from arr_coc.pipelines.stock import answer_view

VIEW = "native"  # the Views view this baseline reads


def answer(parts: Parts, image, question: str, request: Request) -> Answer:
    return answer_view(parts, "full", VIEW, image, question, request)
