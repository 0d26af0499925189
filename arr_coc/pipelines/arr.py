"""
arr: ARR-COC. The image walks down once:

    views -> VLM (gestalt tokens, the prior pass) -> relevance (textures, scorers, selection of `budget` cells)
          -> VLM (the selected cells encoded at their true places, gestalt + saccades + question, generate) -> Answer

observe / score / select are also ARRCOCQwen's own steps (the app re-selects a scored scene; training scores
observations), and arr_prompt is the one place ARR's LLM input is built, for answering, training and
faithfulness alike. An ablation (Request.ablation, arr_coc.relevance.ablation) is applied at those steps:
the prior and the weights in score, the saccade count and order in select, the gestalt block in arr_prompt.

    answer = pipelines.load("arr").answer(model, image, "What does the sign say?", Request(budget=273))
    answer = pipelines.load("arr").answer(model, image, "What does the sign say?", Request(ablation=ABLATIONS["raster"]))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from arr_coc.pipelines.answer import (Answer, Observation, Request, Saccade, finish, generate, start_watch,
                                      token_counts, views_for)
from arr_coc.relevance.ablation import NO_ABLATION, Ablation
from arr_coc.relevance.layer import ARRCOCLayer, ARRCOCOutput
from arr_coc.relevance.prior import upsample_map
from arr_coc.relevance.config import NO_SETTINGS, TensionSettings
from arr_coc.timing import Stopwatch
from arr_coc.vlm.base import VLM, Prompt, VisualTokens

if TYPE_CHECKING:
    from arr_coc.model import ARRCOCQwen


@torch.no_grad()
def observe(model: ARRCOCQwen, image, question: str, watch: Stopwatch, max_cells: int | None = None) -> Observation:
    """Views, the gestalt's tokens, the question's gaze on them (the prior) and the texture array: all ARR reads."""
    vlm = model.vlm
    with watch.section("vision"):
        views = views_for(vlm, model.pipeline, image, max_cells)
        gestalt = vlm.encode_view(views.tensor("gestalt"))  # [Ng, D]
    with watch.section("selection"):
        attention = vlm.prior_attention(question, gestalt, model.pipeline.prior_layer_fraction)  # [Ng]
        prior = upsample_map(attention, views.gestalt_grid, views.candidate_grid)  # [1, GH, GW]
        highres = views.tensor("highres")  # [1, 3, H, W]
        textures = model.texture(highres, views.candidate_grid)  # [1, 13, GH, GW]
    return Observation(views, question, gestalt, vlm.question_embeds(question), prior, highres, textures)


def score(observation: Observation, scorer: Callable[..., dict], ablation: Ablation = NO_ABLATION) -> dict:
    """An ARR layer's scorers and balancer over an observation (`scorer` is called like the layer's forward),
    under an ablation's prior and weights."""
    o = observation
    maps = scorer(o.textures, o.question_embeds, None, o.gestalt.features.unsqueeze(0), ablation.prior(o.prior))
    return ablation.mix(maps)


def select(layer: ARRCOCLayer, maps: dict, grid: tuple[int, int], gestalt_tokens: int, budget: int | str | None = None,
           strategy: str | None = None, ablation: Ablation = NO_ABLATION,
           settings: TensionSettings | None = None) -> ARRCOCOutput:
    """The saccades of maps scored on a (GH, GW) candidate grid, as many (the budget, "auto" for the adaptive one,
    or with no gestalt the budget + its tokens) and in the order the ablation says (budget None: the layer's),
    under the tensions the settings, then the ablation, fix (arr_coc.relevance.tensions)."""
    budget = ablation.saccade_budget(layer.config.budget if budget is None else budget, gestalt_tokens)
    settings = (settings or NO_SETTINGS).over(ablation.tensions)
    return ablation.order(layer.select(maps, grid, budget, strategy, settings))


def arr_prompt(vlm: VLM, observation: Observation, saccades: VisualTokens | None, answer: str | None = None,
               gestalt: bool = True) -> Prompt:
    """The gestalt block (unless ablated), the saccades as a second block (none when there are none), the
    question, and optionally an answer to teacher-force."""
    images = ([observation.gestalt] if gestalt else []) + ([saccades] if saccades is not None and len(saccades) else [])
    return vlm.prompt(observation.question, images, answer=answer)


def encode_saccades(vlm: VLM, observation: Observation, positions: torch.Tensor) -> VisualTokens | None:
    """The high-res view's cells at positions [K, 2], at their true places (None for K = 0)."""
    return vlm.encode_cells(observation.highres, positions) if len(positions) else None


def saccade_list(observation: Observation, out: ARRCOCOutput) -> list[Saccade]:
    views = observation.views
    return [Saccade(rank=i + 1, row=int(r), col=int(c), score=float(s), box=views.cell_box(int(r), int(c)))
            for i, ((r, c), s) in enumerate(zip(out.positions[0].tolist(), out.scores[0].tolist()))]


@torch.no_grad()
def answer(model: ARRCOCQwen, image, question: str, request: Request) -> Answer:
    """One ARR answer, the image walking down once (the module docstring's diagram)."""
    vlm, layer, ablation = model.vlm, request.layer or model.layer, request.ablation or NO_ABLATION
    watch, start = start_watch(vlm.device)
    observation = observe(model, image, question, watch, request.max_cells)  # views -> VLM: gestalt, prior; textures
    with watch.section("selection"):  # relevance: scorers, balancer, `budget` cells
        maps = score(observation, layer.graphed_score, ablation)
        out = select(layer, maps, observation.views.candidate_grid, len(observation.gestalt), request.budget,
                     request.strategy, ablation, request.tensions)
    with watch.section("vision"):  # VLM: the selected cells at their true places
        saccades = encode_saccades(vlm, observation, out.positions[0])  # [K, D]
    prompt = arr_prompt(vlm, observation, saccades, gestalt=ablation.gestalt)  # VLM: gestalt + saccades + question
    generation, new_tokens = generate(vlm, prompt, watch, request)
    n_gestalt, K = len(observation.gestalt), out.indices.shape[1]
    read_gestalt = n_gestalt if ablation.gestalt else 0  # the gestalt is encoded for the prior either way
    block = lambda n: n + 2 if n else 0  # noqa: E731  (an image block's tokens with its start and end)
    prior_tokens = prompt.length - block(K) + block(n_gestalt) - block(read_gestalt)  # [gestalt + question]
    gflops = vlm.gflops([n_gestalt, K] if K else [n_gestalt], prompt.length, prior_tokens,
                        model.pipeline.prior_layer_fraction)
    return finish(vlm, "arr", generation, new_tokens, token_counts(prompt.length, read_gestalt, K), watch, start,
                  observation.views, gflops, arr=out, saccades=saccade_list(observation, out), observation=observation,
                  ablation=None if ablation is NO_ABLATION else ablation.name)
