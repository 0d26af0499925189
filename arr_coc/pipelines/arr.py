"""
arr: ARR-COC. The image walks down once:

    views -> VLM (gestalt tokens, the prior pass) -> relevance (textures, scorers, selection of `budget` cells)
          -> VLM (the selected cells encoded at their true places, gestalt + saccades + question, generate) -> Answer

observe / score / select are also ARRCOCQwen's own steps (the app re-selects a scored scene; training scores
observations), and arr_prompt is the one place ARR's LLM input is built, for answering, training and
faithfulness alike.

    answer = pipelines.load("arr").answer(model, image, "What does the sign say?", Request(budget=273))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from arr_coc.pipelines.answer import (Answer, Observation, Request, Saccade, finish, generate, token_counts,
                                      views_for)
from arr_coc.relevance.layer import ARRCOCOutput
from arr_coc.relevance.prior import upsample_map
from arr_coc.timing import Stopwatch, reset_peak_memory
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


def score(observation: Observation, scorer: Callable[..., dict]) -> dict:
    """An ARR layer's scorers and balancer over an observation (`scorer` is called like the layer's forward)."""
    o = observation
    return scorer(o.textures, o.question_embeds, None, o.gestalt.features.unsqueeze(0), o.prior)


def arr_prompt(vlm: VLM, observation: Observation, saccades: VisualTokens | None, answer: str | None = None) -> Prompt:
    """The gestalt block, the saccades as a second block (none when there are none), the question, and
    optionally an answer to teacher-force."""
    images = [observation.gestalt] + ([saccades] if saccades is not None and len(saccades) else [])
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
    vlm, layer = model.vlm, request.layer or model.layer
    watch = Stopwatch(vlm.device)
    reset_peak_memory(vlm.device)
    start = watch.now()
    observation = observe(model, image, question, watch, request.max_cells)  # views -> VLM: gestalt, prior; textures
    with watch.section("selection"):  # relevance: scorers, balancer, `budget` cells
        maps = score(observation, layer.graphed_score)
        out = layer.select(maps, observation.views.candidate_grid, request.budget, request.strategy)
    with watch.section("vision"):  # VLM: the selected cells at their true places
        saccades = encode_saccades(vlm, observation, out.positions[0])  # [K, D]
    prompt = arr_prompt(vlm, observation, saccades)  # VLM: gestalt + saccades + question -> answer
    generation, new_tokens = generate(vlm, prompt, watch, request)
    n_gestalt, K = len(observation.gestalt), out.indices.shape[1]
    prior_tokens = prompt.length - (K + 2 if K else 0)  # the prior read the prompt without the saccade block
    gflops = vlm.gflops([n_gestalt, K] if K else [n_gestalt], prompt.length, prior_tokens,
                        model.pipeline.prior_layer_fraction)
    return finish(vlm, "arr", generation, new_tokens, token_counts(prompt.length, n_gestalt, K), watch, start,
                  observation.views, gflops, arr=out, saccades=saccade_list(observation, out), observation=observation)
