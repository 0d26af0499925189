"""
ARR's ablations: each a small declarative switch over the one arr pipeline, applied by the relevance layer's
callers at four well-defined points, so every part of ARR has to earn its keep at the same budget:

    prior    the participatory scorer's question->gestalt attention prior       (Ablation.prior, before scoring)
    weights  the balancer's weights, fixed instead of learned                  (Ablation.mix, after scoring)
    budget   the saccade count: no gestalt reads budget + its tokens as saccades (Ablation.saccade_budget)
    order    the order the saccades are fed to the LLM: raster or relevance     (Ablation.feed, after selection)
    busy     what a busy page's selection becomes: a grid, or kept             (Ablation.busy_pages, at selection)

and one on the LLM's input: whether the gestalt block is in the prompt (Ablation.gestalt).

Three rows switch a tension on instead, with a fixed value (arr_coc.relevance.tensions), against ARR's own row where
each is at its prior: arr-explore (e = 0.25), arr-diversify (lambda = 2) and arr-auto-budget (K from the map's
concentration, --budget auto) (Ablation.tensions and Ablation.auto_budget, at selection).

    from arr_coc.relevance.ablation import ABLATIONS, NO_ABLATION
    ablation = ABLATIONS["no-gestalt"]
    model.answer(image, "What does the sign say?", "arr", ablation="no-gestalt")   # the row arr-no-gestalt:topk
"""

from __future__ import annotations  # torch-free at import: the commands check --ablations before torch loads

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from arr_coc.relevance.config import AUTO, TensionSettings, prior_weights, scorer_names, scorers

if TYPE_CHECKING:
    import torch

    from arr_coc.relevance.layer import ScoreMaps

SCORER_NAMES = scorer_names()  # the scorers' names, derived from config.SCORERS (the one declaration), in the weights' order
PRIOR_WEIGHTS = tuple(prior_weights())  # (0.2, 0.2, 0.6): the untrained balancer's weights, one a scorer


@dataclass(frozen=True)
class Ablation:
    name: str  # the row's and the app's name for it, e.g. "no-gestalt"
    description: str  # one line: what it removes or fixes
    weights: tuple[float, ...] | None = None  # fixed balancer weights, one a scorer (config.SCORERS' order), in
    # place of the learned ones; one-hot = one scorer alone; None: the balancer's own
    participatory_prior: bool = True  # False: the participatory scorer without the question->gestalt prior
    saccade_order: str | None = None  # the order the saccades are fed to the LLM in ("raster" or "relevance");
    # None: the layer's own (ARRCOCConfig.saccade_order)
    gestalt: bool = True  # False: no gestalt block; its token count goes to the saccades instead
    tensions: TensionSettings | None = None  # tensions fixed at these values (None: the balancer's)
    auto_budget: bool = False  # True: the adaptive budget (--budget auto) whatever budget is asked for
    busy_pages: str | None = None  # what a busy image's selection becomes ("grid" or "keep"); None: the layer's own
    # (ARRCOCConfig.busy_pages)

    def prior(self, prior: torch.Tensor | None) -> torch.Tensor | None:
        """The participatory prior [B, gh, gw] the scorer gets: the VLM's, or none."""
        return prior if self.participatory_prior else None

    def mix(self, maps: ScoreMaps) -> ScoreMaps:
        """The layer's scored maps with the relevance mixed from fixed weights (the scorer maps untouched)."""
        if self.weights is None:
            return maps
        import torch

        from arr_coc.relevance.balancing import mix

        stacked = maps.scorers  # [B, S, gh, gw]
        weights = torch.tensor(self.weights, dtype=stacked.dtype, device=stacked.device).expand(*stacked.shape[:2])
        return replace(maps, relevance=mix(stacked, weights), weights=weights)  # [B, gh, gw], [B, S]

    def saccade_budget(self, budget: int | str, gestalt_tokens: int) -> int | str:
        """How many saccades to select: the budget (adaptive: "auto"), plus the gestalt's tokens when the gestalt is
        left out (not to an adaptive budget)."""
        if self.auto_budget or budget == AUTO:
            return AUTO
        return budget if self.gestalt else budget + gestalt_tokens

    def feed(self, out):
        """An ARRCOCOutput in the order its saccades are fed to the LLM: the layer's, or the ablation's."""
        return out if self.saccade_order is None else out.in_order(self.saccade_order)


NO_ABLATION = Ablation("none", "ARR as trained: nothing removed")


def alone(index: int, count: int) -> tuple[float, ...]:
    """One-hot balancer weights: scorer `index` of `count` alone."""
    return tuple(float(i == index) for i in range(count))


def ablations() -> dict[str, Ablation]:
    """Every ablation by name: each scorer alone (one a config.SCORERS entry), then the rest."""
    entries = scorers()
    weights = tuple(s.prior_weight for s in entries)
    return {a.name: a for a in (
        *(Ablation(s.name, f"{s.what} alone", weights=alone(i, len(entries))) for i, s in enumerate(entries)),
        Ablation("fixed-weights", f"the prior's fixed balancer weights {weights} over the trained scorers",
                 weights=weights),
        Ablation("no-prior", "the participatory scorer without the question->gestalt attention prior",
                 participatory_prior=False),
        Ablation("raster", "the saccades fed in raster order (row by row)", saccade_order="raster"),
        Ablation("relevance-order", "the saccades fed in relevance order (most relevant first)",
                 saccade_order="relevance"),
        Ablation("no-gestalt", "no gestalt: budget + gestalt-token saccades and nothing else", gestalt=False),
        Ablation("explore", "exploit<->explore on: a quarter of the budget on coverage (e = 0.25)",
                 tensions=TensionSettings(explore=0.25)),
        Ablation("diversify", "focus<->diversify on: topk with a spacing penalty (lambda = 2 standard units)",
                 tensions=TensionSettings(diversify=2.0)),
        Ablation("auto-budget", "compress<->particularize on: the adaptive budget (--budget auto)", auto_budget=True),
        Ablation("busy-grid", "a busy page's selection swapped for an even grid (its fallback: semantic_void)",
                 busy_pages="grid"),
        Ablation("busy-keep", "a busy page's selection kept, the page only recorded as busy (its fallback: busy)",
                 busy_pages="keep"),
    )}


ABLATIONS = ablations()  # the commands' and the app's choices


def describe() -> str:
    """One line naming each ablation and what it does (the flags' help)."""
    return "; ".join(f"{a.name}: {a.description}" for a in ABLATIONS.values())


def get(name: str | None) -> Ablation:
    """An ablation by name (None or "none": nothing removed); KeyError naming the choices for another."""
    if name is None or name == NO_ABLATION.name:
        return NO_ABLATION
    if name not in ABLATIONS:
        raise KeyError(f"unknown ablation {name!r}: one of {', '.join(ABLATIONS)}")
    return ABLATIONS[name]
