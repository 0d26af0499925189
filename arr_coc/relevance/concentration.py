"""
How concentrated a map is: the two measures the allocator reads off a relevance map.

- top_mass_ratio: the share of the map's mass (the map minus its minimum) held by its top cells, over the share a
  uniform map gives them (1.0 = no more than uniform). It decides the semantic void: a busy image (noise, a dense
  texture) whose content maps have no cells that stand out falls back to `grid` (seed: "if semantic_structure < 0.3:
  return grid_sample").
- normalised_entropy: the entropy of softmax(map / T) over log(cells), in [0, 1] (1 = flat). It is the prior of the
  adaptive budget (arr_coc.relevance.tensions): a spread-out map asks for more saccades than a peaked one.

    ratio = top_mass_ratio(maps, 0.02)            # [B]; Gaussian noise gives about 2.1 at 2 %
    spread = normalised_entropy(relevance, 0.5)   # [B] in [0, 1], differentiable
    structure = image_structure(layer.information.prior(t), layer.perspectival.prior(t), 0.02)   # [B]: the void test
"""

import math

import torch

from arr_coc.relevance.balancing import standardise


def top_mass_ratio(maps: torch.Tensor, fraction: float) -> torch.Tensor:
    """[B, gh, gw] -> [B]: the top `fraction` of cells' share of (map - min), divided by `fraction`."""
    flat = maps.detach().flatten(1).float()  # [B, N]
    mass = flat - flat.amin(1, keepdim=True)  # [B, N] >= 0
    k = max(1, int(fraction * flat.shape[1]))
    top = mass.topk(k, dim=1).values.sum(1)  # [B]
    total = mass.sum(1)
    share = torch.where(total > 0, top / total.clamp_min(1e-12), torch.full_like(total, k / flat.shape[1]))
    return share / (k / flat.shape[1])  # [B]; a flat map (total 0) is exactly uniform: 1.0


def normalised_entropy(maps: torch.Tensor, temperature: float) -> torch.Tensor:
    """[B, gh, gw] -> [B] entropy of softmax(map / T) over the cells, divided by log(cells): 0 peaked, 1 flat."""
    logits = maps.flatten(1).float() / temperature  # [B, N]
    log_p = logits.log_softmax(1)
    entropy = -(log_p.exp() * log_p).sum(1)  # [B]
    return entropy / math.log(max(logits.shape[1], 2))


def image_structure(information: torch.Tensor, perspectival: torch.Tensor, fraction: float) -> torch.Tensor:
    """
    [B, gh, gw] x 2 -> [B]: top_mass_ratio of the image's content map (the information and perspectival scorers'
    hand-designed priors, standardised and averaged). Not the participatory map: the question's gaze on the
    gestalt follows the VLM's attention (sinks, position), which is structured even on pure noise. Not the trained
    scorers either: training flattens their maps differently per checkpoint (tiny-charts-documents puts a cat
    photo at 1.90, its prior at 2.56); busyness is the image's, measured the same way for every checkpoint.
    """
    content = standardise(torch.stack([information, perspectival], dim=1)).mean(1)  # [B, gh, gw]
    return top_mass_ratio(content, fraction)
