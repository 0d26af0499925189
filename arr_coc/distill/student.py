"""
The student's side of self-distillation (issue #52): ARR's relevance map against the teacher's map (cache.Target).

The teacher's map lives on the `full` native view's cells; ARR scores the candidate grid (the same grid unless the
native one is under twice the gestalt's per side), so a map is first brought to the candidate grid (`on_grid`: area
resampling, sum 1). The loss is the KL divergence from the teacher's map to the softmax of the relevance map over
cells (`distill_loss`, the same temperature as the box loss), or SD-RPN's binary cross-entropy against the cells
that hold half the teacher's mass and those below the uniform level (`bce_loss`). The measure is how much of the
teacher's mass lies in ARR's top-k cells (`top_mass`: 1 when ARR's k saccades hold everything the model looked at).

    target = on_grid(cache[item].map, views.candidate_grid)          # [GH, GW], sums to 1
    loss = distill_loss(maps.relevance[0], target, temperature=0.5)  # differentiable in the relevance
    share = top_mass(maps.relevance[0], target, k=64)                # in [0, 1]
    share = mass_at(target, out.indices[0])                          # on the cells ARR selected
"""

import torch
import torch.nn.functional as F


def on_grid(target: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """A teacher map [gh, gw] on a (GH, GW) grid -> [GH, GW] float32, sums to 1: unchanged on its own grid, else
    resampled by area (adaptive average pooling: each new cell the mean of the old cells its window covers, so a
    region keeps its share of the mass, shrunk or grown)."""
    target = target.float()
    if tuple(target.shape) != tuple(grid):
        target = F.interpolate(target[None, None], size=tuple(grid), mode="area")[0, 0]
    total = target.sum()
    return target / total if total > 0 else torch.full_like(target, 1.0 / target.numel())


def distill_loss(relevance: torch.Tensor, target: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(target || softmax(relevance / temperature)) over the cells: relevance [GH, GW], target [GH, GW] (sum 1)."""
    t = target.flatten().to(relevance.dtype)
    log_p = F.log_softmax(relevance.flatten() / temperature, dim=0)
    return (t * (t.clamp_min(1e-12).log() - log_p)).sum()


POSITIVE_MASS = 0.5  # bce: the teacher's top cells holding this share of its mass are the positives


def labels(target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SD-RPN's labels from a teacher map [GH, GW] (sum 1) -> (positives, negatives) [N] bool: its top cells holding
    POSITIVE_MASS of its mass (at least one), and the cells under the uniform map's 1 / N; the rest are ignored."""
    t = target.flatten()
    order = t.argsort(descending=True)
    inside = (t[order].cumsum(0) - t[order]) < POSITIVE_MASS * t.sum()  # cells added before the share was reached
    positives = torch.zeros_like(t, dtype=torch.bool).scatter_(0, order, inside)
    return positives, (t < 1.0 / t.numel()) & ~positives


def bce_loss(relevance: torch.Tensor, target: torch.Tensor, temperature: float) -> torch.Tensor:
    """SD-RPN's loss, balanced: the binary cross-entropy of relevance / temperature (a logit per cell) against
    `labels`, the positives' mean and the negatives' mean averaged."""
    positives, negatives = labels(target)
    logits = relevance.flatten() / temperature
    pos = F.binary_cross_entropy_with_logits(logits[positives], torch.ones_like(logits[positives]))
    neg = F.binary_cross_entropy_with_logits(logits[negatives], torch.zeros_like(logits[negatives])) \
        if negatives.any() else logits.sum() * 0
    return (pos + neg) / 2


LOSSES = {"kl": distill_loss, "bce": bce_loss}  # --distill-loss: the name of each


def mass_at(target: torch.Tensor, cells: torch.Tensor) -> float:
    """The teacher's mass on some cells: target [GH, GW] (sum 1), cells [K] (row * GW + col) -> [0, 1]."""
    return float(target.flatten()[cells.to(target.device)].sum())


def top_mass(relevance: torch.Tensor, target: torch.Tensor, k: int) -> float:
    """The teacher's mass inside the k most relevant cells: relevance [GH, GW], target [GH, GW] (sum 1) -> [0, 1]."""
    return mass_at(target, relevance.detach().flatten().float().topk(min(k, relevance.numel())).indices)
