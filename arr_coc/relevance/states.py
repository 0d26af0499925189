"""
StateScorer: the participatory scorer's reading of the prior pass's hidden states (issue #52).

The prior pass already runs the LLM up to its middle layer over [gestalt + question]; besides the question's
attention to the gestalt (the participatory prior), that layer's hidden states say what each gestalt token holds
and what the question asks. This module couples them and brings the result to the candidate grid:

    question states [B, Lq, D] --query--.
                                         >-- per head: the question rows' softmax over the gestalt, their mean
    gestalt states [B, gh, gw, D] --key-'       (log, so 0 = a uniform gaze)              -> [B, heads, gh, gw]
    gestalt states --value-- x the question's mean, projected (a bilinear match per channel) -> [B, dim, gh, gw]
    both, upsampled (bilinear) to the candidate grid, beside the 13 texture channels (the guide: where the ink is)
          -> 3x3 conv, GELU, 3x3 conv, GELU, 1x1 conv (zero at start)                        -> [B, GH, GW]

Tiny and of fixed shapes (CUDA-graphed with the layer): at 64x64 cells, a 256-token gestalt and D = 1536, about 0.12
GMAC (the two 3x3 convs 0.1, the projections 0.03), 180k parameters. Its last layer starts at zero, so a fresh scorer
adds nothing and a layer without it (an older checkpoint) is the same layer.

    scorer = StateScorer(channels=13, hidden_size=1536, dim=32, heads=4)
    residual = scorer(textures, gestalt_states, question_states)   # [B, GH, GW], zeros before training
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class StateScorer(nn.Module):
    def __init__(self, channels: int = 13, hidden_size: int = 1536, dim: int = 32, heads: int = 4):
        super().__init__()
        if dim % heads:
            raise ValueError(f"the state scorer's width {dim} must split over its {heads} heads")
        self.heads = heads
        self.query = nn.Sequential(nn.LayerNorm(hidden_size), nn.Linear(hidden_size, dim))
        self.key = nn.Sequential(nn.LayerNorm(hidden_size), nn.Linear(hidden_size, dim))
        self.value = nn.Sequential(nn.LayerNorm(hidden_size), nn.Linear(hidden_size, dim))
        self.asked = nn.Linear(dim, dim)  # the question's mean value-space probe
        last = nn.Conv2d(dim, 1, 1)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.guide = nn.Sequential(nn.Conv2d(channels + heads + dim, dim, 3, padding=1), nn.GELU(),
                                   nn.Conv2d(dim, dim, 3, padding=1), nn.GELU(), last)

    def coupling(self, gestalt: torch.Tensor, question: torch.Tensor) -> torch.Tensor:
        """gestalt [B, Ng, D], question [B, Lq, D] -> [B, heads + dim, Ng]: the question's gaze per head and the
        question-matched gestalt content."""
        B, Ng, _ = gestalt.shape
        Lq, h = question.shape[1], self.heads
        asked = self.query(question)  # [B, Lq, dim]
        q = asked.view(B, Lq, h, -1).transpose(1, 2)  # [B, h, Lq, d]
        k = self.key(gestalt).view(B, Ng, h, -1).transpose(1, 2)  # [B, h, Ng, d]
        gaze = ((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5).softmax(-1).mean(2)  # [B, h, Ng]
        gaze = (gaze * Ng).clamp_min(1e-6).log()  # 0 where the gaze is uniform
        v = self.value(gestalt)  # [B, Ng, dim]
        matched = v * self.asked(asked.mean(1)).unsqueeze(1)  # [B, Ng, dim]
        return torch.cat([gaze, matched.transpose(1, 2)], dim=1)  # [B, h + dim, Ng]

    def forward(
        self,
        textures: torch.Tensor,  # [B, 13, GH, GW] the texture array on the candidate grid
        gestalt_states: torch.Tensor,  # [B, gh, gw, D] the gestalt tokens' states at the prior pass's layer
        question_states: torch.Tensor,  # [B, Lq, D] the question rows' states there
    ) -> torch.Tensor:
        B, gh, gw, _ = gestalt_states.shape
        dtype = textures.dtype
        features = self.coupling(gestalt_states.flatten(1, 2).to(dtype), question_states.to(dtype))  # [B, C, Ng]
        features = F.interpolate(features.view(B, -1, gh, gw), size=textures.shape[-2:], mode="bilinear",
                                 align_corners=False)  # [B, C, GH, GW]
        return self.guide(torch.cat([textures, features], dim=1)).squeeze(1)  # [B, GH, GW]
