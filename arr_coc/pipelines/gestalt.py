"""
gestalt: the stock model on the low-res gestalt view alone (ARR with zero saccades).

    answer = pipelines.load("gestalt").answer(parts, image, "What is here?", Request())
"""

from arr_coc.pipelines.answer import Answer, Parts, Request
from arr_coc.pipelines.stock import answer_view

VIEW = "gestalt"  # the Views view this baseline reads


def answer(parts: Parts, image, question: str, request: Request) -> Answer:
    return answer_view(parts, "gestalt", VIEW, image, question, request)
