"""
Faithfulness: does the answer depend on the saccades ARR chose?

For one image, question and answer, ARR selects its saccades once. Then the answer's teacher-forced
log-likelihood (the mean log-probability of its tokens, gestalt always present) is recorded while:
- deletion: the saccades are removed in rank order, most relevant first;
- random: they are removed in a random order (the baseline deletion should beat);
- insertion: they are added back in rank order, starting from the gestalt alone.
A selection the answer depends on makes deletion fall faster than random, and insertion rise fast. The
areas under the curves (x = the fraction removed or inserted, 0..1) summarise each.

    curves = faithfulness_curves(model, image, "What is the invoice total?", "4821", steps=10)  # None: ARR's answer
    curves.deletion, curves.random, curves.insertion    # [steps + 1] log-likelihoods
    curves.areas                                        # {"deletion": ..., "random": ..., "insertion": ...}
    python -m arr_coc.run --model tiny --image assets/chelsea.png --question "What is it?" --faithfulness

A point is one LLM forward over the gestalt, the kept saccades (at their true positions) and the answer.
The saccades are encoded once, all together, so removing some changes the LLM's input and nothing else.
The 3 x (steps + 1) points share their two ends, and run in right-padded batches.
"""

from __future__ import annotations  # type hints name the model without importing it at module load

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from arr_coc.vlm.positions import ImageBlock, raster_block

if TYPE_CHECKING:
    from arr_coc.model import ARRCOCQwen

CURVES = ("deletion", "random", "insertion")


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


def removal_counts(k: int, steps: int) -> list[int]:
    """0 .. k in `steps` even steps (repeats where k < steps): how many saccades are gone at each point."""
    return [round(k * j / steps) for j in range(steps + 1)]


@torch.no_grad()
def faithfulness_curves(model: ARRCOCQwen, image, question: str, answer: str | None = None, steps: int = 10,
                        seed: int = 0, strategy: str | None = None, budget: int | None = None,
                        max_cells: int | None = None, max_new_tokens: int = 32, batch_size: int = 8) -> FaithfulnessCurves:
    """
    The three curves for one image, question and answer (None: the answer ARR itself gives), over the
    selection model.answer makes with the same strategy, budget and cap.
    """
    vlm = model.vlm
    if answer is None:
        answer = model.answer(image, question, "arr", max_new_tokens, strategy, budget, max_cells=max_cells).text
    scene = model.prepare(image, question, max_cells=max_cells)
    out = model.select(scene, strategy, budget)
    grid, positions = scene.views.candidate_grid, out.positions[0]  # [K, 2]
    pixels, _ = vlm.image_inputs(scene.observation.highres)
    saccades = vlm.encode_cells(pixels, grid, positions)  # [K, D]
    gestalt = (scene.observation.gestalt, raster_block(scene.views.gestalt_grid))

    k = len(positions)
    ranks = torch.sort(out.scores[0].cpu(), descending=True, stable=True).indices  # [K] most relevant first
    random_order = torch.randperm(k, generator=torch.Generator().manual_seed(seed))  # [K]
    counts = removal_counts(k, steps)
    kept = dict(deletion=[ranks[c:] for c in counts], random=[random_order[c:] for c in counts],
                insertion=[ranks[:c] for c in counts])

    def prompt(keep: torch.Tensor):
        """The question with the gestalt and the kept saccades (in selection order, at their own positions)."""
        keep = keep.sort().values
        images = [gestalt] + ([(vlm.take(saccades, keep.to(saccades.device)), ImageBlock(grid, positions[keep].cpu()))]
                              if len(keep) else [])
        return vlm.prompt(question, images, answer=answer)

    # every distinct kept set once: the full set and the gestalt alone end all three curves
    distinct = {tuple(sorted(keep.tolist())): keep for sets in kept.values() for keep in sets}
    keys = list(distinct)
    scores = vlm.answer_logprobs([prompt(distinct[key]) for key in keys], batch_size).tolist()
    score = dict(zip(keys, scores))
    curve = {name: [score[tuple(sorted(keep.tolist()))] for keep in sets] for name, sets in kept.items()}
    return FaithfulnessCurves(answer, [c / max(k, 1) for c in counts], counts, curve["deletion"], curve["random"],
                              curve["insertion"], ranks.tolist(), random_order.tolist())
