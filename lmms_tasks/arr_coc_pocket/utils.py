"""
The pocket suite's lmms-eval task (arr_coc_pocket.yaml): each row of data/pocket-suite/data.jsonl (made by
`python -m arr_coc.eval.data --kinds fine_print,box_word,shape_colour --out data/pocket-suite`) read as evaluate
reads it: the image through arr_coc.vlm.images.open_image, the question as written, exact match as the metric.
"""

from pathlib import Path

from arr_coc.vlm.images import open_image
from arr_coc.eval.metrics import exact

DATA = Path("data/pocket-suite")  # the folder of the YAML's data_files, relative to where lmms-eval runs


def doc_to_visual(doc: dict) -> list:
    """The row's image (its path relative to data.jsonl's folder), decoded as evaluate decodes it."""
    return [open_image(DATA / doc["image"])]


def doc_to_text(doc: dict, lmms_eval_specific_kwargs: dict | None = None) -> str:
    """The question as written: evaluate's prompt for a JSONL set has no instruction."""
    return doc["question"]


def process_results(doc: dict, results: list[str]) -> dict:
    """Exact match of the answer with the row's answer (arr_coc.eval.metrics.exact, evaluate's `exact`)."""
    return {"exact_match": exact(results[0], [doc["answer"]])}
