"""
One result of evaluate: an item answered by one row (at one budget in a sweep), scored. evaluate builds them, writes
each as a line of results.jsonl (to_json) and reads them back to resume or draw figures (from_json); the report
summarises them. Torch-free.

    record = EvalRecord(item=0, id="0", kind="box_word", row="arr:topk", prediction="piano", answers=["piano"],
                        score=1.0, visual_tokens=272, gflops=19.8, ttft_ms=17.61, total_ms=19.64, confidence=0.73)
    line = json.dumps(record.to_json())          # results.jsonl's line, as evaluate has always written it
    record = EvalRecord.from_json(json.loads(line))

A field that defaults to None is written only where it is set (or, where its `when` says, whenever that holds): a
line holds what its item and row measured, so results.jsonl keeps the shape of the folders written before this type.
"""

from dataclasses import dataclass, field, fields
from typing import Callable


def optional(when: Callable[["EvalRecord", str], bool] = lambda r, name: getattr(r, name) is not None):
    """A field that only some results have: None by default, written to JSON where `when(record, name)` holds (by
    default: where it is set)."""
    return field(default=None, metadata={"when": when})


@dataclass(kw_only=True)
class EvalRecord:
    """One item answered by one row; the fields in results.jsonl's order."""
    item: int  # the item's index in the set (results are resumed and merged by it)
    id: str  # the set's own id for the item, else its index
    kind: str  # the synthetic scene kind, or the schema of a real set (the report's per-kind tables)
    family: str | None = optional()  # a pocket page's layout family (synth/families.py); None: not a family page
    row: str  # what answered: a baseline ("full") or ARR ("arr:topk", "arr-no-gestalt:topk", "arr+refix:topk")
    budget: int | None = optional(lambda r, name: r.sweep)  # a sweep's saccade budget; None: a row that reads none
    prediction: str  # the row's answer
    answers: list[str]  # the reference answers ([] in a test split)
    score: float | None  # the set's metric of the answer, in [0, 1]; None without reference answers (unscored)
    visual_tokens: int  # visual tokens the LLM read
    gflops: float  # the forward's GFLOPs, to 0.1
    ttft_ms: float  # time to the first token, to 0.01 ms
    total_ms: float  # time to the whole answer, to 0.01 ms
    confidence: float | None  # the least probable answer token's probability (None without probabilities)
    refixated: bool | None = optional()  # a row with ARR's second look: whether it fired
    confidences: list[float] | None = optional()  # and each look's confidence, first look first
    first_prediction: str | None = optional()  # and the first look's answer
    first_score: float | None = optional(lambda r, name: r.refixated is not None)  # and its score (None: unscored)
    contains: float | None = optional()  # the lenient metric (metrics.LENIENT), beside a benchmark metric's score
    tensions: dict | None = optional()  # an ARR row's tensions (pipelines.answer.tension_record): e, lambda, f, K...
    box_recall: float | None = optional()  # where the item has a box: the share of its cells the row read
    box_precision: float | None = optional()  # and the share of the cells read that are on it
    fallback: str | None = optional(lambda r, name: r.box_recall is not None and r.tensions is not None)  # an ARR
    # row's, on an item with a box: why its map was not trusted ("semantic_void", "non_finite"), None where it was
    prior_peak: bool | None = optional()  # an ARR row's, on an item with a box: whether its question->gestalt
    # attention prior (the participatory prior map, on the candidate grid) peaks on a cell of the asked box
    box_clipped: bool | None = optional()  # the oracle row's: whether the asked box touches more candidate cells than
    # its budget, so that only the budget's most relevant of them were forced in (its box recall then below 1)
    faithfulness: dict | None = optional()  # an ARR strategy row's curves (faithfulness.FaithfulnessCurves.to_json)
    sweep: bool = field(default=False, metadata={"when": lambda r, name: False})  # not written: whether the run is a
    # budget sweep, whose every result writes its budget (null for full, gestalt, arr-auto-budget)

    @property
    def kind_label(self) -> str:
        """Its scene kind, and its layout family where it has one ("box_word (box_grid)"): the per-kind tables'
        and figures' column, so that trained, held-out sparse and held-out dense families are read apart."""
        return f"{self.kind} ({self.family})" if self.family else self.kind

    def to_json(self) -> dict:
        """results.jsonl's object: the fields in order, each optional one only where its `when` holds."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.metadata.get("when", lambda r, name: True)(self, f.name)}

    @classmethod
    def from_json(cls, data: dict) -> "EvalRecord":
        """A results.jsonl object read back (a sweep's results are those that write their budget)."""
        return cls(**data, sweep="budget" in data)
