"""
The three tensions of opponent processing, set per question by the balancer (the design brief, issue 17):

    exploit <-> explore         e in [0, 0.5]  the share of the budget spent on coverage: cells farthest from every
                                               pick so far (farthest-point over the cells relevance left)   prior 0
    focus <-> diversify         lambda >= 0    the spacing penalty of a greedy topk: relevance (in standard units)
                                               minus lambda x proximity to the cells already picked    prior 0 = topk
    compress <-> particularize  f in [0, 1]    where the adaptive budget K falls in [min_budget, max_budget]
                                               (--budget auto only; else K is the fixed budget)   prior: the map's
                                               normalised entropy: a spread-out map gets more saccades than a peaked one

Each is the prior plus a residual from the balancer's tension_head, whose last layer starts at zero: a fresh layer,
and a checkpoint saved before the head existed (it loads with the head at zero), select exactly as the prior does.

Training reaches them (arr_coc.train) through straight-through gates on the saccade tokens, value exactly 1 forward,
whose gradient is what a tension brings minus what it gives away (so a tension at its prior 0 still learns):
- e: the coverage picks carry 1 + (e - e.detach()), the weakest 5 % of the relevance picks (what more coverage
  would replace) 1 - (e - e.detach());
- lambda: the picks the spacing penalty brought in (not in plain topk) carry 1 + (lambda - lambda.detach()), the
  plain picks crowding a better one (within the spacing radius) 1 - (lambda - lambda.detach());
- K: the relaxation is a soft rank mask. The saccade at rank i (relevance order) carries
  1 + (m_i - m_i.detach()), m_i = sigmoid((K_soft - i - 0.5) / RANK_SOFTNESS), K_soft = lo + (hi - lo) * f the
  unrounded budget; only the last few ranks have a gradient, so the answer loss says whether the marginal saccades
  were worth it. --token-cost adds token_cost * K_soft / hi to the loss: each saccade has a price. Both reach f,
  hence the head's residual and, through the entropy prior, the relevance map's own sharpness.

    settings = TensionSettings(explore=0.25)              # fixed by hand; None: the balancer's own
    t = tension_values(maps.tension_residuals, maps.relevance, 0.5, settings)   # [B] each, differentiable
    soft_k = soft_budget(t.particularize, (64, 512))       # [B]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arr_coc.relevance.concentration import normalised_entropy
from arr_coc.relevance.config import MAX_EXPLORE, NO_SETTINGS, TensionSettings

RANK_SOFTNESS = 4.0  # saccades: the width of the soft rank mask that relaxes K
EXPLORE_PROBE = 0.05  # the weakest 5 % of the relevance picks: what a little more exploring would give away
TENSIONS = ("explore", "diversify", "particularize")  # the tension_head's outputs, in order

# what put a saccade in the selection (Allocation.kinds), for the gates; FORCED: the caller's `include` (evaluate's
# oracle row: the asked box's cells), not the map
RELEVANCE, SPACED, COVERAGE, FORCED = 0, 1, 2, 3


@dataclass
class Tensions:
    explore: torch.Tensor  # [B] e in [0, 0.5]
    diversify: torch.Tensor  # [B] lambda >= 0
    particularize: torch.Tensor  # [B] f in [0, 1]


def tension_values(residuals: torch.Tensor, relevance: torch.Tensor, temperature: float,
                   settings: TensionSettings = NO_SETTINGS) -> Tensions:
    """[B, 3] head residuals, [B, gh, gw] relevance -> the tensions (prior + residual, or the fixed settings)."""
    residuals = residuals.float()
    explore = residuals[:, 0].clamp(0.0, MAX_EXPLORE)  # prior 0
    diversify = residuals[:, 1].clamp_min(0.0)  # prior 0
    spread = normalised_entropy(relevance, temperature).clamp(1e-4, 1 - 1e-4)  # [B] the prior of f
    particularize = torch.sigmoid(torch.logit(spread) + residuals[:, 2])  # zero residual: exactly the entropy

    def fixed(value: float | None, learned: torch.Tensor) -> torch.Tensor:
        return learned if value is None else torch.full_like(learned, float(value))

    return Tensions(fixed(settings.explore, explore), fixed(settings.diversify, diversify),
                    fixed(settings.particularize, particularize))


def soft_budget(particularize: torch.Tensor, bounds: tuple[int, int]) -> torch.Tensor:
    """[B] f -> [B] the unrounded adaptive budget lo + (hi - lo) * f (differentiable)."""
    lo, hi = bounds
    return lo + (hi - lo) * particularize


def budgets(particularize: torch.Tensor, bounds: tuple[int, int]) -> list[int]:
    """[B] f -> each image's K: the soft budget rounded, in [lo, hi]."""
    lo, hi = bounds
    return [min(hi, max(lo, round(k))) for k in soft_budget(particularize.detach(), bounds).tolist()]


def gates(tensions: Tensions, kinds: torch.Tensor, positions: torch.Tensor, soft_k: torch.Tensor | None,
          radius: float) -> torch.Tensor:
    """
    [B, K] straight-through gates on the saccades' tokens, in the selection's (relevance) order: exactly 1 forward;
    backward, each tension's gradient is what it brings minus what it gives away (the module docstring).
    positions [B, K, 2]; soft_k [B] is None for a fixed budget (no K gradient); radius: the spacing radius.
    """
    B, K = kinds.shape
    zero = lambda x: (x - x.detach()).unsqueeze(1)  # noqa: E731  [B, 1]: value 0, gradient of x
    relevance_led = kinds != COVERAGE  # [B, K]
    rank = relevance_led.long().cumsum(1)  # [B, K] 1-based rank among the relevance-led picks
    weakest = relevance_led & (rank > relevance_led.sum(1, keepdim=True) - max(1, round(EXPLORE_PROBE * K)))
    gap = torch.cdist(positions.float(), positions.float())  # [B, K, K] cells apart
    crowded = ((gap < radius) & torch.ones(K, K, dtype=torch.bool, device=kinds.device).tril(-1)).any(2)  # [B, K]
    gate = (1 + zero(tensions.explore) * ((kinds == COVERAGE).float() - weakest.float())
            + zero(tensions.diversify) * ((kinds == SPACED).float() - (crowded & (kinds == RELEVANCE)).float()))
    if soft_k is not None:
        ranks = torch.arange(K, device=kinds.device) + 0.5  # [K]
        mask = torch.sigmoid((soft_k.unsqueeze(1) - ranks) / RANK_SOFTNESS)  # [B, K]
        gate = gate * (1 + (mask - mask.detach()))
    return gate  # [B, K]


def token_cost(soft_k: torch.Tensor, max_budget: int) -> torch.Tensor:
    """[B] soft budgets -> scalar: the mean fraction of the ceiling spent (times --token-cost in the loss)."""
    return (soft_k / max_budget).mean()
