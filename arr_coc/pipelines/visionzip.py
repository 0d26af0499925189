"""
visionzip: VisionZip (Yang et al. 2025), written from the paper's description, as its Qwen2.5-VL version
works: vision-side dominant and contextual tokens.

    the native view -> the whole vision tower; its last block's attention computed explicitly (VLM.encode_view_attention)
      -> dominant: the D = N - C cells that receive the most attention (patch: head mean, query sum; cell: mean of 4)
      -> contextual: C = max(1, round(N / 10)) targets at an even stride among the remaining cells; every other
         remaining cell joins the target whose last-block key (head- and patch-averaged, L2-normalised) is most
         similar; a contextual token is target + mean(assigned) after the merger, at the target's position
      -> the N tokens in raster order at their original M-RoPE positions -> the LLM

Qwen2.5-VL: the last block is a full-attention block (window attention elsewhere). Qwen3-VL: the DeepStack
features of the pruned and merged-away cells are dropped with them; a contextual token keeps its target's.

    answer = pipelines.answer_of("visionzip")(parts, views, "What is here?", Request(budget=273))
"""

from dataclasses import replace

import torch
import torch.nn.functional as F

from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.stock import answer_reduced
from arr_coc.vlm.base import VisionAttention, VisualTokens
from arr_coc.vlm.views import Views

CONTEXTUAL_SHARE = 10  # one contextual token per this many kept tokens (C = max(1, round(N / 10)))


def contextual_count(n: int) -> int:
    return max(1, round(n / CONTEXTUAL_SHARE))


def dominant_cells(received: torch.Tensor, n: int) -> torch.Tensor:
    """The D = n - C cells [D] that receive the most attention (received [K]), in raster order."""
    return received.topk(n - contextual_count(n)).indices.sort().values


def merge_contextual(tokens: VisualTokens, keys: torch.Tensor, rest: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """
    The remaining cells rest [R] (raster order) merged into c contextual tokens -> (their target cells [c],
    their features [c, D]): targets at an even stride; each other cell joins its most similar target by key.
    """
    targets = rest[torch.arange(c, device=rest.device) * len(rest) // c]  # [c]
    others = rest[~torch.isin(rest, targets)]  # [R - c]
    k = F.normalize(keys.float(), dim=-1)  # [K, hd]
    assigned = (k[others] @ k[targets].T).argmax(dim=1)  # [R - c] index of each one's target
    features = tokens.features  # [K, D]
    sums = torch.zeros(c, features.shape[1], device=features.device, dtype=torch.float32)
    sums.index_add_(0, assigned, features[others].float())  # [c, D]
    counts = torch.bincount(assigned, minlength=c).clamp(min=1).unsqueeze(1)  # [c, 1]; a lone target adds 0
    return targets, (features[targets].float() + sums / counts).to(features.dtype)


def keep_zipped(tokens: VisualTokens, attention: VisionAttention, n: int) -> tuple[VisualTokens, torch.Tensor]:
    """n tokens: the dominant cells and the contextual tokens at their targets' places, in raster order; and
    the targets' places [C, 2] (row, col), which hold merged context."""
    K, device = len(tokens), attention.received.device
    dominant = dominant_cells(attention.received, n)  # [D]
    is_rest = torch.ones(K, dtype=torch.bool, device=device)
    is_rest[dominant] = False
    targets, contextual = merge_contextual(tokens, attention.keys, is_rest.nonzero().squeeze(1), contextual_count(n))
    index = torch.cat([dominant, targets]).sort()  # [n] raster order
    kept = tokens.take(index.values)
    features = kept.features.clone()
    is_target = index.indices >= len(dominant)  # [n] which kept places hold a contextual token
    features[is_target.to(features.device)] = contextual[index.indices[is_target] - len(dominant)]
    return replace(kept, features=features), tokens.positions[targets.cpu()]


def encode_with_attention(vlm, view) -> tuple[VisualTokens, VisionAttention]:
    return vlm.encode_view_attention(view)  # [K, D], the last block's attention per cell


def answer(parts: Parts, views: Views, question: str, request: Request):
    return answer_reduced(parts, "visionzip", views, question, request, encode_with_attention, keep_zipped)
