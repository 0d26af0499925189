"""
The three ways of knowing: each scorer maps the texture array to a relevance map [B, gh, gw]. Each is one entry of
arr_coc.relevance.config.SCORERS; as the layer builds and calls it, a scorer module has from_config(ARRCOCConfig) and
score(textures, ScoringInputs) (its forward keeps the arguments it reads).

Each scorer is a hand-designed prior plus a learned residual whose last layer starts at zero, so a fresh
scorer equals its prior exactly and training only improves on it (docs/ARCHITECTURE.md §1).

- InformationScorer (propositional): where the detail is (edges, high-pass energy, colour variance).
- PerspectivalScorer (salience): what stands out (spectral residual, colour contrast, colour rarity).
- ParticipatoryScorer (query coupling): how the question couples to each cell: the gestalt-attention
  prior from the VLM plus a learned cross-attention of cell features to the question's token embeddings, plus
  (given the prior pass's hidden states) the StateScorer's residual (arr_coc.relevance.states).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from arr_coc.relevance.states import StateScorer
from arr_coc.relevance.texture import CHANNEL_NAMES

DETAIL_CHANNELS = [CHANNEL_NAMES.index(n) for n in ("edge_magnitude", "highpass_energy", "colour_variance")]
SALIENCY_CHANNELS = [CHANNEL_NAMES.index(n) for n in ("spectral_saliency", "colour_contrast", "colour_rarity")]


@dataclass(frozen=True)
class ScoringInputs:
    """What a scorer may read besides the texture array (the layer's forward arguments; None: the caller has none)."""
    query_embeds: torch.Tensor  # [B, L, D] token embeddings of the question
    query_mask: torch.Tensor | None = None  # [B, L], 1 for real tokens
    participatory_prior: torch.Tensor | None = None  # [B, gh, gw] the gestalt attention prior
    gestalt_states: torch.Tensor | None = None  # [B, ggh, ggw, D] the prior pass's gestalt states
    question_states: torch.Tensor | None = None  # [B, Lq, D] its question rows' states


def mean_of(textures: torch.Tensor, channels: list[int]) -> torch.Tensor:
    """Mean of some texture channels -> [B, gh, gw]; plain slices, so CUDA graphs capture it (no index upload)."""
    return sum(textures[:, c] for c in channels) / len(channels)


def _zero_(layer: nn.Module) -> nn.Module:
    """Zero a residual's last layer so the scorer starts as its prior."""
    nn.init.zeros_(layer.weight)
    if getattr(layer, "bias", None) is not None:
        nn.init.zeros_(layer.bias)
    return layer


class InformationScorer(nn.Module):
    """Propositional knowing: how much detail a cell holds."""

    def __init__(self, channels: int = 13, hidden: int = 16):
        super().__init__()
        self.residual = nn.Sequential(
            nn.Conv2d(channels, hidden, 3, padding=1), nn.GELU(), _zero_(nn.Conv2d(hidden, 1, 1))
        )

    @classmethod
    def from_config(cls, config) -> "InformationScorer":
        return cls(config.texture_channels, config.info_hidden)

    def score(self, textures: torch.Tensor, inputs: ScoringInputs) -> torch.Tensor:
        return self(textures)  # [B, gh, gw]

    def prior(self, textures: torch.Tensor) -> torch.Tensor:
        return mean_of(textures, DETAIL_CHANNELS)  # [B, gh, gw]

    def forward(self, textures: torch.Tensor) -> torch.Tensor:
        return self.prior(textures) + self.residual(textures).squeeze(1)  # [B, gh, gw]


class PerspectivalScorer(nn.Module):
    """Perspectival knowing: what stands out to a viewer (a small CNN over the texture, seed Part 42)."""

    def __init__(self, channels: int = 13, hidden: int = 16):
        super().__init__()
        self.residual = nn.Sequential(
            nn.Conv2d(channels, hidden, 3, padding=1), nn.GELU(),
            nn.Conv2d(hidden, hidden, 3, padding=2, dilation=2), nn.GELU(),  # wider context: salience is relative
            _zero_(nn.Conv2d(hidden, 1, 1)),
        )

    @classmethod
    def from_config(cls, config) -> "PerspectivalScorer":
        return cls(config.texture_channels, config.persp_hidden)

    def score(self, textures: torch.Tensor, inputs: ScoringInputs) -> torch.Tensor:
        return self(textures)  # [B, gh, gw]

    def prior(self, textures: torch.Tensor) -> torch.Tensor:
        return mean_of(textures, SALIENCY_CHANNELS)  # [B, gh, gw]

    def forward(self, textures: torch.Tensor) -> torch.Tensor:
        return self.prior(textures) + self.residual(textures).squeeze(1)  # [B, gh, gw]


class ParticipatoryScorer(nn.Module):
    """
    Participatory knowing: the coupling of the question and each cell.

    Prior: the VLM's own question->gestalt attention, upsampled to the candidate grid (None = no prior).
    Learned: cells attend to the question's tokens; the per-token scores are pooled with learnable
    max / mean / sum weights (seed Part 43), scaled by a gain that starts at zero. Given the prior pass's hidden
    states (gestalt [B, gh, gw, D], question [B, Lq, D]), the StateScorer's residual (zero at start) is added.
    """

    def __init__(self, channels: int = 13, hidden_size: int = 1536, dim: int = 32):
        super().__init__()
        self.cell_proj = nn.Sequential(nn.Conv2d(channels, dim, 3, padding=1), nn.GELU(), nn.Conv2d(dim, dim, 1))
        self.query_proj = nn.Sequential(nn.LayerNorm(hidden_size), nn.Linear(hidden_size, dim))
        self.pool_logits = nn.Parameter(torch.zeros(3))  # softmax -> weights of max, mean, sum pooling
        self.gain = nn.Parameter(torch.zeros(()))  # zero: a fresh scorer is its prior
        self.scale = dim**-0.5
        self.states = StateScorer(channels, hidden_size, dim, heads=math.gcd(4, dim))

    @classmethod
    def from_config(cls, config) -> "ParticipatoryScorer":
        return cls(config.texture_channels, config.hidden_size, config.partic_dim)

    def score(self, textures: torch.Tensor, inputs: ScoringInputs) -> torch.Tensor:
        x = inputs
        return self(textures, x.query_embeds, x.query_mask, x.participatory_prior, x.gestalt_states,
                    x.question_states)  # [B, gh, gw]

    def forward(
        self,
        textures: torch.Tensor,  # [B, 13, gh, gw]
        query_embeds: torch.Tensor,  # [B, L, D] token embeddings of the question
        query_mask: torch.Tensor | None = None,  # [B, L], 1 for real tokens
        prior: torch.Tensor | None = None,  # [B, gh, gw] gestalt attention, or None
        gestalt_states: torch.Tensor | None = None,  # [B, ggh, ggw, D] the prior pass's gestalt states, or None
        question_states: torch.Tensor | None = None,  # [B, Lq, D] its question rows' states, or None
    ) -> torch.Tensor:
        B, _, gh, gw = textures.shape
        cells = self.cell_proj(textures).flatten(2).transpose(1, 2)  # [B, N, d]
        tokens = self.query_proj(query_embeds.to(cells.dtype))  # [B, L, d]
        if query_mask is None:
            query_mask = torch.ones(tokens.shape[:2], device=tokens.device)
        mask = query_mask.to(cells.dtype).unsqueeze(1)  # [B, 1, L]
        scores = (cells @ tokens.transpose(1, 2)) * self.scale  # [B, N, L]
        count = mask.sum(-1).clamp_min(1)  # [B, 1]
        pooled_max = scores.masked_fill(mask == 0, float("-inf")).amax(-1).nan_to_num(0.0, neginf=0.0)
        pooled_sum = (scores * mask).sum(-1) / count.sqrt()  # sqrt keeps long questions from dominating
        pooled_mean = (scores * mask).sum(-1) / count
        w = self.pool_logits.softmax(0)
        learned = (w[0] * pooled_max + w[1] * pooled_mean + w[2] * pooled_sum).view(B, gh, gw)
        base = prior if prior is not None else torch.zeros_like(learned)
        out = base.to(learned.dtype) + self.gain * learned  # [B, gh, gw]
        if gestalt_states is None or question_states is None:
            return out
        return out + self.states(textures, gestalt_states, question_states)  # [B, gh, gw]
