"""
AdaptiveTensionBalancer: mixes the S scorer maps (config.SCORERS, [B, S, gh, gw]) into one relevance map with
query-aware weights; its sizes follow the prior weights it is given, one a scorer.

Each map is standardised (so the weights, not the maps' scales, decide the mix), then weighted by
sigmoid outputs of a small MLP over a question summary, a gestalt summary and the maps' statistics.
Sigmoid, not softmax: a hard question may want more of everything (seed Part 43). The last layer starts
at zero with a bias of logit(prior_weights), so a fresh balancer returns exactly the prior weights.

From the same summary, tension_head sets the three tensions' residuals (explore, diversify, particularize:
arr_coc.relevance.tensions), weight and bias zero: a fresh balancer leaves every tension at its prior.
"""

import torch
import torch.nn as nn

STD_FLOOR = 0.02  # a map flatter than this is not stretched into noise by standardising


def standardise(maps: torch.Tensor) -> torch.Tensor:
    """[B, ..., gh, gw] -> zero mean, unit std per map (std floored)."""
    flat = maps.flatten(-2)
    mean = flat.mean(-1, keepdim=True)
    std = flat.std(-1, keepdim=True, unbiased=False).clamp_min(STD_FLOOR)
    return ((flat - mean) / std).view_as(maps)


def mix(maps: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[B, S, gh, gw] scorer maps, [B, S] weights -> [B, gh, gw] relevance: the weighted sum of the standardised maps."""
    return (weights.view(*weights.shape, 1, 1) * standardise(maps)).sum(1)


def shares(maps: torch.Tensor, weights: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
    """
    [B, S, gh, gw] scorer maps, [B, S] weights, [B, K] cells (row * gw + col: the selected saccades) -> [B, S]: each
    weighted, standardised map's share of those cells' relevance, its mean over them over the relevance's mean over
    them. A standardised map averages 0 over the image, so a share is the part of what lifted the cells above the
    average cell that this scorer gave; the shares sum to 1 (negative: a map that held them back), and they tell
    the scorers apart where the weights do not. Cells no higher than the average cell: all zeros.
    """
    parts = (weights.view(*weights.shape, 1, 1) * standardise(maps)).flatten(2)  # [B, S, N]
    lift = parts.gather(2, cells.unsqueeze(1).expand(-1, parts.shape[1], -1)).mean(-1)  # [B, S]
    total = lift.sum(-1, keepdim=True)  # [B, 1]: the cells' mean relevance
    return torch.where(total > 1e-6, lift / total.clamp_min(1e-6), torch.zeros_like(lift))


def agreement(maps: torch.Tensor) -> torch.Tensor:
    """[B, S, gh, gw] scorer maps -> [B]: their mean pairwise correlation over the cells (1: the same map S times,
    whatever the weights; then each scorer's share is about 1 / S)."""
    z = standardise(maps).flatten(2)  # [B, S, N]
    S = z.shape[1]
    corr = z @ z.transpose(1, 2) / z.shape[-1]  # [B, S, S]
    return (corr.sum((1, 2)) - corr.diagonal(dim1=1, dim2=2).sum(-1)) / (S * (S - 1))  # the S(S-1) ordered pairs


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """[B, L, D] with mask [B, L] -> [B, D]."""
    if mask is None:
        return x.mean(1)
    m = mask.to(x.dtype).unsqueeze(-1)
    return (x * m).sum(1) / m.sum(1).clamp_min(1)


STATS = 3  # per map: its mean, std and max, what map_stats reads ([B, STATS * S]: every map's mean, then std, then max)
SIZED = ("map_stats.weight", "head.1.weight", "head.1.bias")  # the tensors whose size follows the scorer count


def saved_part(name: str, shape: tuple[int, ...], saved: int, scorers: int) -> tuple[int, ...] | None:
    """The shape a balancer tensor `name` of `scorers` scorers had in a checkpoint of `saved` (None: unchanged)."""
    if name == "map_stats.weight":
        return (shape[0], STATS * saved)
    if name in ("head.1.weight", "head.1.bias"):
        return (saved, *shape[1:])
    return None


def grown(name: str, saved: torch.Tensor, fresh: torch.Tensor, count: int) -> torch.Tensor:
    """A SIZED tensor of a checkpoint with `count` scorers, placed in the fresh one of a balancer with more: the saved
    scorers' columns (map_stats) or rows (head) in their places; the newer scorers' map_stats columns zero, so the
    summary h, the saved scorers' weights and the tensions stay the checkpoint's, and their head rows fresh (weight
    zero, bias logit(prior)): a newer scorer weighs its prior weight."""
    out = fresh.clone()
    if name == "map_stats.weight":
        out.zero_()
        scorers = fresh.shape[1] // STATS
        for k in range(STATS):
            out[:, k * scorers:k * scorers + count] = saved[:, k * count:(k + 1) * count]
    else:
        out[:count] = saved
    return out


class AdaptiveTensionBalancer(nn.Module):
    def __init__(self, hidden_size: int = 1536, hidden: int = 32, prior_weights=(0.2, 0.2, 0.6)):
        super().__init__()
        scorers = len(prior_weights)  # S: one weight a scorer map
        self.query_summary = nn.Sequential(nn.LayerNorm(hidden_size), nn.Linear(hidden_size, hidden))
        self.gestalt_summary = nn.Sequential(nn.LayerNorm(hidden_size), nn.Linear(hidden_size, hidden))
        self.map_stats = nn.Linear(STATS * scorers, hidden)  # mean, std, max of each of the S maps
        self.head = nn.Sequential(nn.GELU(), nn.Linear(hidden, scorers))
        nn.init.zeros_(self.head[1].weight)
        with torch.no_grad():
            p = torch.tensor(prior_weights, dtype=torch.float).clamp(1e-4, 1 - 1e-4)
            self.head[1].bias.copy_(torch.log(p / (1 - p)))  # sigmoid(bias) == prior_weights
        self.tension_head = nn.Sequential(nn.GELU(), nn.Linear(hidden, 3))  # residuals of the three tensions
        nn.init.zeros_(self.tension_head[1].weight)
        nn.init.zeros_(self.tension_head[1].bias)
        self.hidden_size = hidden_size

    def forward(
        self,
        maps: torch.Tensor,  # [B, S, gh, gw] the scorers' maps, in config.SCORERS' order
        query_embeds: torch.Tensor,  # [B, L, D]
        query_mask: torch.Tensor | None = None,  # [B, L]
        gestalt_embeds: torch.Tensor | None = None,  # [B, Ng, D] or None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> the relevance map [B, gh, gw], the weights [B, S] and the tensions' residuals [B, 3]."""
        B = maps.shape[0]
        flat = maps.flatten(2)  # [B, S, N]
        stats = torch.cat([flat.mean(-1), flat.std(-1, unbiased=False), flat.amax(-1)], dim=1)  # [B, STATS * S]
        q = masked_mean(query_embeds.to(maps.dtype), query_mask)  # [B, D]
        g = gestalt_embeds.to(maps.dtype).mean(1) if gestalt_embeds is not None else maps.new_zeros(B, self.hidden_size)
        h = self.query_summary(q) + self.gestalt_summary(g) + self.map_stats(stats.nan_to_num(0.0))  # [B, hidden]
        weights = torch.sigmoid(self.head(h))  # [B, S]
        return mix(maps, weights), weights, self.tension_head(h)  # [B, gh, gw], [B, S], [B, 3]
