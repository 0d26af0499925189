"""
Faithfulness: does the answer depend on the saccades ARR chose?

For one image, question and answer, ARR selects its saccades once (an ARR Answer's selection). Then the answer's teacher-forced
log-likelihood (the mean log-probability of its tokens, gestalt always present) is recorded while:
- deletion: the saccades are removed in rank order, most relevant first;
- random: they are removed in a random order (the baseline deletion should beat);
- insertion: they are added back in rank order, starting from the gestalt alone.
A selection the answer depends on makes deletion fall faster than random, and insertion rise fast. The
areas under the curves (x = the fraction removed or inserted, 0..1) summarise each.

    arr = model.answer(image, "What is the invoice total?", "arr")
    curves = faithfulness_curves(model.parts, arr.observation, arr.arr, "4821", steps=10)   # or arr.text: ARR's answer
    curves.deletion, curves.random, curves.insertion    # [steps + 1] log-likelihoods
    curves.areas                                        # {"deletion": ..., "random": ..., "insertion": ...}
    python -m arr_coc.run --model tiny --image assets/chelsea.png --question "What is it?" --faithfulness

A point is one LLM forward over the gestalt, the kept saccades (at their true positions) and the answer.
The saccades are encoded once, all together, so removing some changes the LLM's input and nothing else.
The 3 x (steps + 1) points share their two ends, and run in right-padded batches.
"""

from __future__ import annotations  # type hints name the layer's output without importing it at module load

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from arr_coc.errors import InputError
from arr_coc.pipelines.arr_layout import arr_prompt, encode_saccades

if TYPE_CHECKING:
    from arr_coc.pipelines.request import Parts
    from arr_coc.pipelines.arr_scene import Observation
    from arr_coc.relevance.layer import ARRCOCOutput

CURVES = ("deletion", "random", "insertion")
MAX_ANSWER_CHARS = 1000  # each point teacher-forces the answer: 5000 characters took 157 s on a CPU, blocking the queue


@dataclass
class FaithfulnessCurves:
    answer: str  # the answer scored, teacher-forced after the question
    fractions: list[float]  # x: the share of saccades removed (deletion, random) or inserted (insertion)
    counts: list[int]  # how many saccades were removed or inserted at each point
    deletion: list[float]  # mean log-probability per answer token, saccades removed in rank order
    random: list[float]  # the same, removed in a random order
    insertion: list[float]  # the same, added in rank order to the gestalt alone
    ranks: list[int]  # saccade indices (into the selection) most relevant first: the deletion order
    random_order: list[int]  # the random removal order

    @property
    def curves(self) -> dict[str, list[float]]:
        return {name: getattr(self, name) for name in CURVES}

    @property
    def areas(self) -> dict[str, float]:
        """Area under each curve over x in [0, 1] (trapezoids): lower for deletion, higher for insertion is better."""
        return {name: float(np.trapezoid(values, self.fractions)) for name, values in self.curves.items()}

    def to_json(self) -> dict:
        return dict(asdict(self), areas=self.areas)


def check_answer(answer) -> str:
    """An answer to score (user text: tokenised as plain text), stripped; InputError past MAX_ANSWER_CHARS."""
    if not isinstance(answer, str):
        raise InputError(f"the answer to score must be text, got {type(answer).__name__}")
    if len(answer) > MAX_ANSWER_CHARS:
        raise InputError(f"the answer to score is {len(answer)} characters long; the limit is {MAX_ANSWER_CHARS}")
    return answer.strip()


def removal_counts(k: int, steps: int) -> list[int]:
    """0 .. k in `steps` even steps (repeats where k < steps): how many saccades are gone at each point."""
    return [round(k * j / steps) for j in range(steps + 1)]


@torch.no_grad()
def faithfulness_curves(parts: Parts, observation: Observation, selection: ARRCOCOutput, answer: str,
                        steps: int = 10, seed: int = 0, batch_size: int = 8) -> FaithfulnessCurves:
    """
    The three curves of one answer over one ARR selection of one observation: an ARR Answer's
    (answer.observation, answer.arr), with its own text or a reference answer; `parts`: the model's
    (ARRCOCQwen.parts).
    """
    answer = check_answer(answer)
    vlm = parts.vlm
    positions = selection.positions[0]  # [K, 2]
    saccades = encode_saccades(vlm, observation, positions)  # [K, D]

    k = len(positions)
    ranks = torch.sort(selection.scores[0].cpu(), descending=True, stable=True).indices  # [K] most relevant first
    random_order = torch.randperm(k, generator=torch.Generator().manual_seed(seed))  # [K]
    counts = removal_counts(k, steps)
    kept = dict(deletion=[ranks[c:] for c in counts], random=[random_order[c:] for c in counts],
                insertion=[ranks[:c] for c in counts])

    def prompt(keep: tuple[int, ...]):
        """The question with the gestalt and the kept saccades (in selection order, at their own positions)."""
        return arr_prompt(vlm, observation, saccades.take(torch.tensor(keep, dtype=torch.long)) if keep else None, answer)

    # each kept set as sorted indices, each distinct one scored once: the full set and none end all three curves
    sets = {name: [tuple(sorted(keep.tolist())) for keep in keeps] for name, keeps in kept.items()}
    distinct = list(dict.fromkeys(s for keeps in sets.values() for s in keeps))
    score = dict(zip(distinct, vlm.answer_logprobs([prompt(s) for s in distinct], batch_size).tolist()))
    curve = {name: [score[s] for s in keeps] for name, keeps in sets.items()}
    return FaithfulnessCurves(answer, [c / max(k, 1) for c in counts], counts, curve["deletion"], curve["random"],
                              curve["insertion"], ranks.tolist(), random_order.tolist())
