"""
ARR-COC microscope, the Gradio app: baseline vs ARR-COC answers side by side, the relevance microscope,
and an A/B of two ARR checkpoints, all over one frozen Qwen-VL (Qwen2-VL, Qwen2.5-VL or Qwen3-VL).

    python app.py                            # http://127.0.0.1:7860, Qwen/Qwen2-VL-2B-Instruct
    python app.py --model tiny               # offline tiny model: answers meaningless, maps real
    python app.py --model tiny-qwen3-vl      # the tiny Qwen3-VL (or tiny-qwen2.5-vl, or any Qwen-VL hub id / folder)
    python app.py --checkpoint NAME --port 8000 --share

Layout and wiring only; the work is in arr_coc/ (model, viz, ui). Every event has an api_name, so
gradio_client can drive it: compare, microscope, reselect, faithfulness, ab, and redraw (renumbers the
last Compare heatmap and mosaic without the VLM).
"""

import argparse
import os
import time
from pathlib import Path

import gradio as gr
from PIL import Image

from arr_coc import ui, viz
from arr_coc.config import BASELINES, DEFAULT_MODEL, MAX_CELLS, MIN_CELLS, STRATEGIES
from arr_coc.faithfulness import faithfulness_curves
from arr_coc.model import Answer, ARRCOCQwen, Scene
from arr_coc.vlm.families import FAMILY_NAMES

ROOT = Path(__file__).parent
CHECKPOINTS = ROOT / "checkpoints"
EXAMPLES = ui.load_examples(ROOT / "assets" / "examples.json")
GPU = "gpu"  # the concurrency group of every event that runs the VLM: one at a time on the one GPU
MAX_NEW_TOKENS = 256
FAITHFULNESS_ANSWER_TOKENS = 32  # ARR's own answer, when the faithfulness curves score it


def build_app(model: ARRCOCQwen, layer_name: str, notices: list[str]) -> gr.Blocks:
    """The Blocks app over one loaded model, which every tab shares."""
    config, pipeline = model.layer.config, model.pipeline

    # ------------------------------------------------------------------------- events

    def redraw(arr: Answer | None, numbered: int) -> tuple:
        """The heatmap and the saccade mosaic of a finished ARR answer, the first `numbered` saccades numbered."""
        if arr is None:
            return None, None
        return viz.selection_drawings(arr.views, arr.arr.relevance[0], arr.saccades, int(numbered))

    def compare_outputs(status: str, base_text: str = "", base: Answer | None = None, arr_text: str = "",
                        arr: Answer | None = None, numbered: int = viz.TOP_LABELS) -> tuple:
        """
        The Compare tab's outputs; a pipeline still running shows its text so far, and no stats or drawings.
        The last is the finished ARR answer, kept so the numbered saccades can be redrawn without the VLM.
        """
        base_stats, arr_stats = (None if a is None else ui.stats_rows(a) for a in (base, arr))
        if arr is None:
            return status, base_text, base_stats, arr_text, arr_stats, None, None, None, None, None
        heatmap, mosaic = redraw(arr, numbered)
        return (status, base_text, base_stats, arr_text, arr_stats, heatmap, arr.views.gestalt,
                viz.weights_bar(arr.arr.weights[0]), mosaic, arr)

    @ui.reports_errors
    def compare(image: Image.Image | None, question: str, baseline: str, max_new_tokens: int, strategy: str,
                max_cells: int, numbered: int):
        """Stream the baseline's answer, then ARR-COC's; then their stats and ARR's drawings."""
        ui.check_inputs(image, question)
        start = time.perf_counter()
        settings = dict(max_new_tokens=int(max_new_tokens), max_cells=int(max_cells))  # one cap for both pipelines
        yield compare_outputs(f"Running the **{baseline}** baseline…")
        # model.stream yields the text as it grows, then the finished Answer
        for base in model.stream(image, question, baseline, **settings):
            if isinstance(base, str):
                yield compare_outputs(f"Running the **{baseline}** baseline…", base)
        yield compare_outputs("Running **ARR-COC**…", ui.answer_text(base), base)
        for arr in model.stream(image, question, "arr", strategy=strategy, **settings):
            if isinstance(arr, str):
                yield compare_outputs("Running **ARR-COC**…", ui.answer_text(base), base, arr)
        yield compare_outputs(f"Done in {time.perf_counter() - start:.1f} s.", ui.answer_text(base), base,
                              ui.answer_text(arr), arr, numbered)

    def selection_outputs(scene: Scene, strategy: str, budget: int, numbered: int) -> tuple:
        """Select (no VLM work) and draw: the heatmap, the summary line, the saccade list and the mosaic."""
        start = time.perf_counter()
        gh, gw = scene.views.candidate_grid
        out = model.select(scene, strategy, min(int(budget), gh * gw))  # the slider allows the largest grid
        heatmap, mosaic = viz.selection_drawings(scene.views, out.relevance[0], out.positions[0], int(numbered))
        return heatmap, ui.selection_summary(out, (time.perf_counter() - start) * 1000), ui.saccade_rows(out), mosaic

    @ui.reports_errors
    def microscope(image: Image.Image | None, question: str, strategy: str, budget: int, max_cells: int,
                   numbered: int) -> tuple:
        """Run ARR up to selection once, keep the scene for re-selection, and draw every map."""
        scene = model.prepare(image, question, max_cells=int(max_cells))
        out = model.select(scene)  # textures, scorer maps and weights do not depend on the selection
        return (scene, viz.channel_grid(out.textures[0]), viz.scorer_maps(out),
                *selection_outputs(scene, strategy, budget, numbered))

    @ui.reports_errors
    def reselect(scene: Scene | None, strategy: str, budget: int, numbered: int) -> tuple:
        """A new strategy, budget or count of numbered saccades over the analysed scene: well under a second, no VLM."""
        if scene is None:
            raise gr.Error("Analyse an image first: re-selection reuses its maps.")
        return selection_outputs(scene, strategy, budget, numbered)

    @ui.reports_errors
    def faithfulness(image: Image.Image | None, question: str, answer: str, strategy: str, budget: int,
                     max_cells: int, progress=gr.Progress()) -> tuple:
        """Deletion, random and insertion curves of an answer (empty: ARR's own) over ARR's selection."""
        ui.check_inputs(image, question)
        gh, gw = model.views(image, int(max_cells)).candidate_grid  # the budget slider allows the largest grid
        progress(0.05, desc="ARR's answer and selection")
        arr = model.answer(image, question, "arr", FAITHFULNESS_ANSWER_TOKENS, strategy, min(int(budget), gh * gw),
                           max_cells=int(max_cells))
        progress(0.3, desc="about 30 teacher-forced forward passes")
        curves = faithfulness_curves(model, arr.observation, arr.arr, answer.strip() or arr.text)
        chart = viz.faithfulness_chart(curves.fractions, curves.curves, f"faithfulness of {curves.answer!r}")
        return chart, ui.faithfulness_summary(curves)

    @ui.reports_errors
    def ab(image: Image.Image | None, question: str, choice_a: str, files_a: list[str] | None, choice_b: str,
           files_b: list[str] | None, strategy: str, max_new_tokens: int, max_cells: int,
           progress=gr.Progress()) -> tuple:
        """Answer with checkpoints A and B on the same input; draw both selections and how they differ."""
        ui.check_inputs(image, question)
        layer_a = ui.choose_layer(model, "A", choice_a, files_a, CHECKPOINTS)  # bad files fail before VLM work
        layer_b = ui.choose_layer(model, "B", choice_b, files_b, CHECKPOINTS)
        settings = dict(strategy=strategy, max_cells=int(max_cells))  # identical views: only the layers differ
        progress(0.05, desc="checkpoint A")
        a = model.answer(image, question, "arr", int(max_new_tokens), layer=layer_a, **settings)
        progress(0.5, desc="checkpoint B")
        b = model.answer(image, question, "arr", int(max_new_tokens), layer=layer_b, **settings)
        return (viz.heatmap_overlay(a.views.image, a.arr.relevance[0], a.saccades),
                viz.heatmap_overlay(b.views.image, b.arr.relevance[0], b.saccades),
                viz.difference_map(a.arr.relevance[0], b.arr.relevance[0], a.saccades, b.saccades),
                ui.answer_text(a), ui.answer_text(b), ui.ab_summary(a, b))

    # ------------------------------------------------------------------------- layout

    def image_and_question(tab: str) -> tuple[gr.Image, gr.Textbox]:
        image = ui.image_input(label="Image", elem_id=f"{tab}-image")
        question = gr.Textbox(label="Question", lines=2, placeholder="Ask about the image", elem_id=f"{tab}-question")
        return image, question

    def strategy_dropdown() -> gr.Dropdown:
        return gr.Dropdown(list(STRATEGIES), value=config.strategy, label="Saccade strategy")

    def tokens_slider() -> gr.Slider:
        return gr.Slider(1, MAX_NEW_TOKENS, value=64, step=1, label="Max new tokens")

    def cells_slider() -> gr.Slider:
        return gr.Slider(MIN_CELLS, MAX_CELLS, value=pipeline.max_cells, step=1024, label="Max cells",
                         info="cap on the native-resolution candidate grid (28 px cells); 4096 = 64x64 at 1792²; "
                              "the full baseline uses the same cap")

    def numbered_slider() -> gr.Slider:
        return gr.Slider(0, config.budget, value=viz.TOP_LABELS, step=1, label="Numbered saccades",
                         info="every saccade gets a box; the most relevant this many also get their rank")

    def output_image(label: str, elem_id: str | None = None) -> gr.Image:
        return gr.Image(label=label, type="pil", format="png", interactive=False, elem_id=elem_id)

    def output_table(label: str, headers: list[str], elem_id: str | None = None) -> gr.Dataframe:
        # wrap: a grid row ("64 x 64 cells (1792 x 1792 px)") is wider than half a stats table; no scrolling
        return gr.Dataframe(headers=headers, label=label, interactive=False, wrap=True, max_height=1000,
                            column_widths=["50%", "50%"], elem_id=elem_id)

    with gr.Blocks(title="ARR-COC microscope") as demo:
        gr.Markdown(f"# ARR-COC microscope\nQuery-aware visual token selection for Qwen-VL: a low-res gestalt plus "
                    f"{config.budget} high-res saccades chosen by relevance. Model `{model.vlm.name}` "
                    f"({FAMILY_NAMES.get(model.vlm.family, model.vlm.family)}, {model.vlm.cell} px cells) · "
                    f"ARR layer `{layer_name}`.")
        for notice in notices:
            gr.Markdown(f"> ⚠️ **{notice}**", elem_classes="notice")

        with gr.Tab("Compare"):
            with gr.Row():
                with gr.Column(scale=1):
                    c_image, c_question = image_and_question("compare")
                    with gr.Row():
                        c_baseline = gr.Dropdown(list(BASELINES), value="full", label="Baseline")
                        c_strategy = strategy_dropdown()
                    c_tokens = tokens_slider()
                    c_cells = cells_slider()
                    c_numbered = numbered_slider()
                    with gr.Row():
                        c_run = gr.Button("Compare", variant="primary", elem_id="compare-run")
                        c_stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
                    c_status = gr.Markdown(label="Status", elem_id="compare-status")
                with gr.Column(scale=2):
                    with gr.Row():
                        with gr.Column():
                            c_base_text = gr.Textbox(label="Baseline answer", lines=3, elem_id="baseline-answer")
                            c_base_stats = output_table("Baseline stats", ui.STATS_HEADERS, "baseline-stats")
                        with gr.Column():
                            c_arr_text = gr.Textbox(label="ARR-COC answer", lines=3, elem_id="arr-answer")
                            c_arr_stats = output_table("ARR-COC stats", ui.STATS_HEADERS, "arr-stats")
                    c_heatmap = output_image("Relevance and numbered saccades (1 = most relevant)", "arr-heatmap")
                    with gr.Row():
                        c_gestalt = output_image("Gestalt view, as the model saw it")
                        c_mosaic = output_image("saccade mosaic (what the LLM read at full detail)", "arr-mosaic")
                    c_weights = output_image("Balancer weights")
            c_answer = gr.State(time_to_live=3600)  # the last ARR answer, for redrawing; freed an hour after
            gr.Examples(EXAMPLES, inputs=[c_image, c_question], examples_per_page=len(EXAMPLES))

        with gr.Tab("Microscope"):
            with gr.Row():
                with gr.Column(scale=1):
                    m_image, m_question = image_and_question("microscope")
                    m_run = gr.Button("Analyse", variant="primary")
                    m_strategy = strategy_dropdown()
                    m_budget = gr.Slider(1, 4 * pipeline.gestalt_max_tokens, value=config.budget, step=1,
                                         label="Saccade budget (re-selects instantly)")
                    m_numbered = numbered_slider()
                    m_cells = cells_slider()
                    m_summary = gr.Markdown(label="Selection")
                with gr.Column(scale=2):
                    m_heatmap = output_image("Relevance and numbered saccades")
                    m_mosaic = output_image("saccade mosaic (what the LLM read at full detail)")
                    with gr.Accordion("Saccade list", open=False):
                        m_saccades = output_table("Saccades", ui.SACCADE_HEADERS)
                    with gr.Accordion("Faithfulness: does the answer depend on these saccades?", open=False):
                        gr.Markdown("The answer's log-likelihood as the saccades are removed most relevant first "
                                    "(deletion), in a random order, and added back in rank order (insertion).")
                        with gr.Row():
                            m_answer = gr.Textbox(label="Answer to score (empty: ARR's own answer)", scale=3)
                            m_faithfulness = gr.Button("Measure (~30 forward passes)", scale=1,
                                                       elem_id="faithfulness-run")
                        m_curves = output_image("Faithfulness curves", "faithfulness-plot")
                        m_faithfulness_summary = gr.Markdown(elem_id="faithfulness-summary")
            m_scorers = output_image("Scorer maps, participatory prior and balanced relevance")
            m_channels = output_image("The 13 texture channels (all on a 0..1 scale)")
            gr.Markdown(ui.channels_markdown())
            m_scene = gr.State(time_to_live=3600)  # holds the image and maps: freed an hour after the last update
            gr.Examples(EXAMPLES, inputs=[m_image, m_question], examples_per_page=len(EXAMPLES))

        with gr.Tab("Checkpoint A/B"):
            choices = ui.checkpoint_choices(CHECKPOINTS)
            with gr.Row():
                with gr.Column(scale=1):
                    ab_image, ab_question = image_and_question("ab")
                    with gr.Row():
                        with gr.Column():
                            ab_choice_a = gr.Dropdown(choices, value=ui.PRIOR, label="Checkpoint A")
                            ab_files_a = gr.File(file_count="multiple", file_types=[".json", ".safetensors"],
                                                 label="…or upload A: config.json + model.safetensors")
                        with gr.Column():
                            ab_choice_b = gr.Dropdown(choices, value=layer_name, label="Checkpoint B")
                            ab_files_b = gr.File(file_count="multiple", file_types=[".json", ".safetensors"],
                                                 label="…or upload B: config.json + model.safetensors")
                    ab_strategy = strategy_dropdown()
                    ab_tokens = tokens_slider()
                    ab_cells = cells_slider()
                    with gr.Row():
                        ab_run = gr.Button("Compare checkpoints", variant="primary")
                        ab_stop = gr.Button("Stop", variant="stop", elem_id="ab-stop")
                    ab_summary = gr.Markdown(label="Agreement")
                with gr.Column(scale=2):
                    with gr.Row():
                        with gr.Column():
                            ab_heat_a = output_image("A: relevance and saccades")
                            ab_text_a = gr.Textbox(label="A's answer", lines=2)
                        with gr.Column():
                            ab_heat_b = output_image("B: relevance and saccades")
                            ab_text_b = gr.Textbox(label="B's answer", lines=2)
                    ab_diff = output_image("Difference B − A")
            gr.Examples(EXAMPLES, inputs=[ab_image, ab_question], examples_per_page=len(EXAMPLES))

        # --------------------------------------------------------------------- wiring

        compare_event = gr.on(
            [c_run.click, c_question.submit], compare,
            [c_image, c_question, c_baseline, c_tokens, c_strategy, c_cells, c_numbered],
            [c_status, c_base_text, c_base_stats, c_arr_text, c_arr_stats, c_heatmap, c_gestalt, c_weights,
             c_mosaic, c_answer],
            api_name="compare", concurrency_id=GPU)
        c_stop.click(None, cancels=[compare_event])  # frees the GPU queue for the next request
        c_numbered.release(redraw, [c_answer, c_numbered], [c_heatmap, c_mosaic], api_name="redraw")
        m_run.click(microscope, [m_image, m_question, m_strategy, m_budget, m_cells, m_numbered],
                    [m_scene, m_channels, m_scorers, m_heatmap, m_summary, m_saccades, m_mosaic],
                    api_name="microscope", concurrency_id=GPU)
        m_faithfulness.click(faithfulness, [m_image, m_question, m_answer, m_strategy, m_budget, m_cells],
                             [m_curves, m_faithfulness_summary], api_name="faithfulness", concurrency_id=GPU)
        gr.on([m_strategy.change, m_budget.release, m_numbered.release], reselect,
              [m_scene, m_strategy, m_budget, m_numbered], [m_heatmap, m_summary, m_saccades, m_mosaic],
              api_name="reselect")
        ab_event = ab_run.click(
            ab, [ab_image, ab_question, ab_choice_a, ab_files_a, ab_choice_b, ab_files_b, ab_strategy, ab_tokens,
                 ab_cells],
            [ab_heat_a, ab_heat_b, ab_diff, ab_text_a, ab_text_b, ab_summary], api_name="ab", concurrency_id=GPU)
        ab_stop.click(None, cancels=[ab_event])
    return demo


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="ARR-COC microscope: the Gradio app.")
    p.add_argument("--model", default=os.environ.get("ARR_COC_MODEL", DEFAULT_MODEL),
                   help="Qwen2-VL, Qwen2.5-VL or Qwen3-VL hub id or folder, or an offline tiny model ('tiny', "
                        "'tiny-qwen2.5-vl', 'tiny-qwen3-vl'); one that cannot be loaded falls back to tiny with a "
                        "banner (default: $ARR_COC_MODEL or %(default)s)")
    p.add_argument("--checkpoint", default=None,
                   help="ARR checkpoint: a name under checkpoints/, a folder or a hub repo id (default: the first "
                        "checkpoint under checkpoints/ that fits the model, else the untrained prior)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)),
                   help="port to serve on (default: $GRADIO_SERVER_PORT or 7860)")
    p.add_argument("--share", action="store_true",
                   help="also serve on a public gradio.live link (off by default: anyone with it can use your GPU)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    model = ARRCOCQwen.from_pretrained(args.model, fallback_to_tiny=True)
    layer_name, checkpoint_notice = ui.install_default_layer(model, args.checkpoint, CHECKPOINTS)
    notices = [n for n in (model.notice, checkpoint_notice) if n]
    if model.vlm.device.type == "cuda":  # capture the CUDA graphs now, not on the first user's request
        print("warming up: capturing CUDA graphs for every pipeline ...", flush=True)
        print(f"warmed up in {model.warmup():.1f} s", flush=True)
    demo = build_app(model, layer_name, notices)
    demo.queue(default_concurrency_limit=1)
    # show_error: an error raised outside our events (in gradio's own input processing) still tells its reason
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), server_port=args.port,
                share=args.share, show_error=True)


if __name__ == "__main__":
    main()
