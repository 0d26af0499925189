"""
The participatory prior on the candidate grid: the VLM's prior pass gives the question's attention to each
gestalt token; the relevance layer reads it upsampled to the candidate cells and scaled to [0, 1].

    attention = vlm.prior_attention(question, gestalt, 0.5)                          # [Ng] on the gestalt grid
    prior = upsample_map(attention, views.gestalt_grid, views.candidate_grid)        # [1, GH, GW] in [0, 1]
"""

import torch
import torch.nn.functional as F

from arr_coc.relevance.texture import minmax


def upsample_map(values: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """[N] values on a (rows, cols) grid -> [1, *size] bilinear map, min-max scaled to [0, 1]."""
    m = values.float().view(1, 1, *grid)  # [1, 1, rows, cols]
    m = F.interpolate(m, size=size, mode="bilinear", align_corners=False)[:, 0]  # [1, *size]
    return minmax(m, floor=0)
