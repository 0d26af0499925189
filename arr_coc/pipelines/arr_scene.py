"""
ARR's scene: what its first look reads and chooses. observe (the gestalt tokens, the texture array, the prior pass),
score (the three scorers and the balancer, under an ablation), select (the saccades), prepare (all three: what the
app's Microscope re-selects), and ARR's visual-token count (arr_visual_tokens: the gestalt plus K, with the adaptive
budget's K observed and scored), which the baselines and reducers read to match it. ARR's types live here:
Observation (what it reads), Scene (an observation scored), Saccade (one chosen cell).

    scene = prepare(parts, views, "What does the sign say?", Request(budget=40))   # up to selection
    out = select(layer, scene.maps, views.candidate_grid, len(scene.observation.gestalt), 40)
"""

from dataclasses import dataclass, replace
from typing import Callable

import torch

from arr_coc.errors import InputError
from arr_coc.pipelines.arr_options import ablation_named, arr_options
from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.two_scale import Crop, crop_first, crop_prior_map, crop_token_count, look_closer
from arr_coc.relevance.ablation import NO_ABLATION, Ablation
from arr_coc.relevance.config import AUTO, NO_SETTINGS, TensionSettings
from arr_coc.relevance.layer import ARRCOCLayer, ARRCOCOutput, ScoreMaps
from arr_coc.relevance.prior import upsample_map
from arr_coc.runtime.timing import Stopwatch
from arr_coc.vlm.base import VisualTokens
from arr_coc.vlm.views import Views


@dataclass
class Saccade:
    rank: int  # 1 = most relevant
    row: int  # candidate-grid row
    col: int  # candidate-grid column
    score: float  # relevance
    box: list[int]  # [x0, y0, x1, y1] in the original image's pixels
    round: int = 1  # the fixation that chose it: 1, or 2 for a second look (ARR's Options.refixate)


@dataclass
class Observation:
    """What the frozen VLM and the texture array make of an image and a question: ARR's inputs, before any ARR weight."""
    views: Views
    question: str
    gestalt: VisualTokens  # [Ng, D] gestalt tokens at their places on the gestalt grid
    question_embeds: torch.Tensor  # [1, Lq, D] the question's token embeddings
    prior: torch.Tensor  # [1, GH, GW] question->gestalt attention on the candidate grid, in [0, 1]
    highres: torch.Tensor  # [1, 3, H, W] the high-res view on the device, in [0, 1]
    textures: torch.Tensor  # [1, 13, GH, GW] texture array of the high-res view
    gestalt_states: torch.Tensor | None = None  # [1, gh, gw, D] the prior pass's gestalt states at its layer
    question_states: torch.Tensor | None = None  # [1, Lq, D] the prior pass's question rows' states there
    crop: Crop | None = None  # the two-scale look's crop (ARR's Options.look "two_scale"), whose gaze is in `prior` over


    # the cells it covers (two_scale.crop_prior_map); None for one look


@dataclass
class Scene:
    """An observation scored by one ARR layer, kept so a new strategy or budget re-selects instantly."""
    observation: Observation
    maps: ScoreMaps  # the ARR layer's scoring forward: textures, scorer maps, weights, relevance
    ablation: Ablation | None = None  # the ablation the maps were scored under; selection applies it too

    @property
    def views(self) -> Views:
        return self.observation.views

    def select(self, layer: ARRCOCLayer, budget: int | str | None = None, strategy: str | None = None,
               tensions: TensionSettings | None = None) -> ARRCOCOutput:
        """Saccades re-selected from this scene (no VLM work), as many and in the order its ablation says; budget
        "auto" is the adaptive budget, tensions fix ARR's tensions by hand (arr_coc.relevance.tensions)."""
        return select(layer, self.maps, self.views.candidate_grid, len(self.observation.gestalt), budget, strategy,
                      self.ablation or NO_ABLATION, tensions)


def question_prior(parts: Parts, question: str, gestalt: VisualTokens, views,
                   context: list[VisualTokens] = ()) -> dict[str, torch.Tensor]:
    """"Gestalt guides gaze": the question's attention to the gestalt tokens at the prior pass's layer (`context`:
    image blocks read between them, a second fixation's first saccades), on the candidate grid, and that layer's
    hidden states -> Observation's fields: prior [1, GH, GW], gestalt_states [1, gh, gw, D], question_states
    [1, Lq, D]."""
    prior = parts.vlm.prior_pass(question, gestalt, parts.pipeline.prior_layer_fraction, context)
    return dict(prior=upsample_map(prior.attention, views.gestalt_grid, views.candidate_grid),
                gestalt_states=prior.gestalt_states.view(1, *views.gestalt_grid, -1),
                question_states=prior.question_states.unsqueeze(0))


@torch.no_grad()
def observe(parts: Parts, views: Views, question: str, watch: Stopwatch | None = None) -> Observation:
    """An image's views (steps.views_of), the gestalt's tokens, the question's gaze on them (the prior) and the texture
    array: all ARR reads."""
    vlm = parts.vlm
    watch = watch or Stopwatch(vlm.device)
    with watch.section("vision"):
        gestalt = vlm.encode_view(views.tensor("gestalt"))  # [Ng, D]
    with watch.section("selection"):
        prior = question_prior(parts, question, gestalt, views)  # prior [1, GH, GW] and the layer's states
        highres = views.tensor("highres")  # [1, 3, H, W]
        textures = parts.texture(highres, views.candidate_grid)  # [1, 13, GH, GW]
    return Observation(views, question, gestalt, vlm.question_embeds(question), highres=highres, textures=textures,
                       **prior)


def score(observation: Observation, scorer: Callable[..., ScoreMaps], ablation: Ablation = NO_ABLATION,
          seen: VisualTokens | None = None) -> ScoreMaps:
    """An ARR layer's scorers and balancer over an observation (`scorer` is called like the layer's forward: its
    graphed_score, a CUDA graph per input shape under no_grad; training passes its DDP-wrapped layer), under an
    ablation's prior and weights. `seen`: saccades already read, which join the gestalt as the
    scorers' visual context (a second fixation)."""
    o = observation
    context = o.gestalt.features if seen is None else torch.cat([o.gestalt.features, seen.features])  # [Ng (+ K1), D]
    maps = scorer(o.textures, o.question_embeds, None, context.unsqueeze(0), ablation.prior(o.prior),
                  o.gestalt_states, o.question_states)
    return ablation.mix(maps)


def select(layer: ARRCOCLayer, maps: ScoreMaps, grid: tuple[int, int], gestalt_tokens: int,
           budget: int | str | None = None, strategy: str | None = None, ablation: Ablation = NO_ABLATION,
           settings: TensionSettings | None = None,
           exclude: torch.Tensor | None = None, include: torch.Tensor | None = None) -> ARRCOCOutput:
    """The saccades of maps scored on a (GH, GW) candidate grid, as many (the budget, "auto" for the adaptive one,
    or with no gestalt the budget + its tokens) and in the order the ablation says (budget None: the layer's),
    under the tensions the settings, then the ablation, fix (arr_coc.relevance.tensions). exclude [1, GH, GW]:
    cells not to select (a conversation's earlier turns'); a fixed budget then takes at most the cells left.
    include [1, GH, GW]: cells always selected (ARR's Options.include), the budget's most relevant of them where they
    are more, fed among the others in the same order."""
    budget = ablation.saccade_budget(layer.config.budget if budget is None else budget, gestalt_tokens)
    if exclude is not None and budget != AUTO:
        budget = min(int(budget), int((~exclude).sum()))
    return ablation.feed(layer.select(maps, grid, budget, strategy, tension_settings(settings, ablation), exclude,
                                      include, ablation.busy_pages))


def included_cells(request: Request, grid: tuple[int, int]) -> torch.Tensor | None:
    """A request's cells forced into the first look (ARR's Options.include [GH, GW] bool) -> [1, GH, GW], or None;
    InputError where they are not on this image's (GH, GW) candidate grid."""
    include = arr_options(request).include
    if include is None:
        return None
    if tuple(include.shape) != tuple(grid):
        raise InputError(f"include marks cells of a {'x'.join(map(str, include.shape))} grid; this image's "
                         f"candidate grid is {grid[0]}x{grid[1]}")
    return include.bool().unsqueeze(0)


def native_reason(views: Views, gestalt: int, saccades: int) -> str | None:
    """
    Why ARR reads the native view whole, as `full` does, instead of choosing saccades -> the reason, or None where
    it has cells to choose. Where the native view holds no more cells than ARR's LLM would read (`gestalt` tokens
    plus `saccades`), choosing them would read more tokens than `full` reads, from a candidate grid upsampled past
    the image (views.make_views: at least twice the gestalt grid per side): the cat of 451x300 px holds 11x16 = 176
    cells, and ARR would read 247 + 273 = 520 of a 26x38 grid of 1064x728 px.
    """
    nh, nw = views.native_grid
    if nh * nw > gestalt + saccades:
        return None
    return f"the image holds {nh * nw} cells ({nh}x{nw}) <= gestalt {gestalt} + budget {saccades}"


def planned_reason(parts: Parts, views: Views, request: Request, ablation: Ablation) -> str | None:
    """native_reason at the request's fixed budget, before ARR looks (None under the adaptive budget, known only
    after selection, or ARR's Options.upsample): the gestalt's tokens if the ablation reads it, and its saccade
    count."""
    gestalt, arr = views.gestalt_grid[0] * views.gestalt_grid[1], arr_options(request)
    K = ablation.saccade_budget((arr.layer or parts.layer).config.budget if request.budget is None
                                else request.budget, gestalt)
    if arr.upsample or K == AUTO:
        return None
    return native_reason(views, gestalt if ablation.gestalt else 0, int(K) + look_tokens(parts, views, request))


def arr_visual_tokens(parts: Parts, views: Views, request: Request, question: str | None = None) -> int:
    """What ARR's LLM reads of this image at this request's budget: the gestalt's tokens plus the saccades, or the
    native view's cells where it holds no more (native_reason: ARR reads it whole) (the reducers keep as many, so
    every row reads the same number of visual tokens). Under the adaptive budget ("auto") the saccades are ARR's K
    for this image and question: ARR observes and scores them to know it."""
    arr = arr_options(request)
    budget = request.budget if request.budget is not None else (arr.layer or parts.layer).config.budget
    if budget == AUTO:
        budget = adaptive_budget(parts, views, request, question)
    gh, gw = views.gestalt_grid
    crop = look_tokens(parts, views, request)  # the two-scale look's crop: through the tower and the prior pass
    if arr.upsample or native_reason(views, gh * gw, int(budget) + crop) is None:
        return gh * gw + int(budget) + crop
    return views.native_grid[0] * views.native_grid[1]  # ARR reads the native view whole (native_reason)


def look_tokens(parts: Parts, views: Views, request: Request) -> int:
    """The visual tokens ARR's look reads beside the gestalt and its saccades: the two-scale look's crop
    (two_scale.crop_token_count; it passes the vision tower and the prior pass), 0 for one look."""
    arr = arr_options(request)
    return crop_token_count(views, arr.crop_tokens, parts.vlm.min_pixels) if arr.look == "two_scale" else 0


def closer_look(parts: Parts, observation: Observation, maps: ScoreMaps, request: Request, ablation: Ablation,
                watch: Stopwatch) -> tuple[Observation, ScoreMaps]:
    """
    The two-scale look's second scale (arr_coc.pipelines.two_scale): the crop around the scored maps' relevance peak,
    its tokens and the question's gaze on them (look_closer), that gaze put in place of the page's prior over the
    cells the crop covers (crop_prior_map), and the layer's scorers again over the observation so changed: the
    textures and the gestalt's context as they were, the crop choosing among its own cells -> (the observation with
    its crop, its maps).
    """
    arr = arr_options(request)
    crop = look_closer(parts, observation.views, observation.question, maps.relevance, arr.crop_tokens, watch)
    closer = replace(observation, prior=crop_prior_map(observation.prior, crop), crop=crop)
    with watch.section("selection"):
        maps = score(closer, (arr.layer or parts.layer).graphed_score, ablation)
        return closer, replace(maps, relevance=crop_first(maps.relevance, crop))


@torch.no_grad()
def adaptive_budget(parts: Parts, views: Views, request: Request, question: str | None) -> int:
    """ARR's adaptive K for an image and a question (observe, score and select, as ARR's answer runs them)."""
    if question is None:
        raise ValueError("the adaptive budget depends on the question: arr_visual_tokens needs it")
    arr = arr_options(request)
    layer = arr.layer or parts.layer
    observation = observe(parts, views, question)
    maps = score(observation, layer.graphed_score)
    return select(layer, maps, observation.views.candidate_grid, len(observation.gestalt), AUTO, arr.strategy,
                  settings=arr.tensions).budgets[0]


@torch.no_grad()
def prepare(parts: Parts, views: Views, question: str, request: Request, watch: Stopwatch | None = None) -> Scene:
    """Observe, then score with the request's layer (default: the parts') under its ablation (an Ablation or its
    name): everything up to selection, kept so that a new strategy or budget re-selects at once (select)."""
    watch = watch or Stopwatch(parts.vlm.device)
    arr = arr_options(request)
    ablation = ablation_named(arr.ablation)
    observation = observe(parts, views, question, watch)
    with watch.section("selection"):
        maps = score(observation, (arr.layer or parts.layer).graphed_score, ablation)
    return Scene(observation, maps, ablation)


def tension_settings(settings: TensionSettings | None, ablation: Ablation) -> TensionSettings:
    """The tensions a request fixes by hand, under those its ablation fixes."""
    return (settings or NO_SETTINGS).over(ablation.tensions)


def saccade_list(observation: Observation, out: ARRCOCOutput, round: int = 1) -> list[Saccade]:
    """The saccades most relevant first (rank 1), whatever order they were fed in."""
    views, ranked = observation.views, out.in_order("relevance")
    return [Saccade(rank=i + 1, row=int(r), col=int(c), score=float(s), box=views.cell_box(int(r), int(c)), round=round)
            for i, ((r, c), s) in enumerate(zip(ranked.positions[0].tolist(), ranked.scores[0].tolist()))]
