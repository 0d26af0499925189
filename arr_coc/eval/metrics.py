"""
How answers and selections are scored, in one place for evaluate.py, train.py and the app's A/B tab.

Each answer metric takes the model's prediction and the dataset's reference answers and returns a score in
[0, 1]; METRICS names them for `evaluate --metric`. The three benchmark metrics follow the reference
evaluations step by step, so their numbers sit beside published ones:

    anls("Invoice 4821", ["invoice 4821"])           # DocVQA: the official ANLS (1 - normalised edit distance,
                                                     #   0 below a similarity of 0.5)
    vqa_accuracy("two", ["2"] * 3 + ["3"] * 7)       # TextVQA: the EvalAI answer processor, then mmf's average of
                                                     #   min(1, agreeing humans / 3) over the leave-one-outs
    relaxed_accuracy("41.5", ["42"])                 # ChartQA: pix2struct's relaxed_correctness (numbers within 5 %,
                                                     #   "%" read as / 100, other answers exact up to case)
    exact("0427.", ["0427"])                         # exact match up to case and punctuation: the fine-print suite
    contains("The total is 4,821.", ["4 821"])       # lenient: the answer's words appear; the synthetic and JSONL
                                                     #   sets' metric, and an extra column of benchmark runs
    recall, precision = box_recall_precision(coverage, indices)
    indices = cells_on_grid(kept, native_grid, candidate_grid)   # a reducer's kept tokens as candidate cells

Intervals (wilson, interval_text) live in arr_coc.eval.intervals, which the pocket model's training shares.

The benchmark metrics need at least one reference answer (ValueError otherwise); evaluate.py leaves an item
without answers (a test split) unscored and counts it.
"""

import re
import statistics

ARTICLES = ("a", "an", "the")


def normalise(text: str) -> str:
    """Lower case, every run of non-alphanumerics one space: the lenient normaliser of `contains` and A/B agreement."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def is_correct(prediction: str, expected: str) -> bool:
    """The expected answer appears in the prediction as whole words, ignoring case and punctuation."""
    return bool(normalise(expected)) and f" {normalise(expected)} " in f" {normalise(prediction)} "


def answers_agree(a: str, b: str) -> bool:
    """Two answers say the same, ignoring case, spacing and punctuation."""
    return normalise(a) == normalise(b)


def exact(prediction: str, answers: list[str]) -> float:
    """Exact match: 1 when the prediction is a reference answer, ignoring case, spacing and punctuation; the fine-print
    suite's metric (a list of words that holds the answer is wrong here, as greedy decoding scores it)."""
    return float(any(answers_agree(prediction, a) for a in answers))


def contains(prediction: str, answers: list[str]) -> float:
    """Lenient (no reference evaluation): 1 when any reference answer appears in the prediction as whole words
    (is_correct), else 0. The synthetic and JSONL sets' metric; on benchmark sets an extra column only."""
    return float(any(is_correct(prediction, a) for a in answers))


def require_answers(answers: list[str]) -> None:
    if not answers:
        raise ValueError("no reference answers to score against (evaluate leaves such items unscored)")


# ----------------------------------------------------------------------------- ANLS (DocVQA)


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
    """ANLS as the official DocVQA evaluation computes it (the Robust Reading Competition's script, which
    Qwen-VL's eval_mm/infographicsvqa_eval.py and lmms-eval's `anls` metric reproduce):

    - per reference, the edit distance between the two strings stripped, lower-cased, whitespace runs as one space;
    - divided by the longer of the two RAW strings' lengths after upper-casing (a distance of 0 when both are empty);
    - the item scores 1 - the smallest of these, and 0 when that is below the threshold: a similarity of exactly
      0.5 keeps its 0.5 ("12" against "13")."""
    require_answers(answers)
    predicted = " ".join(prediction.strip().lower().split())
    distances = []
    for answer in answers:
        reference = " ".join(answer.strip().lower().split())
        length = max(len(answer.upper()), len(prediction.upper()))
        distances.append(0.0 if length == 0 else edit_distance(reference, predicted) / length)
    score = 1 - min(distances)
    return 0.0 if score < threshold else score


# ----------------------------------------------------------------------------- VQA accuracy (TextVQA)

# The EvalAI answer processor's tables (mmf's EvalAIAnswerProcessor, the VQA challenge's own evaluation).
VQA_PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",",
                   "?", "!")  # no "'", ":", "$", "%", "." or curly quotes: those stay
VQA_DIGIT_COMMA = re.compile(r"(?<=\d),+(?=\d)")  # "1,000": then punctuation is deleted, not turned into spaces
# The reference writes this "(?!<=\d)(\.)(?!\d)"; its first group is a look-ahead for the text "<=" that never
# matches at a period, so the rule is: a period not followed by a digit goes ("3.5" keeps its period).
VQA_PERIOD = re.compile(r"\.(?!\d)")
VQA_PERIOD_COUNT = 32  # the reference passes re.UNICODE (= 32) where re.sub takes its count: 32 periods at most go
VQA_NUMBERS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
               "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
VQA_CONTRACTIONS = {  # the words a processed answer may hold -> their apostrophed form (the reference's table,
    # odd entries included: "somebody'd" -> "somebodyd"; its capitalised keys never match a lower-cased word)
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't", "dont": "don't",
    "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't", "havent": "haven't",
    "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd", "howll": "how'll",
    "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm", "Ive": "I've", "isnt": "isn't",
    "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll", "let's": "let's", "maam": "ma'am",
    "mightnt": "mightn't", "mightnt've": "mightn't've", "mightn'tve": "mightn't've", "mightve": "might've",
    "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't", "notve": "not've", "oclock": "o'clock",
    "oughtnt": "oughtn't", "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "shant": "shan't",
    "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's", "shouldve": "should've",
    "shouldnt": "shouldn't", "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd", "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll", "somebodys": "somebody's", "someoned": "someone'd", "someoned've": "someone'd've",
    "someone'dve": "someone'd've", "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd",
    "somethingd've": "something'd've", "something'dve": "something'd've", "somethingll": "something'll",
    "thats": "that's", "thered": "there'd", "thered've": "there'd've", "there'dve": "there'd've",
    "therere": "there're", "theres": "there's", "theyd": "they'd", "theyd've": "they'd've", "they'dve": "they'd've",
    "theyll": "they'll", "theyre": "they're", "theyve": "they've", "twas": "'twas", "wasnt": "wasn't",
    "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've", "werent": "weren't", "whatll": "what'll",
    "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's", "whered": "where'd",
    "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've", "who'dve": "who'd've",
    "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll", "whyre": "why're", "whys": "why's",
    "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll",
    "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've", "youd": "you'd",
    "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're", "youve": "you've",
}


def vqa_punctuation(text: str) -> str:
    """The processor's punctuation step: each mark of VQA_PUNCTUATION is deleted where it touches a space in the
    text (or anywhere, if the text has a digit-comma-digit), else turned into a space; then periods not before a
    digit are deleted."""
    out = text
    digit_comma = VQA_DIGIT_COMMA.search(text) is not None
    for mark in VQA_PUNCTUATION:
        spaced = mark + " " in text or " " + mark in text
        out = out.replace(mark, "" if spaced or digit_comma else " ")
    return VQA_PERIOD.sub("", out, count=VQA_PERIOD_COUNT)


def vqa_answer(text: str) -> str:
    """An answer as the EvalAI answer processor leaves it (mmf's EvalAIAnswerProcessor, which lmms-eval's TextVQA
    task runs), step by step: lower case; commas and "?" deleted, "'s" split off as " 's"; newlines and tabs as
    spaces; vqa_punctuation; then per word: number words as digits ("none" -> "0"), articles dropped, and
    contractions given their apostrophe ("dont" -> "don't")."""
    text = text.lower().replace(",", "").replace("?", "").replace("'s", " 's").strip()
    text = vqa_punctuation(text.replace("\n", " ").replace("\t", " ").strip())
    words = [VQA_NUMBERS.get(w, w) for w in text.lower().split()]
    return " ".join(VQA_CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES)


def vqa_accuracy(prediction: str, answers: list[str]) -> float:
    """VQA accuracy as mmf's TextVQAAccuracyEvaluator and lmms-eval's TextVQA task compute it: prediction and
    human answers through vqa_answer; for each human answer left out in turn, min(1, the others equal to the
    prediction / 3); the mean over the leave-one-outs. With 10 answers, 3 agreeing humans give 0.9 and 4 give 1;
    a single reference has no others to agree with, so it scores 0, as in the reference."""
    require_answers(answers)
    predicted = vqa_answer(prediction)
    agree = [vqa_answer(a) == predicted for a in answers]
    return statistics.fmean(min(1.0, (sum(agree) - left_out) / 3) for left_out in agree)


# ----------------------------------------------------------------------------- relaxed accuracy (ChartQA)


def chart_number(text: str) -> float | None:
    """pix2struct's reading of an answer as a number: Python's float() of the text, one ending in "%" divided by
    100; None where float() refuses ("1,000", "$5", "−5" with a unicode minus)."""
    try:
        return float(text.rstrip("%")) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        return None


def relaxed_correctness(prediction: str, target: str, max_relative_change: float = 0.05) -> bool:
    """pix2struct's relaxed_correctness (google-research/pix2struct metrics.py; lmms-eval's ChartQA metric): when
    both read as numbers and the target is not zero, |prediction - target| / |target| <= 5 %; otherwise (text,
    or a zero target) the two strings equal up to case, nothing stripped."""
    value, reference = chart_number(prediction), chart_number(target)
    if value is not None and reference:  # a zero target is falsy: compared as text, as the reference does
        return abs(value - reference) / abs(reference) <= max_relative_change
    return prediction.lower() == target.lower()


def relaxed_accuracy(prediction: str, answers: list[str], max_relative_change: float = 0.05) -> float:
    """ChartQA's relaxed accuracy: relaxed_correctness against the best reference (pix2struct's aggregate_metrics
    takes the max over targets; ChartQA items have one)."""
    require_answers(answers)
    return float(any(relaxed_correctness(prediction, a, max_relative_change) for a in answers))


METRICS = {"anls": anls, "vqa": vqa_accuracy, "relaxed": relaxed_accuracy, "exact": exact, "contains": contains}
LENIENT = "contains"  # the lenient metric: reported beside a benchmark's own metric as an extra column


def cells_on_grid(positions, grid: tuple[int, int], candidate_grid: tuple[int, int]):
    """
    Cells a pipeline read, (row, col) [K, 2] on its view's grid (a reducer's: the native view's) -> the raster
    indices [M] of the candidate cells they cover, ascending. Both grids span the whole image: a candidate cell counts
    as read when its centre lies in a read cell. When the grids agree (the native grid is the candidate grid, as it
    is unless the native view is under twice the gestalt per side) that is the same cells, one for one.
    """
    import torch

    (gh, gw), (GH, GW) = grid, candidate_grid
    read = torch.zeros(gh, gw, dtype=torch.bool)
    read[positions[:, 0].cpu(), positions[:, 1].cpu()] = True  # [gh, gw]
    rows = (2 * torch.arange(GH) + 1) * gh // (2 * GH)  # [GH] the grid row holding each candidate row's centre
    cols = (2 * torch.arange(GW) + 1) * gw // (2 * GW)  # [GW]
    return read[rows][:, cols].flatten().nonzero().flatten()


def box_recall_precision(coverage, indices) -> tuple[float, float]:
    """Share of the box's cells that got a saccade, and share of the saccades on the box (coverage [GH, GW], indices [K])."""
    target = coverage.flatten() > 0  # [N] cells the box touches
    hits = int(target[indices.to(target.device)].sum())
    return hits / max(int(target.sum()), 1), hits / max(indices.numel(), 1)


def peak_on_box(coverage, relevance) -> bool:
    """Whether a map's highest cell (the first in raster order on ties) is one the box touches (coverage, relevance
    [GH, GW]): for the question->gestalt attention prior, whether the model's own look lands on the asked box."""
    return bool(coverage.flatten()[relevance.flatten().argmax().cpu()] > 0)
