"""
The student's side of self-distillation (issue #52): ARR's relevance map against the teacher's map (cache.Target).

The teacher's map lives on the `full` native view's cells; ARR scores the candidate grid (the same grid unless the
native one is under twice the gestalt's per side), so a map is first brought to the candidate grid (`on_grid`: area
resampling, sum 1). The loss is the KL divergence from the teacher's map to the softmax of the relevance map over
cells (`distill_loss`, the same temperature as the box loss); the measure is how much of the teacher's mass lies in
ARR's top-k cells (`top_mass`: 1 when ARR's k saccades hold everything the model looked at).

    target = on_grid(cache[item].map, views.candidate_grid)          # [GH, GW], sums to 1
    loss = distill_loss(maps.relevance[0], target, temperature=0.5)  # differentiable in the relevance
    share = top_mass(maps.relevance[0], target, k=64)                # in [0, 1]
"""

import torch
import torch.nn.functional as F


def on_grid(target: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """A teacher map [gh, gw] on a (GH, GW) grid -> [GH, GW] float32, sums to 1: unchanged on its own grid, else
    resampled by area (each new cell gets the mass of the old cells it covers, bilinear where it grows)."""
    target = target.float()
    if tuple(target.shape) != tuple(grid):
        mode = "area" if target.shape[0] >= grid[0] and target.shape[1] >= grid[1] else "bilinear"
        extra = {} if mode == "area" else {"align_corners": False}
        target = F.interpolate(target[None, None], size=tuple(grid), mode=mode, **extra)[0, 0].clamp_min(0)
    total = target.sum()
    return target / total if total > 0 else torch.full_like(target, 1.0 / target.numel())


def distill_loss(relevance: torch.Tensor, target: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(target || softmax(relevance / temperature)) over the cells: relevance [GH, GW], target [GH, GW] (sum 1)."""
    t = target.flatten().to(relevance.dtype)
    log_p = F.log_softmax(relevance.flatten() / temperature, dim=0)
    return (t * (t.clamp_min(1e-12).log() - log_p)).sum()


def top_mass(relevance: torch.Tensor, target: torch.Tensor, k: int) -> float:
    """The teacher's mass inside the k most relevant cells: relevance [GH, GW], target [GH, GW] (sum 1) -> [0, 1]."""
    cells = relevance.detach().flatten().float().topk(min(k, relevance.numel())).indices  # [k]
    return float(target.flatten()[cells.to(target.device)].sum())
