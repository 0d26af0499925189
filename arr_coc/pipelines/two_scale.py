"""
two_scale: ARR's two-scale look (issue #61 part 3; ZoomEye's and Q-Zoom's coarse-to-fine). At 1792 px a gestalt
token covers 4 x 4 native cells, so the gestalt's prior cannot point at anything smaller. Under ARR's Options.look
"two_scale" the first look re-reads the region around the relevance peak as a view of its own:

    the page's relevance (the scorers on the gestalt's prior) -> its peak -> a rectangle of crop_tokens candidate
          cells centred on it, clamped in-bounds (crop_rect) -> the crop's own views (Views on the cropped image; its
          native view, as the stock image processor converts that crop: one token a cell, no resampling) -> VLM (the
          crop's tokens; the prior pass on them: the question's attention to the crop, look_closer) -> the page's
          prior with the crop's put in over the cells it covers (crop_prior_map) -> the layer scores again -> the
          crop's cells lifted above every cell outside it (crop_first) -> the usual selection of exactly `budget`
          cells (arr_scene.closer_look, arr.answer)

The rule that combines the two scales: the crop takes the budget first. Inside it the cells are ranked by the layer
over the crop's gaze (the textures as ever); only a budget larger than the crop reaches beyond it, in the page's
order. The crop's gaze put in the prior alone left most of the budget outside the crop, where the page's blurred
map stays high while a sharp gaze leaves most of the crop near 0. Mean box recall on 6 box_word pages of 1792 px
(box_grid, pocket step 78202, the untrained prior layer, budget 64, a first look by hand): one look 0.53; the gaze in
the prior alone 0.15; the page's values inside the crop handed out again in the crop's order 0.62; crop first
0.67 (1.00 on each of the 4 pages whose crop held the box, 0 on the 2 whose crop missed it).

The crop is read at native resolution: its side in cells is its token grid (crop_shape: a square of crop_tokens
cells, 16 x 16 = 448 px at 256 tokens), so the crop's prior points at single native cells.

The crop's tokens pass the vision tower and the prior pass, not the answer's prompt: the crop only points. The cells
the answer needs are read again as saccades, at native resolution and at their true places on the page, so the
answer's prompt is a one-look ARR's (gestalt + saccades + question, the layout the model was trained on) and the
two looks differ only in which cells they choose. They are counted all the same: in ARR's visual tokens
(arr_scene.arr_visual_tokens; TokenCounts.crop), so that the reducers at ARR's count read as many, in its GFLOPs
(crop_gflops) and in its vision and selection times.

    rect = crop_rect(maps.relevance[0], 256)          # (top, left, height, width) in candidate cells
    crop = look_closer(parts, views, question, maps.relevance, 256, watch)   # its views, tokens [Nc, D], prior
    prior = crop_prior_map(observation.prior, crop)   # [1, GH, GW]: the crop's gaze inside it, the page's outside
"""

from dataclasses import dataclass, field

import torch
from PIL import Image

from arr_coc.pipelines.request import Parts
from arr_coc.relevance.prior import upsample_map
from arr_coc.runtime.timing import Stopwatch
from arr_coc.vlm.base import VLM, VisualTokens
from arr_coc.vlm.views import Views, fit_grid, make_views, native_grid


@dataclass
class Crop:
    """The two-scale look's crop: a rectangle of candidate cells, its own views and tokens, the question's gaze there."""
    top: int  # candidate-grid row of its first cell
    left: int  # candidate-grid column of its first cell
    height: int  # its rows of candidate cells
    width: int  # its columns of candidate cells
    views: Views = field(repr=False)  # the cropped image's own views (crop_views): the tower read its native view
    tokens: VisualTokens = field(repr=False)  # [Nc, D] the crop's native view, encoded whole
    prior: torch.Tensor = field(repr=False)  # [1, height, width] the question's attention to the crop's tokens on
    # its cells, in [0, 1]

    @property
    def rect(self) -> tuple[int, int, int, int]:
        """(top, left, height, width) in candidate cells."""
        return self.top, self.left, self.height, self.width


def crop_shape(grid: tuple[int, int], tokens: int) -> tuple[int, int]:
    """The crop's (rows, cols) of candidate cells on a (GH, GW) grid: a square of at most `tokens` cells
    (views.fit_grid of a square: 16 x 16 for 256, 14 x 14 for 200), each side at most the grid's. Read one token a
    cell, the crop is at native resolution; square, its view has the one shape of every page (the 256-token
    gestalt's, 16 x 16: the vision tower's CUDA graph of that shape is the one replayed)."""
    rows, cols = fit_grid(1, 1, tokens)
    return min(rows, grid[0]), min(cols, grid[1])


def crop_rect(relevance: torch.Tensor, tokens: int) -> tuple[int, int, int, int]:
    """
    The crop around a relevance map's peak: relevance [GH, GW] -> (top, left, height, width) in cells, crop_shape's
    rectangle centred on the most relevant cell (the first in raster order on a tie; NaN never peaks), its cell at
    (height // 2, width // 2) of the rectangle, which is moved in-bounds where it would cross the grid's edge.
    """
    GH, GW = relevance.shape[-2:]
    h, w = crop_shape((GH, GW), tokens)
    flat = torch.nan_to_num(relevance.reshape(-1).float(), nan=float("-inf"))  # [GH * GW]
    row, col = divmod(int(flat.argmax()), GW)
    return min(max(row - h // 2, 0), GH - h), min(max(col - w // 2, 0), GW - w), h, w


def crop_image(views: Views, rect: tuple[int, int, int, int]) -> Image.Image:
    """The crop's cells of the high-res view (the pixels the saccades are encoded from) as an RGB image, quantised as
    Views.pil quantises a view: height x width cells of views.cell px."""
    top, left, h, w = rect
    c = views.cell
    part = views.tensor("highres")[0, :, top * c:(top + h) * c, left * c:(left + w) * c]  # [3, h * c, w * c]
    return Image.fromarray(part.permute(1, 2, 0).mul(255).round().to(torch.uint8).cpu().numpy())


def crop_views(image: Image.Image, tokens: int, vlm: VLM) -> Views:
    """The cropped image's own views at the VLM's cell and min_pixels, capped at `tokens` cells: its native view is
    the stock image processor's conversion of that image at max_pixels = tokens cells (smart_resize), the crop
    itself where it holds no more (crop_shape's always does, but for a min_pixels above it: Qwen3-VL's 8 x 8)."""
    return make_views(image, gestalt_tokens=tokens, budget_tokens=tokens, max_cells=tokens, device=vlm.device,
                      cell=vlm.cell, min_pixels=vlm.min_pixels)


def crop_token_count(views: Views, tokens: int, min_pixels: int | None) -> int:
    """The crop view's tokens on this page, before any pixel is read (arr_scene.arr_visual_tokens): its native grid, as
    crop_views makes it of crop_shape's cells."""
    h, w = crop_shape(views.candidate_grid, tokens)
    rows, cols = native_grid(w * views.cell, h * views.cell, tokens, views.cell, min_pixels)
    return rows * cols


def look_closer(parts: Parts, views: Views, question: str, relevance: torch.Tensor, tokens: int,
                watch: Stopwatch) -> Crop:
    """
    The second scale: the crop around relevance [1, GH, GW]'s peak (crop_rect), its own native view encoded whole
    (timed as vision), and the prior pass on its tokens (timed as selection): the question's attention to each crop
    token at the prior's layer, upsampled to the crop's cells and scaled to [0, 1] as the page's prior is
    (relevance.prior.upsample_map) -> the Crop.
    """
    vlm = parts.vlm
    rect = crop_rect(relevance[0], tokens)
    with watch.section("vision"):
        closer = crop_views(crop_image(views, rect), tokens, vlm)
        seen = vlm.encode_view(closer.tensor("native"))  # [Nc, D] on the crop's native grid
    with watch.section("selection"):
        gaze = vlm.prior_pass(question, seen, parts.pipeline.prior_layer_fraction)  # attention [Nc]
        prior = upsample_map(gaze.attention, closer.native_grid, rect[2:])  # [1, h, w]
    return Crop(*rect, closer, seen, prior)


def crop_prior_map(prior: torch.Tensor, crop: Crop) -> torch.Tensor:
    """The page's prior [1, GH, GW] with the crop's gaze in its place over the cells the crop covers (both in [0, 1],
    the range the layer's participatory scorer reads) -> [1, GH, GW]; outside, the page's map."""
    out = prior.clone()
    out[:, crop.top:crop.top + crop.height, crop.left:crop.left + crop.width] = crop.prior.to(out)
    return out


def crop_first(relevance: torch.Tensor, crop: Crop) -> torch.Tensor:
    """
    Relevance [1, GH, GW] with the crop's cells lifted above every cell outside it, each side's order kept: the
    crop's least relevant cell 1 above the most relevant one outside -> [1, GH, GW]. Under topk the budget then goes
    to the crop's cells first, most relevant (by its gaze, as the layer scores it) first, and only a budget larger
    than the crop reaches the page's cells beyond it, in the page's order.
    """
    inside = torch.zeros_like(relevance, dtype=torch.bool)  # [1, GH, GW]
    inside[:, crop.top:crop.top + crop.height, crop.left:crop.left + crop.width] = True
    if bool(inside.all()):  # the crop is the whole grid: nothing to lift it above
        return relevance
    lift = relevance[~inside].max() - relevance[inside].min() + 1
    return torch.where(inside, relevance + lift, relevance)


def crop_gflops(vlm: VLM, crop: Crop, prior_tokens: int, layer_fraction: float) -> dict:
    """The crop's compute: one vision pass over its tokens and its prior pass over `prior_tokens` (the template, the
    question and the crop's image block) up to the prior's layer -> {vision, prefill} GFLOPs (VLM.gflops, with no
    prefill of its own: the head's row that a prefill of no tokens still counts is taken off)."""
    closer = vlm.gflops([len(crop.tokens)], 0, prior_tokens, layer_fraction)
    return dict(vision=closer["vision"], prefill=closer["prefill"] - vlm.gflops([], 0)["prefill"])
