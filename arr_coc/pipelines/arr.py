"""
arr: ARR-COC. The image walks down once:

    views -> VLM (gestalt tokens, the prior pass) -> relevance (textures, scorers, selection of `budget` cells)
          -> VLM (the selected cells encoded at their true places, gestalt + saccades + question, generate) -> Answer

Where the native view holds no more cells than ARR's LLM would read (the gestalt plus the budget: native_reason),
ARR chooses nothing and reads the native view whole, exactly as `full` does (read_native; Answer.reads_native says
why): choosing would read more tokens than `full`, from a candidate grid upsampled past the image. ARR's Options.upsample
chooses anyway. Under the adaptive budget the test waits for K, after selection.

Under ARR's Options.refixate (tau), an answer whose confidence (answer_confidence: its least probable token's
probability) is below tau makes ARR look again, from relevance down (refixate):

    answer 1 -> VLM (the prior pass with the first saccades in its context) -> relevance (re-scored, the gestalt
          context now gestalt + first saccades; K2 cells not yet read) -> VLM (gestalt + both rounds' saccades,
          one block at their true M-RoPE places) -> answer 2

With ARR's Options.refixate_guide "attention" the second look goes where answer 1 itself looked instead (attention_guide:
its tokens' attention to the gestalt and the first saccades, teacher-forced over the first prompt, on the
candidate grid, each cell taking the most of its 3x3 neighbourhood), with no second prior pass.

Under ARR's Options.look "two_scale" the first look reads two scales (closer_look; arr_coc.pipelines.two_scale):

    relevance -> a crop of crop_tokens native cells around its peak, a view of its own -> VLM (the crop's tokens, the
          prior pass on them) -> its gaze in the prior over the crop's cells -> relevance again, the crop's cells
          first -> the usual `budget` cells

The crop's tokens count in ARR's visual tokens (arr_visual_tokens, look_tokens: the reducers read as many), GFLOPs
(crop_compute) and timings; they are not in the answer's prompt. A conversation's follow-ups look once.

In a conversation (arr_coc.pipelines.conversation) each follow-up question is read anew (follow_up):

    turn 1's observation (views, gestalt tokens, texture array: encoded once) -> the prior pass and the scorers
          on the new question -> its cells (with ARR's Options.fresh_cells, none an earlier turn read), encoded at their
          true places -> VLM (the conversation so far from its cache, then a new image block and the question)

ARR's own types live here: Observation (what it reads), Scene (an observation scored), Saccade and Fixation (a
second look's round), and so does its visual-token count (arr_visual_tokens: the gestalt plus K, with the adaptive
budget's K observed and scored), which the baselines and reducers read to match it. This module imports the shared
request, answer and steps (arr_coc.pipelines.request, .answer, .steps); none of them imports it.

observe / prepare / score / select are also what the app, training and the bench call (with ARRCOCQwen.parts: the
app re-selects a scored scene; training scores observations), and arr_prompt is the one place ARR's LLM input is built, for answering, training and
faithfulness alike. An ablation (ARR's Options.ablation, arr_coc.relevance.ablation) is applied at those steps:
the prior and the weights in score, the saccade count and order in select, the gestalt block in arr_prompt.

    views = views_of(parts, image)                          # steps.views_of; parts: ARRCOCQwen(...).parts
    answer = finished(answer(parts, views, "What does the sign say?", Request(budget=273)))   # tokens, then the Answer
    raster = Request(options=(Options(ablation=ABLATIONS["raster"]),))   # ARR's settings: arr_options.Options (a
    answer = finished(answer(parts, views, "What does the sign say?", raster))  # name: its Ablation by check_request)
    answer = finished(answer(parts, views, "What does the sign say?", Request(options=(Options(refixate=0.5),))))
    box = views.box_coverage([40, 60, 200, 90]) > 0   # [GH, GW]: the cells a pixel box touches
    answer = finished(answer(parts, views, "What does the sign say?", Request(options=(Options(include=box),))))  # oracle
    first = finished(answer(parts, views, "What does the sign say?", Request(converse=True)))
    second = finished(follow_up(parts, first, "And the date?", Request(), read=None))
    scene = prepare(parts, views, "What does the sign say?", Request(budget=40))   # up to selection: the Microscope
    # (Options: ARR's settings, arr_coc.pipelines.arr_options)
    out = select(layer, scene.maps, views.candidate_grid, len(scene.observation.gestalt), 40)
"""

from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch
import torch.nn.functional as F

from arr_coc.errors import InputError
from arr_coc.pipelines.answer import Answer, TokenCounts, Timings, answer_confidence
from arr_coc.pipelines.arr_options import ablation_named, arr_options
from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.steps import continue_prompt, finish, generate, read_view, start_watch
from arr_coc.pipelines.steps import follow_up as stock_follow_up
from arr_coc.pipelines.two_scale import (Crop, crop_first, crop_gflops, crop_prior_map, crop_token_count,
                                         look_closer)
from arr_coc.relevance.ablation import NO_ABLATION, Ablation
from arr_coc.relevance.layer import ARRCOCLayer, ARRCOCOutput, ScoreMaps
from arr_coc.relevance.prior import upsample_map
from arr_coc.relevance.config import AUTO, NO_SETTINGS, TensionSettings
from arr_coc.runtime.timing import Stopwatch
from arr_coc.vlm.base import VLM, Prompt, VisualTokens
from arr_coc.vlm.views import Views

# A second fixation's default saccades: half the first round's. Half keeps a look that fires at 1.5x the first
# round's visual tokens (273 -> 409, still a tenth of a 1792 px page's 4096 cells), yet adds half as many
# cells again as the first look read: enough to cover a line the first one clipped.
REFIXATE_SHARE = 0.5


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


@dataclass
class Fixation:
    """One round of ARR's looking under ARR's Options.refixate: the saccades it added and the answer read after them."""
    saccades: int  # visual tokens this round added (K1, then K2)
    text: str  # the answer generated after this round
    confidence: float  # that answer's confidence (answer_confidence)
    timings: Timings  # this round's own latency split
    arr: ARRCOCOutput = field(repr=False)  # this round's selection (relevance map, positions)
    guide: str | None = None  # what pointed a second look (one of REFIXATE_GUIDES; None for the first)


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


def read_native(parts: Parts, views: Views, question: str, request: Request, watch: Stopwatch, start: float,
                why: str, ablation: Ablation):
    """ARR's answer where the native view holds no more cells than it would read (native_reason `why`): the native
    view whole, as `full` reads it (steps.read_view), the work timed so far on `watch` counted in; Answer.reads_native
    says why. The generator of its tokens as they come, then its Answer (read_view's own: this frame is gone by the
    time it runs, so the request path stays as short as full's)."""
    return read_view(parts, "arr", "native", views, question, request, watch, start, reads_native=why,
                     ablation=None if ablation is NO_ABLATION else ablation.name)


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


def crop_compute(parts: Parts, observation: Observation, prompt: Prompt, read_gestalt: int, K: int) -> dict:
    """The crop's GFLOPs (two_scale.crop_gflops), its prior pass over the answer's template and question (`prompt`'s
    tokens but its image blocks) and the crop's block; nothing for one look."""
    crop = observation.crop
    if crop is None:
        return dict(vision=0.0, prefill=0.0)
    text = prompt.length - block_tokens(read_gestalt) - block_tokens(K)  # the question and the template
    return crop_gflops(parts.vlm, crop, text + block_tokens(len(crop.tokens)), parts.pipeline.prior_layer_fraction)


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


def arr_prompt(vlm: VLM, observation: Observation, saccades: VisualTokens | None, answer: str | None = None,
               gestalt: bool = True) -> Prompt:
    """The gestalt block (unless ablated), the saccades as a second block (none when there are none), the
    question, and optionally an answer to teacher-force."""
    images = ([observation.gestalt] if gestalt else []) + ([saccades] if saccades is not None and len(saccades) else [])
    return vlm.prompt(observation.question, images, answer=answer)


def encode_saccades(vlm: VLM, observation: Observation, positions: torch.Tensor) -> VisualTokens | None:
    """The high-res view's cells at positions [K, 2], at their true places (None for K = 0)."""
    return vlm.encode_cells(observation.highres, positions) if len(positions) else None


def saccade_list(observation: Observation, out: ARRCOCOutput, round: int = 1) -> list[Saccade]:
    """The saccades most relevant first (rank 1), whatever order they were fed in."""
    views, ranked = observation.views, out.in_order("relevance")
    return [Saccade(rank=i + 1, row=int(r), col=int(c), score=float(s), box=views.cell_box(int(r), int(c)), round=round)
            for i, ((r, c), s) in enumerate(zip(ranked.positions[0].tolist(), ranked.scores[0].tolist()))]


def second_look_saccades(refixate_budget: int | None, first: int) -> int:
    """The second look's saccades K2: refixate_budget, or by default REFIXATE_SHARE of the first look's `first`."""
    return int(refixate_budget) if refixate_budget else max(1, round(REFIXATE_SHARE * first))


def second_look_budget(request: Request, first: ARRCOCOutput) -> int:
    """
    The second look's saccades K2, from the first look's K (ARR's Options.refixate_budget, else a share of K). After
    an adaptive first look (--budget auto: a K the user did not choose) K2 is capped by the cells not yet read, 0
    when none is left (no second look); a fixed budget whose second look cannot fit is the allocator's error.
    """
    K = first.indices.shape[1]
    K2 = second_look_saccades(arr_options(request).refixate_budget, K)
    return min(K2, first.grid[0] * first.grid[1] - K) if first.auto_budget else K2


def attention_guide(vlm: VLM, observation: Observation, first: ARRCOCOutput, saccades: VisualTokens | None,
                    answer: str, gestalt: bool = True) -> tuple[torch.Tensor, int]:
    """
    Where the first answer looked, as attention mass per candidate cell -> ([1, GH, GW], the tokens of the pass read).
    The answer is teacher-forced over the first look's prompt, and its tokens' attention to the image tokens is read
    at every head of the LLM's last layer, sinks dropped (AnswerAttention.head_maps; on the pocket model these are
    the heads the distillation teacher chooses, docs/teacher.md). A first saccade's mass lands on its cell, a gestalt
    token's is spread evenly over the cells it covers. Each cell then takes the largest saccade mass of its 3x3
    neighbourhood, so that the unread cells beside an attended saccade (the rest of its word, its line) come first;
    the gestalt's share ranks the rest.
    """
    GH, GW = observation.views.candidate_grid
    gh, gw = observation.views.gestalt_grid
    prompt = arr_prompt(vlm, observation, saccades, answer=answer, gestalt=gestalt)
    mass = vlm.answer_attention(prompt, [vlm.num_layers - 1]).head_maps()[0].mean(0)  # [n]: gestalt (if read), saccades
    n_gestalt = len(observation.gestalt) if gestalt else 0
    looked = torch.zeros(GH * GW, device=mass.device).index_add_(
        0, first.indices[0].to(mass.device), mass[n_gestalt:])  # [GH * GW]: each saccade's mass on its cell
    near = F.max_pool2d(looked.view(1, 1, GH, GW), 3, stride=1, padding=1)[0]  # [1, GH, GW]
    if gestalt:
        coarse = F.interpolate(mass[:n_gestalt].view(1, 1, gh, gw), size=(GH, GW), mode="nearest")[0]  # [1, GH, GW]
        near = near + coarse * (gh * gw) / (GH * GW)  # a gestalt token's mass shared by the cells it covers
    return near, prompt.length


def first_maps(first: ARRCOCOutput, relevance: torch.Tensor) -> ScoreMaps:
    """The first look's score maps with another relevance map [1, GH, GW] (its dtype)."""
    maps = {f.name: getattr(first, f.name) for f in fields(ScoreMaps)}
    return ScoreMaps(**{**maps, "relevance": relevance.to(first.relevance.dtype)})


def refixate(parts: Parts, observation: Observation, first: ARRCOCOutput, seen: VisualTokens | None,
             request: Request, watch: Stopwatch, answer: str = "") -> tuple[ARRCOCOutput, VisualTokens, int | None]:
    """
    The second fixation's relevance and saccades, K2 cells not yet read (under the request's tensions, a fixed K2
    even after an adaptive first look; in the ablation's order), encoded -> (its selection, its tokens [K2, D], the
    tokens of the attention guide's pass or None). Pointed by ARR's Options.refixate_guide: "prior", the prior pass
    again with the first round's saccades `seen` between the gestalt and the question, the layer re-scoring with them
    beside the gestalt; "attention", where the first `answer` looked (attention_guide; the prior's way when the
    answer is empty, as it has no tokens to read).
    """
    vlm, arr = parts.vlm, arr_options(request)
    layer, ablation, views = arr.layer or parts.layer, arr.ablation or NO_ABLATION, observation.views
    K2 = second_look_budget(request, first)
    guide_tokens = None
    with watch.section("selection"):
        if arr.refixate_guide == "attention" and answer.strip():
            guide, guide_tokens = attention_guide(vlm, observation, first, seen, answer, ablation.gestalt)
            maps = first_maps(first, guide)
        else:
            context = [] if seen is None else [seen]
            again = replace(observation, **question_prior(parts, observation.question, observation.gestalt, views,
                                                          context))
            maps = score(again, layer.graphed_score, ablation, seen)
        read = torch.zeros(first.indices.shape[0], first.grid[0] * first.grid[1], dtype=torch.bool,
                           device=first.indices.device).scatter_(1, first.indices, True)  # [1, GH * GW]
        out = ablation.feed(layer.select(maps, views.candidate_grid, K2, arr.strategy,
                                         tension_settings(arr.tensions, ablation), read.view(-1, *first.grid),
                                         ablation.busy_pages))
    with watch.section("vision"):
        saccades = encode_saccades(vlm, observation, out.positions[0])  # [K2, D]
    return out, saccades, guide_tokens


def block_tokens(n: int) -> int:
    """An image block's tokens in the prompt: its n tokens with its start and end (none for n = 0)."""
    return n + 2 if n else 0


def round_gflops(vlm: VLM, parts: Parts, vision_cells: list[int], prompt: Prompt, read_gestalt: int,
                 n_gestalt: int, seen: int, saccades: int, guide_tokens: int | None = None) -> dict:
    """One round's compute: its vision passes, its prior pass over [gestalt + the `seen` saccades of rounds before
    + question] (or, for a second look the first answer's attention points, guide_tokens through every layer),
    and its prefill of `prompt` (read_gestalt gestalt tokens, seen + this round's saccades)."""
    if guide_tokens is not None:
        return vlm.gflops(vision_cells, prompt.length, guide_tokens, 1.0)
    text = prompt.length - block_tokens(read_gestalt) - block_tokens(seen + saccades)  # the question and the template
    return vlm.gflops(vision_cells, prompt.length, text + block_tokens(n_gestalt) + block_tokens(seen),
                      parts.pipeline.prior_layer_fraction)


def round_ms(watch: Stopwatch, before: dict, start: float) -> Timings:
    """The latency split of the round that began at `start`, when watch.ms read `before`."""
    return Timings.of({**{k: v - before.get(k, 0.0) for k, v in watch.ms.items()}, "total": (watch.now() - start) * 1000})


def second_look(parts: Parts, observation: Observation, first: ARRCOCOutput, saccades: VisualTokens | None,
                request: Request, watch: Stopwatch, answer: str = ""):
    """
    The second fixation after the first `answer`, from relevance down (refixate), then the answer read anew over the
    gestalt and both rounds' saccades, its tokens yielded as they come -> (its Fixation, every saccade [K + K2, D],
    the prompt, its generation, new tokens, its compute) as the generator's value.
    """
    vlm, ablation = parts.vlm, arr_options(request).ablation or NO_ABLATION
    before, start = dict(watch.ms), watch.now()
    second, more, guide_tokens = refixate(parts, observation, first, saccades, request, watch, answer)
    everything = more if saccades is None else VisualTokens.cat([saccades, more])  # [K + K2, D] one block
    prompt = arr_prompt(vlm, observation, everything, gestalt=ablation.gestalt)
    generation, new_tokens = yield from generate(vlm, prompt, watch, request)
    n_gestalt, K, K2 = len(observation.gestalt), first.indices.shape[1], second.indices.shape[1]
    gflops = round_gflops(vlm, parts, [K2], prompt, n_gestalt if ablation.gestalt else 0, n_gestalt, K, K2,
                          guide_tokens)
    look = Fixation(K2, vlm.decode(generation.ids), answer_confidence(vlm, generation), round_ms(watch, before, start),
                    second, "prior" if guide_tokens is None else "attention")
    return look, everything, prompt, generation, new_tokens, gflops


@torch.no_grad()
def answer(parts: Parts, views: Views, question: str, request: Request):
    """One ARR answer, the image walking down once (the module docstring's diagram): its tokens as they come, then
    its Answer. Under ARR's Options.refixate, a second fixation when the first answer's confidence is below tau (only
    the final answer's tokens are yielded)."""
    vlm, arr = parts.vlm, arr_options(request)
    layer, ablation = arr.layer or parts.layer, arr.ablation or NO_ABLATION
    watch, start = start_watch(vlm.device)
    include = included_cells(request, views.candidate_grid)  # [1, GH, GW] or None; checked even where ARR reads whole
    if why := planned_reason(parts, views, request, ablation):  # the native view holds no more than ARR would read
        return (yield from read_native(parts, views, question, request, watch, start, why, ablation))
    observation = observe(parts, views, question, watch)  # VLM: gestalt, prior; textures
    yield None
    with watch.section("selection"):  # relevance: scorers, balancer
        maps = score(observation, layer.graphed_score, ablation)
    if arr.look == "two_scale":  # the crop around the peak re-read: its gaze chooses the cells inside it
        observation, maps = closer_look(parts, observation, maps, request, ablation, watch)
    with watch.section("selection"):  # `budget` cells
        out = select(layer, maps, views.candidate_grid, len(observation.gestalt), request.budget, arr.strategy,
                     ablation, arr.tensions, include=include)
    read_gestalt = len(observation.gestalt) if ablation.gestalt else 0  # the gestalt is encoded for the prior either way
    n_crop = 0 if observation.crop is None else len(observation.crop.tokens)  # passed the tower and the prior pass
    if out.auto_budget and not arr.upsample and (why := native_reason(views, read_gestalt, out.budgets[0] + n_crop)):
        return (yield from read_native(parts, views, question, request, watch, start, why, ablation))
    with watch.section("vision"):  # VLM: the selected cells at their true places
        saccades = encode_saccades(vlm, observation, out.positions[0])  # [K, D]
    yield None
    prompt = arr_prompt(vlm, observation, saccades, gestalt=ablation.gestalt)  # VLM: gestalt + saccades + question
    refixing = arr.refixate is not None  # then the first answer may not be the last: nothing yielded yet
    generation, new_tokens = yield from generate(vlm, prompt, watch, request, silent=refixing)
    n_gestalt, K = len(observation.gestalt), out.indices.shape[1]
    gflops = round_gflops(vlm, parts, [n_gestalt, K] if K else [n_gestalt], prompt, read_gestalt, n_gestalt, 0, K)
    closer = crop_compute(parts, observation, prompt, read_gestalt, K)  # the crop's vision and prior passes
    gflops = {k: gflops[k] + closer[k] for k in gflops}
    fixations, rows = [], saccade_list(observation, out)
    if refixing:
        fixations.append(Fixation(K, vlm.decode(generation.ids), answer_confidence(vlm, generation),
                                  round_ms(watch, {}, start), out))
        if fixations[0].confidence >= arr.refixate or not second_look_budget(request, out):
            yield from generation.ids[0].tolist()  # the first answer is the last
        else:  # look again: K2 cells not yet read, then the answer over gestalt + both rounds' saccades
            look, saccades, prompt, generation, new_tokens, more = yield from second_look(
                parts, observation, out, saccades, request, watch, fixations[0].text)
            fixations.append(look)
            gflops = {k: gflops[k] + more[k] for k in gflops}
            rows += saccade_list(observation, look.arr, round=2)
    K = sum(f.saccades for f in fixations) if fixations else K
    tokens = TokenCounts.of_prompt(prompt.length, read_gestalt, K, crop=n_crop)
    yield finish(vlm, "arr", generation, new_tokens, tokens, watch, start, views, gflops, arr=out, saccades=rows,
                 observation=observation, ablation=None if ablation is NO_ABLATION else ablation.name,
                 fixations=fixations, refixate=arr.refixate)


@torch.no_grad()
def follow_up(parts: Parts, last: Answer, question: str, request: Request, read: torch.Tensor | None = None):
    """
    A conversation's next question, read anew (the module docstring's second diagram): the first turn's views,
    gestalt tokens and texture array, the prior pass and the scorers on this question, its cells (none of
    `read` [GH, GW], the cells earlier turns read, with ARR's Options.fresh_cells) encoded at their true places as a
    new image block, and the question, after the conversation so far (only this turn is prefilled). Yields its
    tokens, then its Answer.
    """
    if last.reads_native is not None:  # the first turn read the whole native view: the question alone, as full's
        return (yield from stock_follow_up(parts, "arr", last, question, request, reads_native=last.reads_native))
    vlm, arr = parts.vlm, arr_options(request)
    layer, ablation = arr.layer or parts.layer, arr.ablation or NO_ABLATION
    watch, start = start_watch(vlm.device)
    first = last.observation
    views = first.views
    with watch.section("selection"):  # the gestalt guides this question's gaze; the scorers read this question
        observation = replace(first, question=question, question_embeds=vlm.question_embeds(question),
                              **question_prior(parts, question, first.gestalt, views))
        maps = score(observation, layer.graphed_score, ablation)
        exclude = read.unsqueeze(0) if arr.fresh_cells and read is not None else None  # [1, GH, GW]
        out = select(layer, maps, views.candidate_grid, len(first.gestalt), request.budget, arr.strategy,
                     ablation, arr.tensions, exclude)
    with watch.section("vision"):
        saccades = encode_saccades(vlm, observation, out.positions[0])  # [K, D]
    yield None
    prompt = continue_prompt(vlm, last, question, [] if saccades is None else [saccades], request)
    generation, new_tokens = yield from generate(vlm, prompt, watch, request)
    K = out.indices.shape[1]
    gflops = round_gflops(vlm, parts, [K] if K else [], prompt, 0, len(first.gestalt), 0, K)
    yield finish(vlm, "arr", generation, new_tokens, TokenCounts.of_prompt(prompt.length, 0, K), watch, start, views,
                 gflops, arr=out, saccades=saccade_list(observation, out), observation=observation,
                 ablation=None if ablation is NO_ABLATION else ablation.name)
