"""
ARR-COC microscope, the Gradio app: baseline vs ARR-COC answers side by side, the relevance microscope,
a conversation of follow-up questions, each with its own saccades, and an A/B of two ARR checkpoints, all over one
frozen Qwen-VL (Qwen2-VL, Qwen2.5-VL or Qwen3-VL).

    python app.py                            # http://127.0.0.1:7860, Qwen/Qwen2-VL-2B-Instruct
    python app.py --model pocket             # offline: the pocket Qwen2-VL trained here on fine-print scenes
    python app.py --model tiny               # offline tiny model: answers meaningless, maps real
    python app.py --model tiny-qwen3-vl      # the tiny Qwen3-VL (or tiny-qwen2.5-vl, or any Qwen-VL hub id / folder)
    python app.py --checkpoint NAME --port 8000 --share
    python app.py --cache-age 600            # uploads and drawings leave gradio's cache after 10 minutes
    python app.py --upload-cache-mb 256      # at most 256 MB of uploads kept: each upload deletes the oldest past it
    python app.py --queue-size 16 --session-jobs 2   # at most 16 requests waiting, 2 of them from one session

Layout (one function per tab) and wiring only; the handlers are arr_coc/app/handlers.py, the rest is in arr_coc/.
Every event has an api_name, so gradio_client can drive it: compare, microscope, kept_cells, reselect,
faithfulness, where_it_looks, converse, new_conversation, ab, and redraw (renumbers the last Compare heatmap and
mosaic without the VLM). On a ZeroGPU Space
(SPACES_ZERO_GPU), the events that run the VLM are wrapped in spaces.GPU and nothing captures CUDA graphs
(arr_coc/runtime/zerogpu.py).
"""

import os

from arr_coc.commands import cli
from arr_coc.app import options
from arr_coc.app.options import CACHE_AGE_S

CACHE_CHECK_S = 600  # how often the cache is swept for them (more often where --cache-age is shorter)
HOST = os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1")  # where the app serves


def parse_args(argv: list[str] | None = None) -> options.AppConfig:
    """The app's flags (arr_coc.app.options.AppConfig); a port in use on HOST is refused at once."""
    return options.parse_args(argv, HOST, port_free)


def port_free(host: str, port: int) -> bool:
    """Whether a server can listen on host:port now (bound as uvicorn binds it: SO_REUSEADDR)."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


if __name__ == "__main__":
    ARGS = parse_args()  # first: --help and a bad flag answer at once, before gradio and torch load (seconds)

import functools  # noqa: E402  (after the flags: see above)
import html  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import gradio as gr  # noqa: E402
from gradio.route_utils import delete_files_created_by_app  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from arr_coc.runtime import zerogpu  # noqa: E402
from arr_coc import viz  # noqa: E402
from arr_coc.app import handlers, ui, uploads  # noqa: E402
from arr_coc.settings import MAX_CELLS, MIN_CELLS, PipelineConfig  # noqa: E402
from arr_coc.relevance.config import STRATEGIES  # noqa: E402
from arr_coc.settings import MAX_NEW_TOKENS, REFIXATE_GUIDES  # noqa: E402
from arr_coc.eval.faithfulness import MAX_ANSWER_CHARS  # noqa: E402
from arr_coc.model import ARRCOCQwen, MAX_QUESTION_CHARS  # noqa: E402
from arr_coc.relevance import ablation as ablations  # noqa: E402
from arr_coc.relevance.config import ARRCOCConfig  # noqa: E402
from arr_coc.vlm.families import FAMILY_NAMES  # noqa: E402
from arr_coc.checkpoints import ROOT as CHECKPOINTS  # noqa: E402  (the shipped checkpoints, found by name)
from arr_coc.checkpoints import hub_out_of_reach  # noqa: E402

log = logging.getLogger("arr_coc.app")
ROOT = Path(__file__).parent
EXAMPLES_FILE = ROOT / "assets" / "examples.json"  # the examples, with each page's asked box where it has one
EXAMPLES = ui.load_examples(EXAMPLES_FILE)
EXAMPLE_LABELS = ui.example_labels(EXAMPLES_FILE)
EXAMPLES_NOTE = ("**Examples.** The first ones are fine-print pages of the kind the offline pocket model (`--model "
                 "pocket`) was trained on: it answers them as the arrow says. The photos and the other scenes mean "
                 "something only with real Qwen-VL weights; the pocket and tiny models say nothing about them.")
GPU = "gpu"  # the concurrency group of every event that runs the VLM: one at a time on the one GPU
# ZeroGPU: the most one call of each event holds the GPU, in seconds
GPU_SECONDS = dict(compare=120, microscope=60, kept_cells=60, faithfulness=120, converse=120, ab=120,
                   where_it_looks=120)
DRAWING_HEIGHT = 640  # px: cell drawings get a fixed box, so a portrait page cannot collapse it to zero height


# ----------------------------------------------------------------------------- components


def image_and_question(tab: str) -> tuple[gr.Image, gr.Textbox]:
    image = ui.image_input(label="Image", elem_id=f"{tab}-image")
    question = gr.Textbox(label=f"Question (up to {MAX_QUESTION_CHARS} characters)", lines=2,
                          placeholder="Ask about the image", max_length=MAX_QUESTION_CHARS, elem_id=f"{tab}-question")
    return image, question


def strategy_dropdown(config: ARRCOCConfig) -> gr.Dropdown:
    return gr.Dropdown(list(STRATEGIES), value=config.strategy, label="Saccade strategy")


def tokens_slider() -> gr.Slider:
    return gr.Slider(1, MAX_NEW_TOKENS, value=64, step=1, label="Max new tokens")


def cells_slider(pipeline: PipelineConfig) -> gr.Slider:
    return gr.Slider(MIN_CELLS, MAX_CELLS, value=pipeline.max_cells, step=1024, label="Max cells",
                     info="cap on the native-resolution candidate grid (28 px cells); 4096 = 64x64 at 1792²; "
                          "the full baseline uses the same cap")


def numbered_slider(config: ARRCOCConfig) -> gr.Slider:
    return gr.Slider(0, config.budget, value=viz.TOP_LABELS, step=1, label="Numbered saccades",
                     info="every saccade gets a box; the most relevant this many also get their rank (a crowded "
                          "one is moved aside on a line, or listed on the drawing if there is no room)")


def refixate_slider() -> gr.Slider:
    return gr.Slider(0.0, 1.0, value=0.0, step=0.05, label="Second look below confidence τ",
                     info="when ARR's answer is less sure than τ (its least probable token's probability), it looks "
                          "again at half as many new cells and answers anew; 0 = off")


def refixate_guide_radio() -> gr.Radio:
    return gr.Radio(list(REFIXATE_GUIDES), value=REFIXATE_GUIDES[0], label="Second look guided by",
                    info="prior: the question's gaze on the gestalt again, the first saccades read; attention: the "
                         "cells beside where the first answer's own attention fell")


def output_image(label: str, elem_id: str, height: int | None = DRAWING_HEIGHT) -> gr.Image:
    """
    A drawing under its own caption: gradio lays an image's label over its top-left corner, where it would hide
    rank numbers, mosaic tiles or a chart's first title.
    """
    with gr.Column(min_width=160):
        gr.Markdown(f"**{label}**")
        return gr.Image(label=label, show_label=False, type="pil", format="png", interactive=False, height=height,
                        elem_id=elem_id)


def output_table(label: str, headers: list[str], elem_id: str | None = None,
                 widths: list[str] | None = None) -> gr.Dataframe:
    # wrap, one width per column: a grid row ("64 x 64 cells (1792 x 1792 px)") is wider than half a stats table
    widths = widths or [f"{100 / len(headers):g}%"] * len(headers)
    return gr.Dataframe(headers=headers, label=label, interactive=False, wrap=True, max_height=1000,
                        column_widths=widths, elem_id=elem_id)


def example_list() -> gr.Dataset:
    """
    The examples, at the top of a tab beside its image box: a thumbnail of each image and its whole label (the
    fine-print pages the offline pocket model answers come first, with their expected answers; the photos and
    other scenes are said to need real Qwen-VL weights), in a box of the image box's height that scrolls (CSS).
    """
    gr.Markdown(EXAMPLES_NOTE, elem_classes="examples-note")
    return gr.Dataset(components=["image", "html"],  # html: shown whole (gradio's textbox example cuts at 60 chars)
                      samples=[[path, html.escape(label)] for (path, _), label in zip(EXAMPLES, EXAMPLE_LABELS)],
                      headers=["image", "question → the pocket model's answer, or what it needs"], type="tuple",
                      layout="table", samples_per_page=len(EXAMPLES), label="Examples (click one)",
                      elem_classes="examples")


def pick_examples(listed: gr.Dataset, image: gr.Image, question: gr.Textbox, cleared: list, reset=None) -> None:
    """
    A click on an example fills the question and shows the example's file in the image box as a plain value:
    an example loaded into the image box itself is gradio's update of it, which re-creates the box for the session
    without image_input's upload check. The row is looked up by the clicked index (show_example), never taken from
    the client, and both events are private: no client can name a file for the server to hand back. The click also
    empties the tab's results (`cleared`: reset() gives their values, else none), so an earlier example's answers
    and maps do not stay under the new one, and scrolls the page to the image box.
    """
    scroll = f"(x) => {{ document.getElementById('{image.elem_id}')?.scrollIntoView({{block: 'start'}}); return x; }}"
    listed.click(show_example, listed, [image, question], api_visibility="private", queue=False, js=scroll)
    empty = reset or (lambda: [None] * len(cleared) if len(cleared) > 1 else None)
    listed.click(empty, None, cleared, api_visibility="private", queue=False,  # its own name: reset's
                 api_name=f"{image.elem_id.replace('-', '_')}_example_clears")  # own stays the endpoint's


def checked_uploads(image: gr.Image, status: gr.Markdown | None) -> None:
    """
    An upload is read at once (image_input's read_upload, the event's preprocess): a file that is no image (a
    text file named .png) is refused with its one-line toast and the box emptied, not left as a collapsed box
    until the tab's button; a good one's size goes to the status line.
    """
    read = image.upload(ui.upload_summary if status else lambda image: None, image, status,
                        api_visibility="private")  # queued: gradio toasts a queued event's error, not another's
    read.failure(lambda: None, None, image, api_visibility="private", queue=False)


def show_example(example: tuple[int, list]) -> tuple[str, str]:
    """The clicked example's file, for the image box, and its question: EXAMPLES' row at the index gradio's Dataset
    checked."""
    index, _ = example
    return EXAMPLES[index][0], EXAMPLES[index][1]


def bind(model: ARRCOCQwen, handler, *args, gpu_seconds: int | None = None):
    """
    A handler with the model (and `args`) given, as an event's function; with gpu_seconds, wrapped for ZeroGPU.
    The model is bound, not passed: ZeroGPU's worker is forked from this process and sees it without a copy.
    """
    event = functools.partial(handler, model, *args)
    event.__name__ = handler.__name__  # gradio and spaces name events by their function
    return event if gpu_seconds is None else zerogpu.on_gpu(event, duration=gpu_seconds)


# ----------------------------------------------------------------------------- the tabs


def compare_tab(model: ARRCOCQwen) -> None:
    """Baseline vs ARR-COC, streamed side by side; their stats, ARR's heatmap, gestalt, mosaic and weights."""
    config = model.layer.config
    with gr.Row():
        with gr.Column(scale=1):
            image, question = image_and_question("compare")
            with gr.Row():
                baseline = gr.Dropdown(options.choices("compare"), value="full", label="Baseline")
                strategy = strategy_dropdown(config)
            tokens, cells, numbered = tokens_slider(), cells_slider(model.pipeline), numbered_slider(config)
            refixate, guide = refixate_slider(), refixate_guide_radio()
            with gr.Row():
                run = gr.Button("Compare", variant="primary", elem_id="compare-run")
                stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
            status = gr.Markdown(label="Status", elem_id="compare-status", elem_classes="status-line")
        with gr.Column(scale=2):
            listed = example_list()
            with gr.Row():
                with gr.Column():
                    base_text = gr.Textbox(label="Baseline answer", lines=3, elem_id="baseline-answer")
                    base_stats = output_table("Baseline stats", ui.STATS_HEADERS, "baseline-stats")
                    with gr.Column(visible=False) as base_cells_panel:  # only a reducer keeps cells to draw
                        base_cells = output_image("The cells the reducer baseline kept", "baseline-cells")
                with gr.Column():
                    arr_text = gr.Textbox(label="ARR-COC answer", lines=3, elem_id="arr-answer")
                    arr_stats = output_table("ARR-COC stats", ui.STATS_HEADERS, "arr-stats")
            heatmap = output_image("Relevance and numbered saccades (1 = most relevant; a second look's in green)",
                                   "arr-heatmap")
            with gr.Row():
                gestalt = output_image("Gestalt view, as the model saw it", "arr-gestalt", height=None)
                mosaic = output_image("saccade mosaic (what the LLM read at full detail)", "arr-mosaic", height=None)
            weights = output_image("Balancer weights, and what each scorer gave the saccades", "arr-weights",
                                   height=None)
    kept = gr.State(time_to_live=3600)  # the last ARR answer's drawing data (CPU): freed an hour after
    pick_examples(listed, image, question, [status, base_text, base_stats, arr_text, arr_stats, heatmap, gestalt,
                                            weights, mosaic, base_cells, kept])
    checked_uploads(image, status)

    event = gr.on([run.click, question.submit], bind(model, handlers.compare, gpu_seconds=GPU_SECONDS["compare"]),
                  [image, question, baseline, tokens, strategy, cells, numbered, refixate, guide],
                  [status, base_text, base_stats, arr_text, arr_stats, heatmap, gestalt, weights, mosaic, base_cells,
                   kept],
                  api_name="compare", concurrency_id=GPU)
    # Stop cancels first and says so after: an output the cancelled event had already sent cannot land later.
    # Not an endpoint: gradio's cancel is the browser's (a private event), so a client stops with its job.cancel()
    stop.click(None, cancels=[event]).then(handlers.stopped, status, status, api_visibility="private",
                                           concurrency_limit=None)  # never waits in a queue; frees the GPU one
    numbered.release(handlers.redraw, [kept, numbered], [heatmap, mosaic], api_name="redraw")
    baseline.change(handlers.show_kept_cells, baseline, base_cells_panel, api_visibility="private", queue=False)


def microscope_tab(model: ARRCOCQwen) -> None:
    """ARR up to selection: every map, instant re-selection, the faithfulness curves, and where the model looks."""
    config = model.layer.config
    with gr.Row():
        with gr.Column(scale=1):
            image, question = image_and_question("microscope")
            run = gr.Button("Analyse", variant="primary", elem_id="microscope-run")
            strategy = strategy_dropdown(config)
            ablation = gr.Dropdown([ablations.NO_ABLATION.name, *ablations.ABLATIONS], value=ablations.NO_ABLATION.name,
                                   label="Ablation (applied on Analyse)", info=ablations.describe(),
                                   elem_id="microscope-ablation")
            budget = gr.Slider(1, 4 * model.pipeline.gestalt_max_tokens, value=config.budget, step=1,
                               label="Saccade budget (re-selects instantly)", elem_id="microscope-budget")
            tensions = tension_controls()
            numbered, cells = numbered_slider(config), cells_slider(model.pipeline)
            reducer = gr.Dropdown(options.choices("microscope"), value=options.NO_REDUCER,
                                  label="Draw a reducer's kept cells over the relevance", elem_id="microscope-reducer",
                                  info="as many visual tokens as ARR reads at the budget (runs the reducer); "
                                       "drawn just below")
            with gr.Column(visible=False) as reduced_panel:  # shown once a reducer is chosen, under its dropdown
                reduced = output_image("The reducer's kept cells over ARR's relevance", "microscope-reducer-cells",
                                       height=None)
            summary = gr.Markdown(label="Selection", elem_id="microscope-summary", elem_classes="status-line")
        with gr.Column(scale=2):
            listed = example_list()
            heatmap = output_image("Relevance and numbered saccades", "microscope-heatmap")
            oracle_view = oracle_panel()  # on an example page with a known asked box only
            mosaic = output_image("saccade mosaic (what the LLM read at full detail)", "microscope-mosaic", height=None)
            with gr.Accordion("Saccade list", open=False, elem_id="microscope-saccade-list"):
                saccades = output_table("Saccades", ui.SACCADE_HEADERS, "microscope-saccades")
            curves, answer, measure, verdict = faithfulness_panel()
            looks, look_summary, look_run, look_stop = looks_panel()
    scorers = output_image("Scorer maps, participatory prior and balanced relevance", "microscope-scorers", None)
    channels = output_image("The 13 texture channels (all on a 0..1 scale)", "microscope-channels", None)
    gr.Markdown(ui.channels_markdown())
    kept = gr.State(time_to_live=3600)  # the analysed image's maps (CPU): freed an hour after the last update
    pick_examples(listed, image, question, [kept, channels, scorers, heatmap, summary, saccades, mosaic, reduced,
                                            curves, verdict, looks, look_summary, *oracle_view])
    checked_uploads(image, summary)

    analysed = run.click(bind(model, handlers.microscope, gpu_seconds=GPU_SECONDS["microscope"]),
                         [image, question, strategy, budget, cells, numbered, ablation, *tensions],
                         [kept, channels, scorers, heatmap, summary, saccades, mosaic], api_name="microscope",
                         concurrency_id=GPU)
    draw_reducer = bind(model, handlers.kept_cells, gpu_seconds=GPU_SECONDS["kept_cells"])
    reducer_inputs = [kept, image, question, reducer, budget, cells, *tensions]
    analysed.success(draw_reducer, reducer_inputs, reduced, api_name="kept_cells", concurrency_id=GPU)
    redraw_on_k(tensions, [reducer.change, budget.release], draw_reducer, reducer_inputs, reduced)
    reducer.change(handlers.show_kept_cells, reducer, reduced_panel, api_visibility="private", queue=False)
    measure.click(bind(model, handlers.faithfulness, gpu_seconds=GPU_SECONDS["faithfulness"]),
                  [image, question, answer, strategy, budget, cells], [curves, verdict], api_name="faithfulness",
                  concurrency_id=GPU)
    looks_events(model, look_run, look_stop, [image, question, strategy, budget, cells, ablation, *tensions],
                 [look_summary, looks])
    reselected = gr.on([strategy.change, budget.release, numbered.release, *(t.change for t in tensions[:2]),
           *(t.release for t in tensions[2:])], bind(model, handlers.reselect),
          [kept, strategy, budget, numbered, *tensions], [heatmap, summary, saccades, mosaic], api_name="reselect")
    oracle_events(model, [analysed, reselected], [kept, image, question, strategy, budget, *tensions], oracle_view)


def looks_events(model: ARRCOCQwen, run: gr.Button, stop: gr.Button, inputs: list, outputs: list) -> None:
    """The teacher panel's button (handlers.where_it_looks -> its summary and drawing, `outputs`) and its Stop, as
    Compare's."""
    looked = run.click(bind(model, handlers.where_it_looks, EXAMPLES_FILE, gpu_seconds=GPU_SECONDS["where_it_looks"]),
                       inputs, outputs, api_name="where_it_looks", concurrency_id=GPU)
    stop.click(None, cancels=[looked]).then(handlers.stopped, outputs[0], outputs[0], api_visibility="private",
                                            concurrency_limit=None)


def oracle_panel() -> list:
    """The Microscope's oracle (evaluate's oracle row: the asked box's cells forced into ARR's budget, the rest by
    ARR's own order) on an example page with a known box: its line and its drawing, the box outlined."""
    line = gr.Markdown(label="Oracle", elem_id="microscope-oracle-summary", elem_classes="status-line")
    drawing = output_image("Oracle: the asked box (green) forced into the budget, the rest by ARR's relevance",
                           "microscope-oracle", height=None)
    return [drawing, line]


def oracle_events(model: ARRCOCQwen, events: list, inputs: list, outputs: list) -> None:
    """The oracle (handlers.oracle: CPU only, no VLM) drawn anew once each of `events` (Analyse, a re-selection)
    has succeeded."""
    for event in events:
        event.success(bind(model, handlers.oracle, EXAMPLES_FILE), inputs, outputs, api_visibility="private")


def redraw_on_k(tensions: list, triggers: list, draw, inputs: list, output) -> None:
    """kept_cells again on a new reducer or budget (`triggers`) or whatever moves the adaptive K, and so the reducer's
    tokens: the tension controls' auto switch, override and particularize."""
    auto, override, _, _, particularize = tensions
    gr.on([*triggers, auto.change, override.change, particularize.release], draw, inputs, output,
          api_visibility="private", concurrency_id=GPU)


def tension_controls() -> list:
    """The Microscope's tensions: the adaptive budget's switch, the override switch and a slider per tension
    (ui.TENSION_SLIDERS); the summary shows the values the selection used."""
    with gr.Accordion("Tensions: explore, diversify, adaptive budget", open=False, elem_id="microscope-tensions"):
        auto = gr.Checkbox(False, label="Adaptive budget (auto): K from the map's concentration, not the slider",
                           elem_id="microscope-auto-budget")
        override = gr.Checkbox(False, label="Override the balancer's tensions with these sliders",
                               elem_id="microscope-override")
        sliders = [gr.Slider(lo, hi, value=start, step=step, label=label, elem_id=f"microscope-{name}")
                   for name, (label, lo, hi, step, start) in ui.TENSION_SLIDERS.items()]
    return [auto, override, *sliders]


def faithfulness_panel() -> tuple[gr.Image, gr.Textbox, gr.Button, gr.Markdown]:
    """The Microscope's faithfulness accordion: the answer box (capped), the button, the chart and the verdict."""
    with gr.Accordion("Faithfulness: does the answer depend on these saccades?", open=False):
        gr.Markdown("The answer's log-likelihood as the saccades are removed most relevant first "
                    "(deletion), in a random order, and added back in rank order (insertion).")
        with gr.Row():
            answer = gr.Textbox(label=f"Answer to score (empty: ARR's own; up to {MAX_ANSWER_CHARS} characters)",
                                max_length=MAX_ANSWER_CHARS, scale=3, elem_id="faithfulness-answer")
            measure = gr.Button("Measure (~30 forward passes)", scale=1, elem_id="faithfulness-run")
        curves = output_image("Faithfulness curves", "faithfulness-plot", height=None)
        verdict = gr.Markdown(label="Summary", elem_id="faithfulness-summary", elem_classes="status-line")
    return curves, answer, measure, verdict


def looks_panel() -> tuple[gr.Image, gr.Markdown, gr.Button, gr.Button]:
    """The Microscope's "Where the model looks" accordion: the teacher's map beside ARR's relevance, on request."""
    with gr.Accordion("Where the model looks: the teacher beside ARR", open=False, elem_id="microscope-looks-panel"):
        gr.Markdown("The teacher is where the model looks when it reads the whole image: the attention of its own "
                    "answer's tokens to the full native view (docs/teacher.md). Beside it, ARR's relevance and "
                    "saccades for the same question and controls, their overlap, and the asked box on an example "
                    "page. It costs a full-view forward, so it runs only when asked.")
        with gr.Row():
            run = gr.Button("Where the model looks (one full-view forward)", variant="primary", scale=3,
                            elem_id="microscope-looks-run")
            stop = gr.Button("Stop", variant="stop", scale=1, elem_id="microscope-looks-stop")
        summary = gr.Markdown(label="Teacher vs ARR", elem_id="microscope-looks-summary", elem_classes="status-line")
        drawing = output_image("The teacher's map · ARR's relevance and saccades · their overlap", "microscope-looks",
                               height=None)
    return drawing, summary, run, stop


def conversation_tab(model: ARRCOCQwen) -> None:
    """One image, question after question: ARR reads each anew (its saccades per turn, and how they moved), the
    baseline continues its own conversation; a table of the turns with what each prefilled."""
    config = model.layer.config
    with gr.Row():
        with gr.Column(scale=1):
            image, question = image_and_question("chat")
            with gr.Row():
                baseline = gr.Dropdown(options.choices("chat"), value="full",
                                       label="Baseline", info="fixed for a conversation")
                budget = gr.Slider(1, 4 * model.pipeline.gestalt_max_tokens, value=config.budget, step=1,
                                   label="Saccades a turn")
            tokens, numbered = tokens_slider(), numbered_slider(config)
            fresh = gr.Checkbox(False, label="Fresh cells", info="a follow-up reads only cells no earlier turn read")
            with gr.Row():
                ask = gr.Button("Ask", variant="primary", elem_id="chat-ask")
                reset = gr.Button("New image", elem_id="chat-new")
            status = gr.Markdown("Ask a first question about the image.", label="Status", elem_id="chat-status",
                                 elem_classes="status-line")
        with gr.Column(scale=2):
            listed = example_list()
            with gr.Row():
                heatmap = output_image("This turn's relevance and numbered saccades", "chat-heatmap")
                moved = output_image("How the saccades moved from the turn before: new (green), kept (cyan), dropped "
                                     "(red)", "chat-moves")
    turns = output_table("Turns", ui.TURN_HEADERS, "chat-turns", ui.TURN_WIDTHS)  # the page's width: no word split
    chat = gr.State(time_to_live=3600)  # the conversations (CPU between turns): freed an hour after the last turn
    pick_examples(listed, image, question, [chat, status, turns, heatmap, moved], handlers.new_conversation)
    checked_uploads(image, None)
    gr.on([ask.click, question.submit], bind(model, handlers.converse, gpu_seconds=GPU_SECONDS["converse"]),
          [chat, image, question, baseline, tokens, budget, fresh, numbered], [chat, status, turns, heatmap, moved],
          api_name="converse", concurrency_id=GPU)
    gr.on([reset.click, image.upload], handlers.new_conversation, None, [chat, status, turns, heatmap, moved],
          api_name="new_conversation", queue=False)


def ab_tab(model: ARRCOCQwen, layer_name: str) -> None:
    """Two ARR checkpoints on the same input: both heatmaps and answers, their difference and agreement."""
    choices = ui.checkpoint_choices(CHECKPOINTS, model)  # only those made for the loaded model: the others cannot load
    with gr.Row():
        with gr.Column(scale=1):
            image, question = image_and_question("ab")
            with gr.Row():
                with gr.Column():
                    choice_a = gr.Dropdown(choices, value=ui.PRIOR, label="Checkpoint A")
                    files_a = ui.checkpoint_upload(label="…or upload A: config.json + model.safetensors")
                with gr.Column():
                    choice_b = gr.Dropdown(choices, value=layer_name, label="Checkpoint B")
                    files_b = ui.checkpoint_upload(label="…or upload B: config.json + model.safetensors")
            strategy = strategy_dropdown(model.layer.config)
            tokens, cells = tokens_slider(), cells_slider(model.pipeline)
            with gr.Row():
                run = gr.Button("Compare checkpoints", variant="primary", elem_id="ab-run")
                stop = gr.Button("Stop", variant="stop", elem_id="ab-stop")
            summary = gr.Markdown(label="Agreement", elem_id="ab-summary",  # also the tab's status while running
                                  elem_classes="status-line")
        with gr.Column(scale=2):
            listed = example_list()
            with gr.Row():
                with gr.Column():
                    heat_a = output_image("A: relevance and saccades", "ab-heatmap-a")
                    text_a = gr.Textbox(label="A's answer", lines=2, elem_id="ab-answer-a")
                with gr.Column():
                    heat_b = output_image("B: relevance and saccades", "ab-heatmap-b")
                    text_b = gr.Textbox(label="B's answer", lines=2, elem_id="ab-answer-b")
            difference = output_image("Difference B − A", "ab-difference")
    pick_examples(listed, image, question, [heat_a, heat_b, difference, text_a, text_b, summary])

    event = run.click(bind(model, handlers.ab, CHECKPOINTS, gpu_seconds=GPU_SECONDS["ab"]),
                      [image, question, choice_a, files_a, choice_b, files_b, strategy, tokens, cells],
                      [heat_a, heat_b, difference, text_a, text_b, summary], api_name="ab", concurrency_id=GPU)
    checked_uploads(image, summary)
    stop.click(None, cancels=[event]).then(handlers.stopped, summary, summary, api_visibility="private",
                                           concurrency_limit=None)  # as Compare's Stop


def make_app(model: ARRCOCQwen, layer_name: str, notices: list[str], cache_age: int = CACHE_AGE_S) -> gr.Blocks:
    """The page over one loaded model, which every tab shares: a header, then the three tabs. Its uploads and
    drawings leave gradio's cache `cache_age` seconds after they were written (the examples stay)."""
    with gr.Blocks(title="ARR-COC microscope", delete_cache=(min(cache_age, CACHE_CHECK_S), cache_age)) as demo:
        gr.Markdown(f"# ARR-COC microscope\nQuery-aware visual token selection for Qwen-VL: a low-res gestalt plus "
                    f"{model.layer.config.budget} high-res saccades chosen by relevance. Model `{model.vlm.name}` "
                    f"({FAMILY_NAMES.get(model.vlm.family, model.vlm.family)}, {model.vlm.cell} px cells) · "
                    f"ARR layer `{layer_name}`.")
        for notice in notices:
            gr.Markdown(f"> ⚠️ **{notice}**", elem_classes="notice")
        with gr.Tab("Compare"):
            compare_tab(model)
        with gr.Tab("Microscope"):
            microscope_tab(model)
        with gr.Tab("Conversation"):
            conversation_tab(model)
        with gr.Tab("Checkpoint A/B"):
            ab_tab(model, layer_name)
    ui.checked_numbers(demo)  # NaN, Infinity: one line naming the slider, from any client
    ui.one_line_refusals(demo)  # gradio's own refusals of an input: one line, no traceback
    return demo


# ----------------------------------------------------------------------------- start-up


def load(args: options.AppConfig) -> tuple[ARRCOCQwen, str, list[str]]:
    """The model and its ARR layer, saying in the console what start-up does; -> model, layer name, page notices."""
    model = load_model(args.model)
    if model.notice:
        log.warning("%s", model.notice)  # the offline fallback, or an offline model asked for
    layer_name, checkpoint_notice = ui.install_default_layer(model, args.checkpoint, CHECKPOINTS)
    log.info("model %s on %s; ARR layer %s", model.vlm.name, model.vlm.device, layer_name)
    if checkpoint_notice:
        log.warning("%s", checkpoint_notice)
    return model, layer_name, [n for n in (model.notice, checkpoint_notice) if n]


def load_model(name: str) -> ARRCOCQwen:
    """
    The VLM `name`, else the pocket model with a notice that names `name` and why (cli.load_vlm, as the commands
    load: whatever the reason, here). A hub id is looked for on the hub only if one quick probe answers
    (hub_out_of_reach): else from the cache alone, at once; HF_HUB_OFFLINE=1 is said as such.
    """
    hub = cli.hub_model(name)
    offline = hub_out_of_reach() if hub else None
    log.info("loading the model %s%s ...", name, " (a hub id downloads on its first run)" if hub and not offline else "")
    return cli.load_vlm(name, None, "any")


def warm_up(model: ARRCOCQwen) -> None:
    """Capture the CUDA graphs now, not on the first user's request; none on ZeroGPU, and none needed off CUDA."""
    if zerogpu.on_zerogpu():
        log.info("ZeroGPU: a GPU is lent per request, so no CUDA graphs are captured (eager path)")
    elif model.vlm.device.type == "cuda":
        log.info("warming up: capturing CUDA graphs for every pipeline ...")
        log.info("warmed up in %.1f s", model.warmup())


def configure_logging() -> None:
    """The console: ours at INFO (what start-up does, one line per user error), libraries' warnings and up, each
    line once (huggingface_hub prints through its own handler, so it does not pass its lines to ours too)."""
    logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("arr_coc").setLevel(logging.INFO)
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.get_logger().propagate = False


def main(args: options.AppConfig) -> None:
    configure_logging()
    model, layer_name, notices = load(args)  # at start-up, before any request, as ZeroGPU expects
    warm_up(model)
    demo = make_app(model, layer_name, notices, args.cache_age)
    demo.queue(default_concurrency_limit=1, max_size=args.queue_size)
    log.info("serving ...")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a service manager's stop, as Ctrl-C: launch returns
    # show_error: an error raised outside our events (in gradio's own input processing) still tells its reason;
    # max_file_size: the server itself refuses a larger upload, whatever the client; UploadCap: the uploads kept
    # stay under --upload-cache-mb; SessionBound: one session's waiting requests stay under --session-jobs
    cap = Middleware(uploads.UploadCap, blocks=demo, max_bytes=args.upload_cache_mb * 2**20)
    bound = Middleware(uploads.SessionBound, blocks=demo, per_session=args.session_jobs)
    demo.launch(server_name=HOST, server_port=args.port, share=args.share, show_error=True, theme=ui.THEME,
                css=ui.CSS, head=ui.HEAD,
                max_file_size=f"{ui.MAX_UPLOAD_MB}mb", app_kwargs=dict(middleware=[cap, bound]))
    # gradio's own clean-up at shutdown waits for every connection to close, which an open page never does
    delete_files_created_by_app(demo, age=None)  # every upload and drawing; the examples stay
    log.info("stopped; the uploads and drawings were deleted from gradio's cache")


if __name__ == "__main__":
    main(ARGS)
