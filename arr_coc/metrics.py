"""
How answers and selections are scored, in one place for evaluate.py, train.py and the app's A/B tab.

    is_correct("The total is 4,821.", "4 821")   # True: the expected words appear, case and punctuation aside
    answers_agree("A  teaspoon.", "a teaspoon")  # True: the same normalised text
    recall, precision = box_recall_precision(coverage, indices)
"""

import re


def normalise(text: str) -> str:
    """Lower case, every run of non-alphanumerics one space: the one normaliser every comparison uses."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def is_correct(prediction: str, expected: str) -> bool:
    """The expected answer appears in the prediction as whole words, ignoring case and punctuation."""
    return bool(normalise(expected)) and f" {normalise(expected)} " in f" {normalise(prediction)} "


def answers_agree(a: str, b: str) -> bool:
    """Two answers say the same, ignoring case, spacing and punctuation."""
    return normalise(a) == normalise(b)


def box_recall_precision(coverage, indices) -> tuple[float, float]:
    """Share of the box's cells that got a saccade, and share of the saccades on the box (coverage [GH, GW], indices [K])."""
    target = coverage.flatten() > 0  # [N] cells the box touches
    hits = int(target[indices.to(target.device)].sum())
    return hits / max(int(target.sum()), 1), hits / max(indices.numel(), 1)
