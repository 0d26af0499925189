"""
The app's event handlers: top-level functions of (model, the components' values) -> the outputs' values.
app.py binds each to its components (and, on ZeroGPU, wraps the GPU ones in spaces.GPU); tests call them
directly, without a server.

    for outputs in compare(model, image, "What is it?", "divprune", 64, "topk", 4096, 20): ...
    for outputs in compare(model, image, "What is it?", "full", 64, "topk", 4096, 20, 0.5): ...  # a second look below 0.5
    drawing = kept_cells(model, kept, image, "What is it?", "visionzip", 273, 4096)  # over the Microscope's map
    kept, channels, scorers, heatmap, summary, saccades, mosaic = microscope(model, image, "What is it?", "topk",
                                                                            273, 4096, 20, "no-gestalt")
    for summary, drawing in where_it_looks(model, Path("assets/examples.json"), image, "What is it?", "topk", 273,
                                           4096): ...  # the teacher's map beside ARR's relevance: where the model looks
    heatmap, summary, saccades, mosaic = reselect(model, kept, "grid", 50, 20)     # CPU only, no VLM
    heatmap, summary, saccades, mosaic = reselect(model, kept, "topk", 50, 20, True, True, 0.25, 2.0, 0.3)
                                                   # adaptive K; e, λ and f overridden by the tension sliders
    chat, status, turns, heatmap, moved = converse(model, None, image, "What is it?", "full", 64, 273, False, 20)
    chat, status, turns, heatmap, moved = converse(model, chat, image, "And its colour?", "full", 64, 273, True, 20)

Per-user state (gr.State, kept up to an hour) is a Kept, or the Conversation tab's Chat: CPU data only, never
a GPU tensor (a Chat's conversations move to the device for a turn and back).

A handler that runs several pipelines on one image (Compare, Checkpoint A/B, Faithfulness, a conversation's first
turn) makes its views once (ARRCOCQwen.views) and hands them to each as its image: the upload and the resized views
serve every pipeline. A streaming handler iterates the model's stream in its own thread, the request running in it
from the button to the vision tower and the engine: the stream yields between stages and at every token, so gradio
closes it there on Stop, which stops the request.
"""

import concurrent.futures
import copy
import functools
import hashlib
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr
import torch
from PIL import Image

from arr_coc import viz
from arr_coc.app import looks, options, ui
from arr_coc.distill.teacher import TeacherHeads, teach
from arr_coc.errors import InputError
from arr_coc.eval.faithfulness import check_answer, faithfulness_curves
from arr_coc.eval.rows import ORACLE_STRATEGY
from arr_coc.model import Answer, ARRCOCQwen, Scene
from arr_coc import pipelines
from arr_coc.pipelines import arr_scene
from arr_coc.pipelines.arr_options import arr_options
from arr_coc.pipelines.request import Request, check_request, with_settings
from arr_coc.pipelines.conversation import Conversation, moves
from arr_coc.relevance.ablation import NO_ABLATION, Ablation
from arr_coc.relevance.config import AUTO, NO_SETTINGS, STRATEGIES
from arr_coc.relevance.layer import ScoreMaps
from arr_coc.settings import REFIXATE_GUIDES
from arr_coc.vlm.views import box_coverage

FAITHFULNESS_ANSWER_TOKENS = 32  # ARR's own answer, when the faithfulness curves score it
RUNNING = "Running"  # every status line of a request in progress starts so; Stop answers only those
TICK_S = 0.25  # a handler whose work runs in a thread (in_thread) yields this often: where Stop can close it
FINISHING = "Waiting for the model: it is finishing the request that was stopped…"  # until that one frees it


# ----------------------------------------------------------------------------- per-user state


@dataclass
class Kept:
    """What redrawing and re-selecting an analysed image need, all on the CPU: a user's gr.State holds it."""
    image: Image.Image  # the image, RGB, at most at the size the drawings use (drawn_size), never the upload itself
    highres: Image.Image  # the candidate (high-res) view: the saccade mosaic's pixels
    grid: tuple[int, int]  # (GH, GW) candidate grid
    relevance: torch.Tensor  # [GH, GW] balanced relevance map
    positions: torch.Tensor  # [K, 2] (row, col) of the selected saccades, most relevant first
    maps: ScoreMaps | None = None  # the layer's scored maps (textures, scorers, weights): re-selection; Microscope only
    ablation: Ablation = NO_ABLATION  # the ablation the maps were scored under: re-selection applies it too
    gestalt_tokens: int = 0  # the gestalt's token count (the no-gestalt ablation selects budget + these)
    second: torch.Tensor | None = None  # [K2, 2] a second look's saccades (Compare, when it fired), drawn in green


def drawn_size(image: Image.Image) -> Image.Image:
    """
    The image as a Kept holds it: shrunk to the canvas the drawings use (viz.canvas_size: at most viz.MAX_SIDE px
    a side), so redrawing gives the same pixels; a smaller one as it is. A session keeps this for an hour, not a
    62-megapixel upload (186 MB).
    """
    size = viz.canvas_size(*image.size)
    return image.resize(size, Image.Resampling.BICUBIC) if size[0] < image.width else image


def kept_answer(answer: Answer) -> Kept:
    """A finished ARR answer as the Compare tab keeps it: enough to renumber its heatmap and mosaic, its saccades
    ranked most relevant first whatever order they were fed in (a raster-order checkpoint feeds them row by row)."""
    views = answer.views
    second = answer.fixations[1].arr.positions[0].cpu() if answer.refixated else None
    return Kept(drawn_size(views.image), views.highres, views.candidate_grid, answer.arr.relevance[0].cpu(),
                answer.arr.in_order("relevance").positions[0].cpu(), second=second)


def kept_scene(scene: Scene) -> Kept:
    """A scored scene as the Microscope keeps it: its maps (on the CPU) re-select without the VLM."""
    views, maps = scene.views, scene.maps.to("cpu")
    no_saccades = torch.zeros(0, 2, dtype=torch.long)  # [0, 2]: selection_outputs selects them
    return Kept(drawn_size(views.image), views.highres, views.candidate_grid, maps.relevance[0], no_saccades,
                maps, scene.ablation or NO_ABLATION, len(scene.observation.gestalt))


def redraw(kept: Kept | None, numbered: int) -> tuple:
    """The heatmap and the saccade mosaic of a kept selection, the first `numbered` saccades numbered."""
    if kept is None:
        return None, None
    second = () if kept.second is None else kept.second
    return (viz.heatmap_overlay(kept.image, kept.relevance, kept.positions, numbered=int(numbered), second=second),
            viz.saccade_mosaic(kept.highres, kept.grid, kept.positions, int(numbered)))


# ----------------------------------------------------------------------------- Compare


def baseline_cells(base: Answer) -> Image.Image | None:
    """The cells a reducer baseline kept, boxed as ARR's saccades are (VisionZip's merged ones shaded); None for
    a stock view, which reads every cell of its view."""
    if base.kept is None:
        return None
    return viz.kept_overlay(base.views.image, base.views.native_grid, base.kept, base.merged, name=base.pipeline)


def compare_outputs(status: str, base_text: str = "", base: Answer | None = None, arr_text: str = "",
                    arr: Answer | None = None, numbered: int = viz.TOP_LABELS, base_cells: Image.Image | None = None
                    ) -> tuple:
    """
    The Compare tab's outputs; a pipeline still running shows its text so far, and no stats or drawings.
    The last but one is the baseline's kept cells (a reducer's; drawn once, by the caller); the last, the
    finished ARR answer as kept for redrawing (CPU only).
    """
    base_stats, arr_stats = (None if a is None else ui.stats_rows(a) for a in (base, arr))
    if arr is None:
        return status, base_text, base_stats, arr_text, arr_stats, None, None, None, None, base_cells, None
    if arr.arr is None:  # it read the image whole, as full does (ui.native_note): no selection to draw
        return (f"{status} {ui.native_note(arr)}", base_text, base_stats, arr_text, arr_stats, None,
                arr.views.gestalt, None, None, base_cells, None)
    kept = kept_answer(arr)
    heatmap, mosaic = redraw(kept, numbered)
    weights = viz.weights_bar(arr.arr.weights[0], arr.arr.shares()[0], float(arr.arr.agreement()[0]))
    return (status, base_text, base_stats, arr_text, arr_stats, heatmap, arr.views.gestalt, weights, mosaic,
            base_cells, kept)


def reporting(status_at: int, outputs: int):
    """
    A streaming handler that passes on its steps' output tuples; if a step fails, it puts "Failed: why" in its status
    output (the other outputs keep what they show), then raises the error for the user.
    """
    def handler_of(steps):
        @functools.wraps(steps)
        def handler(*args, **kwargs):
            try:
                yield from steps(*args, **kwargs)
            except Exception as e:
                error = ui.as_user_error(e)
                failed = [gr.skip()] * outputs
                failed[status_at] = f"**Failed**: {error.message}"
                yield tuple(failed)
                raise error from None
        return handler
    return handler_of


@reporting(status_at=0, outputs=11)
def compare(model: ARRCOCQwen, image, question: str, baseline: str, max_new_tokens: int, strategy: str,
            max_cells: int, numbered: int, refixate: float = 0.0, refixate_guide: str = REFIXATE_GUIDES[0]):
    """Stream the baseline's answer, then ARR-COC's (with a second look below confidence `refixate`, 0: off, that
    `refixate_guide` points); then their stats and ARR's drawings; "Failed: why" in the status line if a step fails.
    Closing it (Stop, gradio closes the event's generator) stops the generation under way at once."""
    image, question = ui.check_inputs(model, image, question)  # its tokens too, before the status line says it runs
    start = time.perf_counter()
    running = f"{RUNNING} the **{baseline}** baseline…"
    yield from wait_for_model(model, compare_outputs(FINISHING))
    yield compare_outputs(running)
    views = model.views(image, int(max_cells))  # one cap, one set of views, for both
    request = Request(max_new_tokens=int(max_new_tokens), max_cells=int(max_cells))
    for base in model.stream(views, question, baseline, request=request):  # the text as it grows, then the Answer
        if isinstance(base, str):
            yield compare_outputs(running, base)
    running, cells = f"{RUNNING} **ARR-COC**…", baseline_cells(base)
    yield compare_outputs(running, ui.answer_text(base), base, base_cells=cells)
    tau = float(refixate) if refixate and float(refixate) > 0 else None  # the slider's 0 is off
    mine = with_settings(request, dict(strategy=strategy, refixate=tau, refixate_guide=refixate_guide))
    for ours in model.stream(views, question, "arr", request=mine):
        if isinstance(ours, str):
            yield compare_outputs(running, ui.answer_text(base), base, ours, base_cells=cells)
    yield compare_outputs(f"Done in {time.perf_counter() - start:.1f} s.", ui.answer_text(base), base,
                          ui.answer_text(ours), ours, numbered, cells)


compare_steps = compare.__wrapped__  # the steps alone, their errors raised as they are


def wait_for_model(model: ARRCOCQwen, waiting: tuple):
    """
    Yield `waiting` (its status: FINISHING) while another request still holds the model, then wait for it: gradio
    runs one request at a time, so that is a stopped one finishing its block (ARRCOCQwen.stop_check). Nothing when
    the model is free.
    """
    if model.busy():
        yield waiting
        with model.lock:  # free once the stopped request has ended
            pass


def stopped(status: str | None) -> str | None:
    """The status line after Stop: a running request is said to be stopped; any other status stays as it is."""
    if status and status.startswith(RUNNING):
        return f"**Stopped** by you ({status[len(RUNNING):].strip(' …').strip()} was running)."
    return status


# ----------------------------------------------------------------------------- Microscope


def microscope_request(budget: int, controls: tuple = (False, False, 0.0, 0.0, 0.5), **settings) -> Request:
    """The Microscope's one Request: the budget slider's count, or "auto" where the tension controls (adaptive
    budget, override, e, λ, f: ui.tension_request) ask for the adaptive budget, the tensions they fix (none unless
    overridden), and its other settings by their names (with_settings: ARR's into its Options)."""
    auto, tensions = ui.tension_request(*controls)
    return with_settings(Request(budget=auto or int(budget)), dict(tensions=tensions, **settings))


def selected(model: ARRCOCQwen, kept: Kept, request: Request, include: torch.Tensor | None = None):
    """ARR's selection over kept maps as the request says (strategy, budget, tensions), under the kept ablation;
    include [GH, GW] bool: cells always selected (the oracle's asked box: arr_scene.select's include)."""
    gh, gw = kept.grid
    extra = kept.ablation.saccade_budget(0, kept.gestalt_tokens)  # the no-gestalt ablation's extra saccades
    budget = request.budget if request.budget == AUTO else min(  # the slider allows the largest grid
        int(request.budget), gh * gw - (extra if isinstance(extra, int) else 0))
    mine = arr_options(request)
    return arr_scene.select(model.layer, kept.maps, kept.grid, kept.gestalt_tokens, budget, mine.strategy,
                            kept.ablation, mine.tensions, include=None if include is None else include.unsqueeze(0))


def selection_outputs(model: ARRCOCQwen, kept: Kept, request: Request, numbered: int) -> tuple:
    """Select on the CPU (no VLM work) as the request says (its strategy, budget and tensions: microscope_request),
    under the kept ablation, and draw: the heatmap, the summary line, the saccade list and the mosaic."""
    start = time.perf_counter()
    out = selected(model, kept, request)
    ranked = out.in_order("relevance")  # numbered most relevant first, whatever order they are fed in
    heatmap, mosaic = redraw(replace(kept, positions=ranked.positions[0]), numbered)
    summary = ui.selection_summary(out, (time.perf_counter() - start) * 1000, kept.ablation.description
                                   if kept.ablation is not NO_ABLATION else None,
                                   overridden=arr_options(request).tensions != NO_SETTINGS)
    return heatmap, summary, ui.saccade_rows(out), mosaic


@ui.reports_errors
def microscope(model: ARRCOCQwen, image: Image.Image | None, question: str, strategy: str, budget: int,
               max_cells: int, numbered: int, ablation: str = NO_ABLATION.name, auto: bool = False,
               override: bool = False, explore: float = 0.0, diversify: float = 0.0,
               particularize: float = 0.5) -> tuple:
    """Run ARR (under an ablation: arr_coc.relevance.ablation) up to selection once, keep its maps (CPU) for
    re-selection, and draw every map; the tension controls as in selection_outputs."""
    image, question = ui.check_inputs(model, image, question)
    request = microscope_request(budget, (auto, override, explore, diversify, particularize), strategy=strategy,
                                 max_cells=int(max_cells), ablation=ablation)
    views = model.views(image, int(max_cells))
    with model.serving():
        scene = arr_scene.prepare(model.parts, views, question, check_request(request))
    out = arr_scene.select(model.layer, scene.maps, views.candidate_grid, len(scene.observation.gestalt),
                           ablation=scene.ablation)  # textures, scorer maps and weights do not depend on the selection
    kept = kept_scene(scene)
    return (kept, viz.channel_grid(out.textures[0]), viz.scorer_maps(out),
            *selection_outputs(model, kept, request, numbered))


@ui.reports_errors
def reselect(model: ARRCOCQwen, kept: Kept | None, strategy: str, budget: int, numbered: int, auto: bool = False,
             override: bool = False, explore: float = 0.0, diversify: float = 0.0, particularize: float = 0.5) -> tuple:
    """A new strategy, budget, tension or count of numbered saccades over the analysed image: well under a second,
    no VLM."""
    if kept is None or kept.maps is None:
        raise ui.user_error("Analyse an image first: re-selection reuses its maps.")
    request = microscope_request(budget, (auto, override, explore, diversify, particularize), strategy=strategy)
    return selection_outputs(model, kept, request, numbered)


def oracle_selection(model: ARRCOCQwen, kept: Kept, box, image_size: tuple[int, int], request: Request) -> tuple:
    """Evaluate's oracle over kept maps: the cells a pixel box (x0, y0, x1, y1) of the image (image_size: the
    upload's, as the box's) touches forced in, the rest of the request's budget by ORACLE_STRATEGY -> (the
    selection, the box's cells [GH, GW] bool)."""
    inside = box_coverage(box, image_size, kept.grid) > 0  # [GH, GW]: as evaluate's views.box_coverage(box) > 0
    oracle_request = with_settings(request, dict(strategy=ORACLE_STRATEGY))
    return selected(model, kept, oracle_request, include=inside), inside


@ui.reports_errors
def oracle(model: ARRCOCQwen, examples: Path, kept: Kept | None, image: Image.Image | None, question: str,
           strategy: str, budget: int, auto: bool = False, override: bool = False, explore: float = 0.0,
           diversify: float = 0.0, particularize: float = 0.5) -> tuple:
    """
    Evaluate's oracle row over the analysed image, where it is an example page with a known asked box (`examples`:
    assets/examples.json; looks.example_box): the box's candidate cells forced into ARR's budget, the rest filled by
    ARR's own order (ORACLE_STRATEGY), as selected() selects -> (its drawing, the box outlined, and a line on how
    many of the box's cells ARR's own selection found). No drawing, and a line saying there is no known box, else.
    CPU only, no VLM: it reselects the kept maps, as reselect does.
    """
    if kept is None or kept.maps is None or image is None:
        return None, ""
    box = looks.example_box(image, question or "", examples)
    if box is None:
        return None, looks.NO_BOX
    request = microscope_request(budget, (auto, override, explore, diversify, particularize), strategy=strategy)
    forced, inside = oracle_selection(model, kept, box, image.size, request)
    found = int(inside.flatten()[selected(model, kept, request).indices[0].cpu()].sum())  # ARR's own, in the box
    drawing = looks.oracle_drawing(kept.image, kept.relevance, forced.in_order("relevance").positions[0], box,
                                   image.size)
    return drawing, looks.oracle_text(int(inside.sum()), int(forced.indices.shape[1]), found)


@ui.reports_errors
def show_kept_cells(pipeline: str) -> dict:
    """The kept-cells drawing's panel is shown only for a reducer (stock views and "none" keep every cell)."""
    return gr.update(visible=pipeline in pipelines.REDUCERS)


@ui.reports_errors
def kept_cells(model: ARRCOCQwen, kept: Kept | None, image: Image.Image | None, question: str, reducer: str,
               budget: int, max_cells: int, auto: bool = False, override: bool = False, explore: float = 0.0,
               diversify: float = 0.0, particularize: float = 0.5) -> Image.Image | None:
    """A token reducer's kept cells at the Microscope's budget (ARR's visual-token count: under the adaptive budget,
    ARR's K for this image and question, as the tension controls set it), drawn over the analysed image's
    relevance map; no drawing for "none"."""
    if reducer == options.NO_REDUCER:
        return None
    if kept is None:
        raise ui.user_error("Analyse an image first: the reducer's cells are drawn over its relevance map.")
    image, question = ui.check_inputs(model, image, question)
    request = microscope_request(budget, (auto, override, explore, diversify, particularize), max_new_tokens=1,
                                 max_cells=int(max_cells))
    answer = model.answer(image, question, reducer, request=request)
    return viz.kept_overlay(kept.image, answer.views.native_grid, answer.kept, answer.merged, kept.relevance,
                            name=reducer)


@ui.reports_errors
def faithfulness(model: ARRCOCQwen, image: Image.Image | None, question: str, answer: str, strategy: str,
                 budget: int, max_cells: int, progress=gr.Progress()) -> tuple:
    """Deletion, random and insertion curves of an answer (empty: ARR's own) over ARR's selection."""
    image, question = ui.check_inputs(model, image, question)
    typed = check_answer(answer or "")  # a too long answer fails before any VLM work; empty: ARR's own
    views = model.views(image, int(max_cells))  # made once: the budget's bound and ARR's views
    gh, gw = views.candidate_grid  # the budget slider allows the largest grid
    progress(0.05, desc="ARR's answer and selection")
    request = with_settings(Request(max_new_tokens=FAITHFULNESS_ANSWER_TOKENS, budget=min(int(budget), gh * gw),
                                    max_cells=int(max_cells)), dict(strategy=strategy))
    arr = model.answer(views, question, "arr", request=request)
    if arr.arr is None:  # no saccades to remove
        raise ui.user_error(f"{ui.native_note(arr)} Faithfulness needs saccades to remove: try a larger image.")
    progress(0.3, desc="about 30 teacher-forced forward passes")
    with model.serving():  # the curves' forward passes use the VLM too
        curves = faithfulness_curves(model.parts, arr.observation, arr.arr, typed or arr.text)
    chart = viz.faithfulness_chart(curves.fractions, curves.curves, f"faithfulness of {curves.answer!r}")
    return chart, ui.faithfulness_summary(curves)


@dataclass
class Looked:
    """What the teacher panel's work hands its event, all on the CPU."""
    teacher: torch.Tensor  # [gh, gw] the teacher's map on the native grid, sums to 1
    answer: str  # the answer the teacher forced: the model's own greedy one on the whole native view
    relevance: torch.Tensor  # [GH, GW] ARR's balanced relevance map
    positions: torch.Tensor  # [K, 2] (row, col) ARR's saccades, most relevant first
    heads: TeacherHeads  # the heads the teacher's map averages


def teacher_and_arr(model: ARRCOCQwen, image: Image.Image, question: str, request: Request,
                    stop: threading.Event) -> Looked:
    """The teacher's map (arr_coc.distill.teacher.teach; its heads chosen at first use: looks.heads_of) and ARR's
    relevance and selection as the Microscope's controls ask, in one hold of the model; `stop` ends it (Stopped)."""
    views = model.views(image, request.max_cells)
    with model.serving("teacher", stop):
        heads = looks.heads_of(model.vlm)
        target = teach(model.vlm, heads, image, question, max_cells=request.max_cells)
        scene = arr_scene.prepare(model.parts, views, question, request)
    kept = kept_scene(scene)
    ranked = selected(model, kept, request).in_order("relevance")
    return Looked(target.map.cpu(), target.answer, kept.relevance, ranked.positions[0].cpu(), heads)


def in_thread(work, tick: tuple):
    """
    Run work(stop) in a thread of its own, yielding `tick` every TICK_S until it returns (its value is this
    generator's return value). Closed early (Stop: gradio closes the event's generator at a tick), it sets `stop`,
    which ends the work at its next vision block or LLM layer, and waits for that.
    """
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="arr-coc-teacher") as pool:
        future = pool.submit(work, stop)
        try:
            while True:
                try:
                    return future.result(timeout=TICK_S)
                except concurrent.futures.TimeoutError:
                    yield tick
        finally:
            stop.set()


@reporting(status_at=0, outputs=2)
def where_it_looks(model: ARRCOCQwen, examples: Path, image: Image.Image | None, question: str, strategy: str,
                   budget: int, max_cells: int, ablation: str = NO_ABLATION.name, auto: bool = False,
                   override: bool = False, explore: float = 0.0, diversify: float = 0.0, particularize: float = 0.5):
    """
    Where the model looks (the teacher: its attention reading the whole native view and answering) beside where ARR
    looked (its relevance and saccades, as Analyse selects them), their overlap, and the asked box where the image
    and question are an example page's (`examples`: assets/examples.json) -> (summary, drawing). Opt-in: the teacher
    costs a full-view forward and the model's own answer (and, at first use, choosing its heads). Stop as Compare's.
    """
    image, question = ui.check_inputs(model, image, question)
    if strategy not in STRATEGIES:  # before the teacher's forward, not after it
        raise InputError(f"the strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    request = check_request(microscope_request(budget, (auto, override, explore, diversify, particularize),
                                               strategy=strategy, max_cells=int(max_cells), ablation=ablation))
    box, start = looks.example_box(image, question, examples), time.perf_counter()
    yield from wait_for_model(model, (FINISHING, gr.skip()))
    first = "" if model.vlm in looks.HEADS else f" (first use: choosing its heads on {looks.CALIBRATION_PAGES} pages)"
    running = (f"{RUNNING} the teacher over the whole view{first}, then ARR…", gr.skip())
    yield running
    seen = yield from in_thread(functools.partial(teacher_and_arr, model, image, question, request), running)
    numbers = looks.overlap_of(seen.teacher, seen.relevance, seen.positions, box, image.size)
    drawing = viz.teacher_comparison(image, seen.teacher, seen.relevance, box, seen.positions)
    yield (f"Done in {time.perf_counter() - start:.1f} s. " + looks.overlap_text(numbers, seen.heads, seen.answer),
           drawing)


# ----------------------------------------------------------------------------- Checkpoint A/B


@reporting(status_at=5, outputs=6)
def ab(model: ARRCOCQwen, checkpoints: Path, image: Image.Image | None, question: str, choice_a: str,
       files_a: list[str] | None, choice_b: str, files_b: list[str] | None, strategy: str, max_new_tokens: int,
       max_cells: int):
    """Answer with checkpoints A and B (from the folder `checkpoints` or uploaded) on the same input; draw both. The
    summary (the tab's status) says "Failed: why" if a step fails; Stop as Compare's."""
    image, question = ui.check_inputs(model, image, question)  # its tokens too, before any checkpoint loads
    layer_a = ui.choose_layer(model, "A", choice_a, files_a, checkpoints)  # bad files fail before VLM work
    layer_b = ui.choose_layer(model, "B", choice_b, files_b, checkpoints)
    yield from wait_for_model(model, (*[gr.skip()] * 5, FINISHING))
    views = model.views(image, int(max_cells))  # identical views, made once: only the layers differ
    request = Request(max_new_tokens=int(max_new_tokens), max_cells=int(max_cells))
    answers = []
    for name, layer in (("A", layer_a), ("B", layer_b)):
        mine = with_settings(request, dict(strategy=strategy, layer=layer))
        for answer in model.stream(views, question, "arr", request=mine):
            yield *[gr.skip()] * 5, f"{RUNNING} checkpoint **{name}**…"
        answers.append(answer)
    a, b = answers
    heatmaps = [None if x.arr is None else viz.heatmap_overlay(x.views.image, x.arr.relevance[0], x.saccades)
                for x in answers]  # None: it read the image whole (ui.native_note), nothing chosen to draw
    difference = None if None in heatmaps else viz.difference_map(a.arr.relevance[0], b.arr.relevance[0],
                                                                  a.saccades, b.saccades)
    yield *heatmaps, difference, ui.answer_text(a), ui.answer_text(b), ui.ab_summary(a, b)


# ----------------------------------------------------------------------------- Conversation


@dataclass
class Chat:
    """The Conversation tab's session: one image asked in turn by ARR and by a baseline, a conversation each."""
    arr: Conversation  # ARR's: a new block of saccades a turn
    baseline: Conversation  # the baseline's: the image read once, in turn 1
    rows: list  # the turns so far, as ui.turn_row gives them
    digest: str  # the image's pixels' SHA-1: another image in the box starts a new conversation

    def to(self, device) -> "Chat":
        self.arr.to(device)
        self.baseline.to(device)
        return self

    def fork(self) -> "Chat":
        """
        A copy a turn may change: new lists, and a copy of each conversation's last answer (the one a turn and
        Conversation.to change); the earlier answers are shared (nothing changes them again). A turn works on a
        fork and returns it, so the session's own Chat changes only when the event's outputs land: a cancelled,
        failed or refused turn leaves it as it was, ARR's and the baseline's conversations in step.
        """
        arr, baseline = (replace(c, answers=[*c.answers[:-1], *map(copy.copy, c.answers[-1:])])
                         for c in (self.arr, self.baseline))
        return Chat(arr, baseline, list(self.rows), self.digest)


@ui.reports_errors
def converse(model: ARRCOCQwen, chat: Chat | None, image: Image.Image | None, question: str, baseline: str,
             max_new_tokens: int, budget: int, fresh_cells: bool, numbered: int) -> tuple:
    """
    The next turn of the session's conversation about an image (the first, without one): ARR reads the question
    anew, the baseline continues its own; -> (the Chat, a status line, the turns table, ARR's relevance and
    numbered saccades this turn, how they moved from the turn before: new, kept, dropped). The turn is taken on a
    fork of the session's Chat (Chat.fork): a refused or cancelled turn leaves the conversation as it was.
    """
    image, question = ui.check_inputs(model, image, question)  # RGB: the one the conversation keeps and hashes
    digest = hashlib.sha1(image.tobytes()).hexdigest()
    if chat is None or chat.digest != digest:  # a first question, or another image loaded into the box
        chat = Chat(Conversation("arr", image), Conversation(baseline, image), [], digest)
    elif baseline != chat.baseline.pipeline:
        raise InputError(f"this conversation's baseline is {chat.baseline.pipeline}: press New image to start "
                         f"one with {baseline}")
    chat = chat.fork().to(model.vlm.device)
    try:
        views = None if chat.arr.answers else model.views(chat.arr.image)  # turn 1 reads the image: once for both
        gh, gw = (views or chat.arr.answers[0].views).candidate_grid  # the slider allows the largest grid
        request = Request(max_new_tokens=int(max_new_tokens))
        ours = with_settings(request, dict(budget=min(int(budget), gh * gw), fresh_cells=bool(fresh_cells)))
        a = model.answer(views, question, request=ours, conversation=chat.arr)
        b = model.answer(views, question, request=request, conversation=chat.baseline)
        heatmap, drawing, moved = turn_drawings(chat.arr, a, int(numbered))
        chat.rows.append(ui.turn_row(question, b, a, moved))
    finally:
        chat.to("cpu")
    fresh = ui.fresh_cells_note(a, arr_options(ours).fresh_cells, ours.budget) + (
        f" {ui.native_note(a)}" if a.reads_native else "")
    status = (f"Turn {a.turn}: ARR prefilled {a.prefilled} tokens (its conversation holds {a.context}), "
              f"{baseline} {b.prefilled} (holds {b.context}).{fresh} Ask a follow-up, or press New image to start "
              "again.")
    return chat, status, chat.rows, heatmap, drawing


def turn_drawings(conversation: Conversation, a: Answer, numbered: int) -> tuple:
    """An ARR turn's drawings -> (its relevance and numbered saccades, how they moved from the turn before, the
    conversation.Moves: None on turn 1, or where the conversation read the image whole, ui.native_note); no drawing
    where it chose nothing (read whole, or no fresh cell left)."""
    moved = moves(conversation.answers[-2], a) if a.turn > 1 and a.reads_native is None else None
    if a.arr is None:
        return None, None, moved
    image, grid = a.views.image, a.views.candidate_grid
    heatmap = viz.heatmap_overlay(image, a.arr.relevance[0], a.arr.in_order("relevance").positions[0],
                                  numbered=numbered)
    drawing = None if moved is None else viz.moves_overlay(image, grid, moved.new, moved.kept, moved.dropped,
                                                           a.arr.relevance[0], a.turn)
    return heatmap, drawing, moved


def new_conversation() -> tuple:
    """New image: the session's conversation and the tab's outputs, cleared."""
    return None, "A new conversation: ask a first question about the image.", [], None, None
