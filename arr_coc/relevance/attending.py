"""
TokenAllocator: turns a relevance map into exactly `budget` saccades (unique cells), most relevant first.

Strategies (DESIGN.md §6), all returning the same shapes so they can be ablated side by side:
- topk      the `budget` highest cells
- logpolar  a foveated sample: 16 rho x 17 theta bins around the relevance peak, the best cell of each
            bin, filled up to the budget with the best remaining cells (seed Part 12)
- grid      evenly spread coverage, whatever the map says
- random    seeded random cells

A map that is not finite, or flat (a "semantic void"), falls back to `grid` and says why. Cells marked in
`exclude` (those a first fixation already read) are never chosen: the strategy picks on the map with them at
-inf, and any it still lands on are swapped for the best cells left (see `avoid`).
"""

import math
from dataclasses import dataclass

import torch

from arr_coc.relevance.config import ARRCOCConfig, STRATEGIES


@dataclass
class Allocation:
    indices: torch.Tensor  # [B, K] flat cell index row * gw + col, relevance-ordered
    positions: torch.Tensor  # [B, K, 2] (row, col) of each saccade
    scores: torch.Tensor  # [B, K] relevance of each saccade (non-finite values reported as 0)
    fallback: list[str | None]  # per image: None, "semantic_void" or "non_finite"


def grid_cells(n_cells: int, budget: int, device=None) -> torch.Tensor:
    """`budget` evenly spaced raster indices: about the same count in every row, staggered across columns."""
    return ((torch.arange(budget, device=device, dtype=torch.float64) + 0.5) * n_cells / budget).long()


def logpolar_cells(scores: torch.Tensor, grid: tuple[int, int], budget: int, rho_bins: int, theta_bins: int) -> torch.Tensor:
    """[N] scores -> `budget` unique indices: the best cell of every log-polar bin, then the global best."""
    gh, gw = grid
    N = gh * gw
    device = scores.device
    peak = int(scores.argmax())
    rows = torch.arange(N, device=device) // gw
    cols = torch.arange(N, device=device) % gw
    dy = (rows - peak // gw).float()
    dx = (cols - peak % gw).float()
    log_r = torch.log1p(torch.sqrt(dy * dy + dx * dx))  # [N]
    rho = (log_r / log_r.max().clamp_min(1e-6) * rho_bins).long().clamp(max=rho_bins - 1)
    theta = ((torch.atan2(dy, dx) + math.pi) / (2 * math.pi) * theta_bins).long().clamp(max=theta_bins - 1)
    bins = rho * theta_bins + theta  # [N]
    bins[peak] = -1  # the fovea is its own bin
    rank = torch.empty(N, dtype=torch.long, device=device)
    order = scores.argsort(descending=True, stable=True)
    rank[order] = torch.arange(N, device=device)
    # best (lowest-rank) cell of every non-empty bin
    best = torch.full((rho_bins * theta_bins + 1,), N, dtype=torch.long, device=device)
    best = best.scatter_reduce(0, bins + 1, rank, reduce="amin")
    chosen = torch.zeros(N, dtype=torch.bool, device=device)
    chosen[order[best[best < N]]] = True
    chosen = chosen & (torch.cumsum(chosen[order].long(), 0)[rank] <= budget)  # at most `budget` bin winners
    # fill up with the best cells not yet chosen
    rest = order[~chosen[order]][: budget - int(chosen.sum())]
    chosen[rest] = True
    return chosen.nonzero().squeeze(1)


def avoid(chosen: torch.Tensor, scores: torch.Tensor, excluded: torch.Tensor) -> torch.Tensor:
    """
    [K] chosen indices minus the excluded [N] cells, filled back up to K with the best cells neither chosen nor
    excluded (raster order on ties). topk never needs it; grid, random and logpolar's empty bins may.
    """
    kept = chosen[~excluded[chosen]]
    taken = excluded.clone()
    taken[kept] = True
    free = torch.nan_to_num(scores, nan=0.0, posinf=0.0, neginf=0.0).masked_fill(taken, float("-inf"))  # [N]
    fill = free.argsort(descending=True, stable=True)[: len(chosen) - len(kept)]
    return torch.cat([kept, fill])


class TokenAllocator:
    def __init__(self, budget: int = ARRCOCConfig.budget, strategy: str = "topk", seed: int = 0, rho_bins: int = 16,
                 theta_bins: int = 17, void_tolerance: float = 1e-4):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.budget, self.strategy, self.seed = budget, strategy, seed
        self.rho_bins, self.theta_bins, self.void_tolerance = rho_bins, theta_bins, void_tolerance

    def fallback_reason(self, scores: torch.Tensor, empty_image: bool = False) -> str | None:
        """[N] -> why this map cannot be trusted, or None."""
        if not torch.isfinite(scores).all():
            return "non_finite"
        span = float(scores.max() - scores.min())
        if empty_image or span <= self.void_tolerance * max(1.0, float(scores.abs().max())):
            return "semantic_void"
        return None

    def select(self, scores: torch.Tensor, grid: tuple[int, int], strategy: str) -> torch.Tensor:
        """[N] finite scores -> `budget` unique indices (any order)."""
        N, K = scores.numel(), self.budget
        if strategy == "topk":
            return scores.topk(K).indices
        if strategy == "logpolar":
            return logpolar_cells(scores, grid, K, self.rho_bins, self.theta_bins)
        if strategy == "grid":
            return grid_cells(N, K, scores.device)
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randperm(N, generator=generator)[:K].to(scores.device)

    def __call__(self, relevance: torch.Tensor, strategy: str | None = None,
                 empty_images: list[bool] | None = None, exclude: torch.Tensor | None = None) -> Allocation:
        """
        relevance [B, gh, gw] -> Allocation of exactly `budget` cells per image. empty_images marks images with
        nothing in them: whatever the map says there (e.g. attention that only follows position), it is a void.
        exclude [B, gh, gw] bool: cells never to choose (a second fixation's already-read cells).
        """
        strategy = strategy or self.strategy
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        B, gh, gw = relevance.shape
        if self.budget > gh * gw:
            raise ValueError(f"budget {self.budget} exceeds the {gh}x{gw} = {gh * gw} candidate cells")
        excluded = None if exclude is None else exclude.flatten(1).to(relevance.device, torch.bool)  # [B, N]
        if excluded is not None and self.budget > gh * gw - int(excluded.sum(1).max()):
            raise ValueError(f"budget {self.budget} exceeds the {gh * gw - int(excluded.sum(1).max())} candidate "
                             "cells not yet read")
        flat = relevance.detach().flatten(1).float()  # [B, N]
        all_indices, all_scores, fallbacks = [], [], []
        for b in range(B):  # B is small (1 in the app); each image may take a different strategy
            scores = flat[b]
            reason = self.fallback_reason(scores, bool(empty_images[b]) if empty_images else False)
            if excluded is None:
                chosen = self.select(scores, (gh, gw), "grid" if reason else strategy)
            else:
                masked = scores.masked_fill(excluded[b], float("-inf"))
                chosen = avoid(self.select(masked, (gh, gw), "grid" if reason else strategy), scores, excluded[b])
            safe = torch.nan_to_num(scores, nan=0.0, posinf=0.0, neginf=0.0)[chosen]
            order = safe.argsort(descending=True, stable=True)  # relevance order, raster order on ties
            all_indices.append(chosen[order])
            all_scores.append(safe[order])
            fallbacks.append(reason)
        indices = torch.stack(all_indices)  # [B, K]
        positions = torch.stack([indices // gw, indices % gw], dim=-1)  # [B, K, 2]
        return Allocation(indices, positions, torch.stack(all_scores), fallbacks)
