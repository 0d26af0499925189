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

ARR is this module (answer, follow_up, read_native) and three parts beside it: its scene (arr_scene: observe,
score, select, prepare; Observation, Scene, Saccade; its visual-token count arr_visual_tokens, which the baselines
and reducers read to match it), its prompt (arr_layout: arr_prompt, the one place its two blocks and their M-RoPE
positions are laid out, for answering, training, faithfulness and the vLLM plugin alike) and its second look
(refixation: Fixation, second_look). They import the shared request, answer and steps (arr_coc.pipelines.request,
.answer, .steps); none of those imports them. An ablation (ARR's Options.ablation, arr_coc.relevance.ablation) is
applied at the scene's steps and the prompt: the prior and the weights in score, the saccade count and order in
select, the gestalt block in arr_prompt.

    views = views_of(parts, image)                          # steps.views_of; parts: ARRCOCQwen(...).parts
    answer = finished(answer(parts, views, "What does the sign say?", Request(budget=273)))   # tokens, then the Answer
    raster = Request(options=(Options(ablation=ABLATIONS["raster"]),))   # ARR's settings: arr_options.Options (a
    answer = finished(answer(parts, views, "What does the sign say?", raster))  # name: its Ablation by check_request)
    answer = finished(answer(parts, views, "What does the sign say?", Request(options=(Options(refixate=0.5),))))
    box = views.box_coverage([40, 60, 200, 90]) > 0   # [GH, GW]: the cells a pixel box touches
    answer = finished(answer(parts, views, "What does the sign say?", Request(options=(Options(include=box),))))  # oracle
    first = finished(answer(parts, views, "What does the sign say?", Request(converse=True)))
    second = finished(follow_up(parts, first, "And the date?", Request(), read=None))
    # up to selection, as the app's Microscope:
    scene = arr_scene.prepare(parts, views, "What does the sign say?", Request(budget=40))
    out = arr_scene.select(layer, scene.maps, views.candidate_grid, len(scene.observation.gestalt), 40)
"""

from dataclasses import replace

import torch

from arr_coc.pipelines.answer import Answer, TokenCounts, answer_confidence
from arr_coc.pipelines.arr_layout import arr_prompt, crop_compute, encode_saccades, round_gflops
from arr_coc.pipelines.arr_options import arr_options
from arr_coc.pipelines.arr_scene import (closer_look, included_cells, native_reason, observe, planned_reason,
                                         question_prior, saccade_list, score, select)
from arr_coc.pipelines.refixation import Fixation, round_ms, second_look, second_look_budget
from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.steps import (continue_prompt, finish, follow_up as stock_follow_up, generate, read_view,
                                     start_watch)
from arr_coc.relevance.ablation import NO_ABLATION, Ablation
from arr_coc.runtime.timing import Stopwatch
from arr_coc.vlm.views import Views


def read_native(parts: Parts, views: Views, question: str, request: Request, watch: Stopwatch, start: float,
                why: str, ablation: Ablation):
    """ARR's answer where the native view holds no more cells than it would read (native_reason `why`): the native
    view whole, as `full` reads it (steps.read_view), the work timed so far on `watch` counted in; Answer.reads_native
    says why. The generator of its tokens as they come, then its Answer (read_view's own: this frame is gone by the
    time it runs, so the request path stays as short as full's)."""
    return read_view(parts, "arr", "native", views, question, request, watch, start, reads_native=why,
                     ablation=None if ablation is NO_ABLATION else ablation.name)


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
