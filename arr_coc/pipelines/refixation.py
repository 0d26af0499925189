"""
ARR's second look (Request.refixate): an answer less confident than tau looks again, from relevance down, at K2
cells it has not read (second_look_budget; REFIXATE_SHARE of K by default), pointed by the prior pass again with the
first saccades in its context or, with refixate_guide "attention", by where the first answer itself looked
(attention_guide). Fixation records each round.

    second = second_look(parts, observation, first, saccades, answer, request, watch, start)
"""

from dataclasses import dataclass, field, fields, replace

import torch
import torch.nn.functional as F

from arr_coc.pipelines.answer import Timings, answer_confidence
from arr_coc.pipelines.arr_layout import arr_prompt, encode_saccades, round_gflops
from arr_coc.pipelines.arr_options import arr_options
from arr_coc.pipelines.arr_scene import Observation, question_prior, score, tension_settings
from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.steps import generate
from arr_coc.relevance.ablation import NO_ABLATION
from arr_coc.relevance.layer import ARRCOCOutput, ScoreMaps
from arr_coc.runtime.timing import Stopwatch
from arr_coc.vlm.base import VLM, VisualTokens


# A second fixation's default saccades: half the first round's. Half keeps a look that fires at 1.5x the first
# round's visual tokens (273 -> 409, still a tenth of a 1792 px page's 4096 cells), yet adds half as many
# cells again as the first look read: enough to cover a line the first one clipped.
REFIXATE_SHARE = 0.5


@dataclass
class Fixation:
    """One round of ARR's looking under ARR's Options.refixate: the saccades it added and the answer read after them."""
    saccades: int  # visual tokens this round added (K1, then K2)
    text: str  # the answer generated after this round
    confidence: float  # that answer's confidence (answer_confidence)
    timings: Timings  # this round's own latency split
    arr: ARRCOCOutput = field(repr=False)  # this round's selection (relevance map, positions)
    guide: str | None = None  # what pointed a second look (one of REFIXATE_GUIDES; None for the first)


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
