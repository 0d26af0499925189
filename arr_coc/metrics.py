"""
How answers and selections are scored, in one place for evaluate.py, train.py and the app's A/B tab.

Each answer metric takes the model's prediction and the dataset's reference answers and returns a score in
[0, 1]; METRICS names them for `evaluate --metric`:

    anls("Invoice 4821", ["invoice 4,821"])          # DocVQA: 1 - normalised edit distance, 0 below 0.5 similarity
    vqa_accuracy("two", ["2"] * 3 + ["3"] * 7)      # TextVQA: min(1, humans who agree / 3), averaged over 10 leave-one-outs
    relaxed_accuracy("41.5%", ["42"])               # ChartQA: numbers within 5 %, other answers exact
    contains("The total is 4,821.", ["4 821"])      # the synthetic and JSONL sets: the answer's words appear
    recall, precision = box_recall_precision(coverage, indices)
"""

import re

ARTICLES = {"a", "an", "the"}
NUMBER_WORDS = {w: str(i) for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}


def normalise(text: str) -> str:
    """Lower case, every run of non-alphanumerics one space: the one normaliser every comparison uses."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def is_correct(prediction: str, expected: str) -> bool:
    """The expected answer appears in the prediction as whole words, ignoring case and punctuation."""
    return bool(normalise(expected)) and f" {normalise(expected)} " in f" {normalise(prediction)} "


def answers_agree(a: str, b: str) -> bool:
    """Two answers say the same, ignoring case, spacing and punctuation."""
    return normalise(a) == normalise(b)


def contains(prediction: str, answers: list[str]) -> float:
    """1 when any reference answer appears in the prediction as whole words (is_correct), else 0."""
    return float(any(is_correct(prediction, a) for a in answers))


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions turning a into b."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def anls(prediction: str, answers: list[str], threshold: float = 0.5) -> float:
    """Average Normalised Levenshtein Similarity (DocVQA): the best 1 - distance / length over the answers,
    counted as 0 when the normalised distance reaches the threshold. Case and outer spaces are ignored."""
    p = " ".join(prediction.lower().split())
    best = 0.0
    for answer in answers:
        a = " ".join(answer.lower().split())
        distance = edit_distance(p, a) / max(len(p), len(a), 1)
        best = max(best, 1.0 - distance if distance < threshold else 0.0)
    return best


def vqa_normalise(text: str) -> str:
    """The VQA evaluation's normalisation: lower case, punctuation out, number words as digits, articles out."""
    words = re.sub(r"[^\w\s]", " ", text.lower().replace("'s", "")).split()
    return " ".join(NUMBER_WORDS.get(w, w) for w in words if w not in ARTICLES)


def vqa_accuracy(prediction: str, answers: list[str]) -> float:
    """VQA accuracy (TextVQA): for each of the n human answers left out in turn, min(1, matches among the other
    n - 1 / 3); the mean of those. With 10 answers, 3 or more agreeing humans give 1."""
    p = vqa_normalise(prediction)
    matches = [vqa_normalise(a) == p for a in answers]
    if len(answers) == 1:
        return float(matches[0])
    return sum(min(1.0, (sum(matches) - m) / 3) for m in matches) / len(matches)


def as_number(text: str) -> float | None:
    """'1,234.5', '42%' or '$7' -> a float; None for anything that is not one number."""
    try:
        return float(text.strip().rstrip("%").lstrip("$").replace(",", ""))
    except ValueError:
        return None


def relaxed_accuracy(prediction: str, answers: list[str], tolerance: float = 0.05) -> float:
    """ChartQA's relaxed accuracy: a number within 5 % of a numeric answer (exact for 0), else the same text."""
    p = prediction.strip().rstrip(".")
    for answer in answers:
        target, value = as_number(answer), as_number(p)
        if target is not None and value is not None:
            if abs(value - target) <= tolerance * abs(target):
                return 1.0
        elif normalise(p) == normalise(answer):
            return 1.0
    return 0.0


METRICS = {"anls": anls, "vqa": vqa_accuracy, "relaxed": relaxed_accuracy, "contains": contains}


def box_recall_precision(coverage, indices) -> tuple[float, float]:
    """Share of the box's cells that got a saccade, and share of the saccades on the box (coverage [GH, GW], indices [K])."""
    target = coverage.flatten() > 0  # [N] cells the box touches
    hits = int(target[indices.to(target.device)].sum())
    return hits / max(int(target.sum()), 1), hits / max(indices.numel(), 1)
