"""
gestalt: the stock model on the low-res gestalt view alone (ARR with zero saccades).

    answer = pipelines.load("gestalt").answer(model, image, "What is here?", Request())
"""

from arr_coc.pipelines.answer import Answer, Request
from arr_coc.pipelines.stock import answer_view

VIEW = "gestalt"  # the Views view this baseline reads


def answer(model, image, question: str, request: Request) -> Answer:
    return answer_view(model, "gestalt", VIEW, image, question, request)
