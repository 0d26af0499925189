"""
divprune: DivPrune (Alvar et al. 2025), written from the paper's description: keep the most diverse N of the
native view's merged tokens. On the post-merger cell embeddings, with cosine distance, the first pick is the
cell whose nearest neighbour is farthest; each next pick is the cell whose distance to the nearest picked cell
is largest, until N. The kept tokens stay in raster order at their original M-RoPE positions (Qwen3-VL: with
their own DeepStack features; the pruned ones' are dropped). N is what ARR's LLM reads at the same budget.

    answer = pipelines.answer_of("divprune")(parts, views, "What is here?", Request(budget=273))
"""

import torch
import torch.nn.functional as F

from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.stock import answer_reduced
from arr_coc.vlm.base import VisualTokens
from arr_coc.vlm.views import Views

ROW_CHUNK = 1024  # rows of the [K, K] distance matrix held at once for the first pick (16384 cells fit)


def diverse_order(embeddings: torch.Tensor, n: int) -> torch.Tensor:
    """
    embeddings [K, D] -> the indices of n of them [n] in DivPrune's greedy pick order (max-min cosine distance;
    ties go to the lower index). Distances are computed a chunk of rows, then one row per pick: never [K, K].
    """
    x = F.normalize(embeddings.float(), dim=-1)  # [K, D]
    K = x.shape[0]
    nearest = torch.empty(K, device=x.device)  # [K] each cell's distance to its nearest other cell
    for start in range(0, K, ROW_CHUNK):
        distance = 1 - x[start:start + ROW_CHUNK] @ x.T  # [c, K]
        rows = torch.arange(distance.shape[0], device=x.device)
        distance[rows, rows + start] = float("inf")  # a cell is not its own neighbour
        nearest[start:start + ROW_CHUNK] = distance.min(dim=1).values
    picks = torch.empty(n, dtype=torch.long, device=x.device)
    picks[0] = nearest.argmax() if K > 1 else 0
    to_picked = torch.full((K,), float("inf"), device=x.device)  # [K] distance to the nearest picked cell
    for t in range(1, n):
        to_picked = torch.minimum(to_picked, 1 - x @ x[picks[t - 1]])  # [K]
        to_picked[picks[:t]] = -float("inf")  # picked cells are never picked again
        picks[t] = to_picked.argmax()
    return picks


def keep_diverse(tokens: VisualTokens, read, n: int) -> tuple[VisualTokens, None]:
    """The n most diverse tokens, in raster order at their places (`read` is unused: DivPrune reads the tokens);
    none of them merged."""
    return tokens.take(diverse_order(tokens.features, n).sort().values), None


def encode_native(vlm, view) -> tuple[VisualTokens, None]:
    return vlm.encode_view(view), None  # [K, D]; nothing else to read


def answer(parts: Parts, views: Views, question: str, request: Request):
    return answer_reduced(parts, "divprune", views, question, request, encode_native, keep_diverse)
