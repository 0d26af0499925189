"""
pixelprune: PixelPrune (Wang et al. 2026, arXiv 2604.00886, "Pixel-Level Adaptive Visual Token Reduction via
Predictive Coding"), written from its method's description (the abstract and the authors' README: 2D predictive
coding before the ViT, training-free, a distance metric with threshold tau, `max` and tau = 0 by default), not from
its code. Pre-encoder and query-agnostic: it looks at pixels only, so the vision tower encodes only what it keeps.

    the native view (as `full` reads it), cut into cells of one merged token (2x2 patches: 28 px, Qwen3-VL 32 px;
    the merger needs whole 2x2 groups, so a cell is the unit that is kept or dropped)
      -> 2D predictive coding in raster order: a cell is redundant when its pixels equal, within tau, the
         reconstruction of its left or its upper neighbour (the kept cell that neighbour copies; left tried first);
         max absolute difference over the cell's pixels, 0-255 levels. tau = 0: exact duplicates (lossless);
         tau > 0: every dropped pixel's reconstruction is within tau of it (the bound holds because the comparison
         is with the reconstruction, not the neighbour's own pixels, so errors cannot drift along a row)
      -> pixelprune:   every kept cell (its own token count: the image's pixel-unique cells)
         pixelprune_n: the n most unique kept cells, n = what ARR's LLM reads at the same budget (all of them when
                       fewer are unique). A cell's uniqueness is its distance to the nearest other kept cell (RMS
                       over its pixels, 0-255): a cell unlike any other the coder kept goes first; ties to raster order
      -> those cells through the vision tower as one sequence at their true (h, w) rotary positions (VLM.encode_cells,
         ARR's sparse encoding), in raster order -> one image block at their M-RoPE places -> the LLM

The coder's time is the answer's selection, the tower's its vision: both are in its TTFT.

    request = Request(options=(Options(pixelprune_tau=0),))   # its Options: pipelines/declared/pixelprune.py
    answer = finished(pipelines.answer_of("pixelprune")(parts, views, "What is here?", request))
    answer.kept                                          # [M, 2] the (row, col) of the cells it encoded, native grid
"""

import torch

from arr_coc.pipelines.answer import TokenCounts
from arr_coc.pipelines.arr_scene import arr_visual_tokens
from arr_coc.pipelines.request import Parts, Request, setting
from arr_coc.pipelines.steps import finish, generate, start_watch
from arr_coc.vlm.views import Views

VIEW = "native"  # the view it prunes: the one `full` reads whole
ROW_CHUNK = 1024  # rows of the [M, M] distance matrix held at once (16384 cells fit)


def cell_pixels(view: torch.Tensor, cell: int) -> torch.Tensor:
    """A view [1, 3, H, W] in [0, 1] -> each cell's pixels [GH, GW, 3 * cell * cell] in 0-255 levels, rounded: the
    8-bit image a stock processor resizes (our views resize in float, which leaves a flat area a hair off flat)."""
    _, C, H, W = view.shape
    gh, gw = H // cell, W // cell
    x = view[0].float().mul(255).round().reshape(C, gh, cell, gw, cell).permute(1, 3, 0, 2, 4)  # [GH, GW, 3, cell, cell]
    return x.reshape(gh, gw, -1)


def unique_cells(pixels: torch.Tensor, tau: float = 0.0) -> torch.Tensor:
    """
    The cells [GH, GW, P] the coder keeps -> a mask [GH, GW]: a cell is dropped when its pixels are within tau
    (max absolute difference) of its left neighbour's reconstruction, else of its upper neighbour's. tau = 0 needs
    no scan (a reconstruction is then the neighbour's own pixels); tau > 0 runs along the anti-diagonals, each a
    step that depends only on the one before it.
    """
    if tau == 0:
        same_left = (pixels[:, 1:] == pixels[:, :-1]).all(-1)  # [GH, GW-1]
        same_up = (pixels[1:] == pixels[:-1]).all(-1)  # [GH-1, GW]
        dropped = torch.zeros(pixels.shape[:2], dtype=torch.bool, device=pixels.device)
        dropped[:, 1:] |= same_left
        dropped[1:] |= same_up
        return ~dropped
    return near_unique_cells(pixels, tau)


def near_unique_cells(pixels: torch.Tensor, tau: float) -> torch.Tensor:
    """unique_cells for tau > 0: each cell's source (the kept cell whose pixels reconstruct it), diagonal by diagonal."""
    gh, gw, _ = pixels.shape
    flat = pixels.reshape(gh * gw, -1)  # [N, P]
    source = torch.arange(gh * gw, device=pixels.device).reshape(gh, gw)  # [GH, GW] kept: itself
    for d in range(1, gh + gw - 1):
        rows = torch.arange(max(0, d - gw + 1), min(gh, d + 1), device=pixels.device)  # [k] the diagonal's cells
        cols = d - rows
        x = pixels[rows, cols]  # [k, P]
        chosen = source[rows, cols].clone()  # [k] itself unless a neighbour predicts it
        for dr, dc in ((1, 0), (0, 1)):  # the upper neighbour, then the left one: the left wins where both do
            has = (rows >= dr) & (cols >= dc)
            predictor = source[(rows - dr).clamp(min=0), (cols - dc).clamp(min=0)]  # [k]
            close = has & ((x - flat[predictor]).abs().amax(-1) <= tau)
            chosen = torch.where(close, predictor, chosen)
        source[rows, cols] = chosen
    return source == torch.arange(gh * gw, device=pixels.device).reshape(gh, gw)  # [GH, GW] kept: its own source


def most_unique(pixels: torch.Tensor, n: int) -> torch.Tensor:
    """
    Kept cells' pixels [M, P] -> the indices [n] of the n most unique, ascending: a cell's uniqueness is its RMS
    distance to the nearest other of the M; the largest n, ties to the lower index. Rows a chunk at a time.
    """
    M = pixels.shape[0]
    if n >= M:
        return torch.arange(M, device=pixels.device)
    x = pixels.float()
    nearest = torch.empty(M, device=x.device)  # [M]
    for start in range(0, M, ROW_CHUNK):
        distance = torch.cdist(x[start:start + ROW_CHUNK], x)  # [c, M] L2 over P pixels
        rows = torch.arange(distance.shape[0], device=x.device)
        distance[rows, rows + start] = float("inf")  # a cell is not its own neighbour
        nearest[start:start + ROW_CHUNK] = distance.min(dim=1).values
    nearest = nearest / x.shape[1] ** 0.5  # RMS per pixel value
    order = torch.sort(nearest, descending=True, stable=True).indices  # most unique first, ties by index
    return order[:n].sort().values


def kept_positions(view: torch.Tensor, cell: int, tau: float, n: int | None) -> torch.Tensor:
    """The (row, col) [K, 2] of the cells PixelPrune keeps of a view, raster order (n: at most that many, the most
    unique; None: every kept cell)."""
    pixels = cell_pixels(view, cell)  # [GH, GW, P]
    keep = unique_cells(pixels, tau)  # [GH, GW]
    positions = keep.nonzero()  # [M, 2] raster order
    if n is not None:
        positions = positions[most_unique(pixels[keep], n)]
    return positions.cpu()


@torch.no_grad()
def answer_pruned(parts: Parts, pipeline: str, views: Views, question: str, request: Request, at_arr_count: bool):
    """PixelPrune's answer (the module docstring's diagram): its tokens as they come, then its Answer."""
    vlm = parts.vlm
    tau = float(setting(request, "pixelprune_tau", parts.pipeline.pixelprune_tau))  # its Options' tau, if given
    watch, start = start_watch(vlm.device)
    view = views.tensor(VIEW)
    with watch.section("selection"):
        n = arr_visual_tokens(parts, views, request, question) if at_arr_count else None
        positions = kept_positions(view, vlm.cell, tau, n)  # [K, 2]
    with watch.section("vision"):
        kept = vlm.encode_cells(view, positions)  # [K, D] at their true places
    yield None
    prompt = vlm.prompt(question, [kept])
    generation, new_tokens = yield from generate(vlm, prompt, watch, request)
    tokens = TokenCounts.of_prompt(prompt.length, 0, 0, total_visual=len(kept))
    yield finish(vlm, pipeline, generation, new_tokens, tokens, watch, start, views,
                 vlm.gflops([len(kept)], prompt.length), kept=kept.positions)


def answer(parts: Parts, views: Views, question: str, request: Request):
    """pixelprune: every cell its predictive coder keeps."""
    return answer_pruned(parts, "pixelprune", views, question, request, at_arr_count=False)


def answer_n(parts: Parts, views: Views, question: str, request: Request):
    """pixelprune_n: PixelPrune at ARR's token count: of the cells it keeps, the n most unique (each one's distance to
    the nearest other kept cell), n being what ARR's LLM reads at the same budget (all of them when fewer are
    unique), encoded at their true places."""
    return answer_pruned(parts, "pixelprune_n", views, question, request, at_arr_count=True)
