"""
The app's event handlers (arr_coc/app/handlers.py) called directly, without a server: what each returns, the
per-user state they keep (CPU only), the status line after a failure or Stop, the console's one line per
user error, and the answer box of the faithfulness curves.

    .venv/bin/python -m pytest tests/app/test_handlers.py -q
"""

import dataclasses
import logging
import threading
import time
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc import viz
from arr_coc.app import handlers, options, ui
from arr_coc.eval.faithfulness import MAX_ANSWER_CHARS
from arr_coc.model import Answer, ARRCOCQwen, Observation, Scene
from arr_coc.pipelines import REDUCERS
from arr_coc.relevance.config import TensionSettings
from arr_coc.relevance.layer import ScoreMaps
from arr_coc.vlm.views import Views

ROOT = Path(__file__).resolve().parents[2]
CAT = Image.open(ROOT / "assets" / "chelsea.png").resize((902, 600))  # 21x32 native cells (tiny) > 247 + 273: ARR
# chooses saccades (the 451x300 photo's 176 cells it reads whole, as full does: test_reads_whole.py)
QUESTION = "What colour are the cat's eyes?"
CELLS = 4096


def holds_only_cpu_data(value, path="state") -> list[str]:
    """Where a state value holds a GPU tensor or a model-side object (Answer, Scene, Observation, Views)."""
    if isinstance(value, torch.Tensor):
        return [] if value.device.type == "cpu" else [f"{path}: tensor on {value.device}"]
    if isinstance(value, (Answer, Scene, Observation, Views)):
        return [f"{path}: a {type(value).__name__} (it holds device tensors)"]
    if dataclasses.is_dataclass(value):
        return [p for f in dataclasses.fields(value)
                for p in holds_only_cpu_data(getattr(value, f.name), f"{path}.{f.name}")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in holds_only_cpu_data(v, f"{path}[{k!r}]")]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in holds_only_cpu_data(v, f"{path}[{i}]")]
    return []


def test_compare_streams_then_keeps_only_cpu_data(arr_model):
    updates = list(handlers.compare(arr_model, CAT, QUESTION, "gestalt", 2, "topk", CELLS, 5))
    statuses = [u[0] for u in updates]
    assert statuses[0] == "Running the **gestalt** baseline…" and "Running **ARR-COC**…" in statuses
    assert statuses[-1].startswith("Done in")
    kept = updates[-1][-1]
    assert isinstance(kept, handlers.Kept) and holds_only_cpu_data(kept) == []
    heatmap, mosaic = handlers.redraw(kept, 0)  # renumbered from the kept state alone
    assert heatmap.size == updates[-1][5].size  # unnumbered, the mosaic loses the 26 px band its first row's 5
    assert mosaic.size == (updates[-1][8].width, updates[-1][8].height - 26)  # numbers had (17 tiles a row)
    assert updates[-1][9] is None  # a stock view keeps every cell: no kept-cell drawing


def making_views(monkeypatch) -> list:
    """Every make_views call the pipelines and ARRCOCQwen.views make from now on (through steps.views_of), recorded."""
    from arr_coc.pipelines import steps as answer_module

    made, make = [], answer_module.make_views
    monkeypatch.setattr(answer_module, "make_views", lambda *args: made.append(args) or make(*args))
    return made


@pytest.mark.parametrize("baseline, mode", [("budget", "RGB"), ("divprune", "RGBA")])
def test_compare_makes_the_views_once_for_both_pipelines(arr_model, monkeypatch, baseline, mode):
    """One Compare request reads one image with two pipelines: its views (the upload, every resized view) are made
    once, an RGBA upload's too, and each answer is the one a plain request of its own gives."""
    from arr_coc.app import ui

    image = CAT.convert(mode)
    made = making_views(monkeypatch)
    final = list(handlers.compare(arr_model, image, QUESTION, baseline, 2, "topk", CELLS, 5))[-1]
    assert len(made) == 1
    base = arr_model.answer(image, QUESTION, baseline, max_new_tokens=2, max_cells=CELLS)
    ours = arr_model.answer(image, QUESTION, "arr", max_new_tokens=2, max_cells=CELLS, strategy="topk")
    assert (final[1], final[3]) == (ui.answer_text(base), ui.answer_text(ours))
    assert torch.equal(final[-1].positions, ours.arr.in_order("relevance").positions[0].cpu())


def test_a_conversations_first_turn_makes_the_views_once_for_both_pipelines(arr_model, monkeypatch):
    made = making_views(monkeypatch)
    chat, *_ = handlers.converse(arr_model, None, CAT.convert("RGBA"), QUESTION, "full", 2, 30, False, 5)
    assert len(made) == 1
    handlers.converse(arr_model, chat, CAT.convert("RGBA"), "And its nose?", "full", 2, 30, False, 5)
    assert len(made) == 1  # a follow-up reads turn 1's views


def test_compare_draws_the_cells_a_reducer_kept_under_its_answer(arr_model):
    """Under a reducer's answer, its kept cells on the heatmap's canvas (ARR's saccades beside it); another
    reducer keeps other cells, and its drawing differs."""
    drawings = {}
    for reducer in ("divprune", "visionzip"):
        final = list(handlers.compare(arr_model, CAT, QUESTION, reducer, 1, "topk", CELLS, 5))[-1]
        drawings[reducer] = final[9]
        assert final[9].width == final[5].width  # the same canvas as ARR's heatmap, a legend underneath
    assert not np.array_equal(np.asarray(drawings["divprune"]), np.asarray(drawings["visionzip"]))


def test_compare_with_a_second_look_shows_both_looks_and_draws_them_in_two_colours(arr_model):
    """The tau slider: at 1 the second look fires (no answer is certain); the stats show both looks' saccades,
    times, confidences and answers, the kept state its cells, the heatmap them in green; at 0 it is off."""
    from arr_coc import viz

    on = list(handlers.compare(arr_model, CAT, QUESTION, "gestalt", 2, "topk", CELLS, 5, 1.0))[-1]
    off = list(handlers.compare(arr_model, CAT, QUESTION, "gestalt", 2, "topk", CELLS, 5, 0.0))[-1]
    stats = dict(on[4])
    assert stats["second look"].startswith("fired: confidence") and stats["look 1: saccades"] == 273
    assert stats["look 2: saccades"] == 136 and stats["visual tokens: saccade"] == 273 + 136
    assert stats["look 2: total ms"] > 0 and "look 2: answer" in stats and "look 1: confidence" in stats
    kept = on[-1]
    assert kept.second.shape == (136, 2) and holds_only_cpu_data(kept) == []
    assert not {tuple(c) for c in kept.second.tolist()} & {tuple(c) for c in kept.positions.tolist()}
    assert on[5].height > off[5].height  # the legend of the two colours
    r, c = kept.second[0].tolist()
    x0, y0, x1, y1 = viz.cell_rect(r, c, kept.grid, off[5].size)
    assert on[5].getpixel((x0, (y0 + y1) // 2)) == viz.SECOND_LOOK
    assert "second look" not in dict(off[4]) and off[-1].second is None
    assert stats["second look guided by"] == "prior"
    guided = list(handlers.compare(arr_model, CAT, QUESTION, "gestalt", 2, "topk", CELLS, 5, 1.0, "attention"))[-1]
    guided = dict(guided[4])
    assert guided["second look guided by"] == "attention" and guided["look 2: saccades"] == 136


def test_compare_runs_the_fastv_baseline(arr_model):
    """The Compare tab's baseline choices are the registry's baselines, FastV among them."""
    from arr_coc.pipelines import BASELINES

    updates = list(handlers.compare(arr_model, CAT, QUESTION, "fastv", 2, "topk", CELLS, 5))
    assert "fastv" in BASELINES and updates[0][0] == "Running the **fastv** baseline…"
    assert updates[-1][0].startswith("Done in")


def test_the_microscope_draws_any_reducers_kept_cells_over_arrs_relevance(arr_model):
    kept = handlers.microscope(arr_model, CAT, QUESTION, "topk", 60, CELLS, 5)[0]
    assert handlers.kept_cells(arr_model, kept, CAT, QUESTION, options.NO_REDUCER, 60, CELLS) is None
    drawings = [handlers.kept_cells(arr_model, kept, CAT, QUESTION, reducer, 60, CELLS) for reducer in REDUCERS]
    heat = np.asarray(viz.heat_canvas(kept.image, kept.relevance))  # ARR's relevance over the image, no boxes
    for i, drawing in enumerate(drawings):
        canvas = np.asarray(drawing)[:heat.shape[0]]  # the drawing above its legend
        assert canvas.shape == heat.shape and not np.array_equal(canvas, heat)
        assert (canvas == heat).mean() > 0.5  # boxes over the map: most of it shows through
        assert all(not np.array_equal(np.asarray(drawing), np.asarray(other)) for other in drawings[i + 1:])
    with pytest.raises(gr.Error, match="Analyse an image first"):
        handlers.kept_cells(arr_model, None, CAT, QUESTION, "divprune", 60, CELLS)


def test_a_reducer_drawing_that_runs_out_of_memory_tells_the_user(arr_model, monkeypatch):
    """Out of memory while the reducer runs: a message on the page (gr.Error), not a raw traceback."""
    from arr_coc.errors import OutOfMemory

    kept = handlers.microscope(arr_model, CAT, QUESTION, "topk", 60, CELLS, 5)[0]

    def out_of_memory(*args, **kwargs):
        raise OutOfMemory("CUDA ran out of memory running divprune; the memory was freed")

    monkeypatch.setattr(arr_model, "answer", out_of_memory)
    with pytest.raises(gr.Error, match="ran out of memory"):
        handlers.kept_cells(arr_model, kept, CAT, QUESTION, "divprune", 60, CELLS)


def test_under_the_adaptive_budget_the_reducer_keeps_as_many_tokens_as_arr_reads(arr_model, monkeypatch):
    """The Tensions' auto switch on (f overridden to 0.2): the reducer's kept cells are ARR's gestalt + its adaptive
    K for this image and question, whatever the budget slider says."""
    cat = CAT.resize((CAT.width * 3, CAT.height * 3))  # a native view with more tokens than ARR reads
    kept = handlers.microscope(arr_model, cat, QUESTION, "topk", 60, CELLS, 5)[0]
    answers, answer = [], arr_model.answer
    monkeypatch.setattr(arr_model, "answer", lambda *a, **k: answers.append(answer(*a, **k)) or answers[-1])
    handlers.kept_cells(arr_model, kept, cat, QUESTION, "divprune", 60, CELLS, True, True, 0.0, 0.0, 0.2)
    ours = answer(cat, QUESTION, "arr", max_new_tokens=1, budget="auto", max_cells=CELLS,
                  tensions=TensionSettings(explore=0.0, diversify=0.0, particularize=0.2))
    assert ours.arr.auto_budget and ours.arr.budgets[0] != 60
    assert len(answers[0].kept) == ours.tokens.total_visual == len(ours.observation.gestalt) + ours.arr.budgets[0]


def test_state_check_finds_device_objects(arr_model):
    """The check above can fail: an Answer (the old state) holds device tensors through its views."""
    answer = arr_model.answer(CAT, QUESTION, "arr", max_new_tokens=1)
    assert holds_only_cpu_data(answer) != []


def test_a_failure_says_so_in_the_status_line(arr_model, caplog):
    with caplog.at_level(logging.INFO, logger="arr_coc.app"):
        steps = handlers.compare(arr_model, CAT, "   ", "gestalt", 2, "topk", CELLS, 5)
        failed = next(steps)
        with pytest.raises(gr.Error) as error:
            next(steps)
    assert failed[0] == "**Failed**: the question is empty: type a question about the image"
    assert all(isinstance(v, dict) and v.get("__type__") == "update" for v in failed[1:])  # the rest stay as shown
    assert "the question is empty" in error.value.message and not error.value.print_exception
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("WARNING", None)]  # one line, no traceback


def test_a_bug_mid_stream_says_failed_and_logs_its_traceback(arr_model, monkeypatch, caplog):
    stream = arr_model.stream

    def breaks_in_arr(image, question, pipeline, **kwargs):
        if pipeline == "arr":
            raise KeyError("lost")
        yield from stream(image, question, pipeline, **kwargs)

    monkeypatch.setattr(arr_model, "stream", breaks_in_arr)
    with caplog.at_level(logging.INFO, logger="arr_coc.app"), pytest.raises(gr.Error):
        updates = []
        for update in handlers.compare(arr_model, CAT, QUESTION, "gestalt", 2, "topk", CELLS, 5):
            updates.append(update)
    assert updates[-2][0] == "Running **ARR-COC**…"
    assert updates[-1][0].startswith("**Failed**: Unexpected error (KeyError: 'lost')")
    (record,) = caplog.records
    assert record.levelname == "ERROR" and record.exc_info is not None  # a bug keeps its traceback


@pytest.mark.parametrize("status, after", [
    ("Running the **full** baseline…", "**Stopped** by you (the **full** baseline was running)."),
    ("Running **ARR-COC**…", "**Stopped** by you (**ARR-COC** was running)."),
    ("Running checkpoint **B**…", "**Stopped** by you (checkpoint **B** was running)."),
    ("Done in 3.2 s.", "Done in 3.2 s."),  # Stop after the end changes nothing
    (None, None),
])
def test_stop_says_what_was_stopped(status, after):
    assert handlers.stopped(status) == after


def test_an_examples_file_path_is_read_as_the_upload_it_stands_for(arr_model, upload_folder):
    """An update of the image box re-creates the session's gr.Image from its constructor arguments, and the copy
    hands the handlers a file path in gradio's cache (gradio's own "filepath" preprocess; a click on an example
    did, before app.examples loaded them around the box): each handler reads it as an upload, with the same
    answers and selection as the image itself, and refuses a path to no image in the upload's one line, and the
    example's own file outside the cache as any path outside it (ui.cached_file)."""
    tmp_path = upload_folder
    CAT.save(upload_folder / "chelsea.png")  # the test's cat, as an upload in gradio's cache
    path = str(upload_folder / "chelsea.png")
    by_path, by_image = (list(handlers.compare(arr_model, image, QUESTION, "gestalt", 2, "topk", CELLS, 5))[-1]
                         for image in (path, CAT))
    assert by_path[0].startswith("Done in") and (by_path[1], by_path[3]) == (by_image[1], by_image[3])
    assert handlers.microscope(arr_model, path, QUESTION, "topk", 273, CELLS, 5)[5] == \
        handlers.microscope(arr_model, CAT, QUESTION, "topk", 273, CELLS, 5)[5]  # the saccade list
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    steps = handlers.compare(arr_model, str(notes), QUESTION, "gestalt", 2, "topk", CELLS, 5)
    failed = next(steps)
    with pytest.raises(gr.Error):
        next(steps)
    assert failed[0].startswith("**Failed**: notes.txt is not an image") and str(tmp_path) not in failed[0]
    steps = handlers.compare(arr_model, str(ROOT / "assets" / "chelsea.png"), QUESTION, "gestalt", 2, "topk", CELLS, 5)
    assert next(steps)[0] == f"**Failed**: {ui.NOT_UPLOADED}"


def test_microscope_keeps_cpu_maps_and_reselects_from_them(arr_model):
    kept, channels, scorers, heatmap, summary, saccades, mosaic = handlers.microscope(
        arr_model, CAT, QUESTION, "topk", 273, CELLS, 5)
    assert holds_only_cpu_data(kept) == [] and isinstance(kept.maps, ScoreMaps)
    assert summary.startswith("**273 saccades**") and len(saccades) == 273
    heatmap, summary, fewer, mosaic = handlers.reselect(arr_model, kept, "topk", 50, 5)
    assert summary.startswith("**50 saccades**") and [r[:4] for r in fewer] == [r[:4] for r in saccades[:50]]
    assert sorted(r[4] for r in fewer) == list(range(1, 51))  # fed row by row: each its place among the 50
    _, summary, spread, _ = handlers.reselect(arr_model, kept, "grid", 50, 5)
    assert "strategy `grid`" in summary and spread != fewer


def test_a_session_keeps_its_image_at_the_size_its_drawings_use(arr_model):
    """Compare's and the Microscope's state hold the image shrunk to the drawings' canvas (at most viz.MAX_SIDE a
    side), not the upload (5 sessions of a 62-megapixel image held 1.3 GB for an hour), and redraw the same pixels."""
    big = CAT.convert("RGB").resize((4510, 3000))  # 13.5 megapixels
    canvas = viz.canvas_size(*big.size)
    assert max(canvas) == viz.MAX_SIDE
    compared = list(handlers.compare(arr_model, big, QUESTION, "gestalt", 1, "topk", CELLS, 5))[-1][-1]
    analysed = handlers.microscope(arr_model, big, QUESTION, "topk", 50, CELLS, 5)[0]
    for kept in (compared, analysed):
        assert kept.image.size == canvas
        kept = dataclasses.replace(kept, positions=torch.tensor([[0, 0], [3, 5], [7, 2]]))
        as_kept, as_uploaded = handlers.redraw(kept, 2), handlers.redraw(dataclasses.replace(kept, image=big), 2)
        assert np.array_equal(np.asarray(as_kept[0]), np.asarray(as_uploaded[0]))  # the heatmap, pixel for pixel
    small = handlers.microscope(arr_model, CAT, QUESTION, "topk", 50, CELLS, 5)[0]
    assert small.image.size == CAT.size  # one smaller than its canvas is kept as it is (drawn upscaled)


def test_the_microscope_shows_the_tensions_and_the_sliders_override_them(arr_model):
    kept, _, _, _, summary, saccades, _ = handlers.microscope(arr_model, CAT, QUESTION, "topk", 273, CELLS, 5)
    assert ("**Tensions** (set by the balancer) · explore e = 0.00 · diversify λ = 0.00 · K = 273 (fixed)"
            in summary)
    _, summary, explored, _ = handlers.reselect(arr_model, kept, "topk", 273, 5, False, True, 0.25, 0.0, 0.5)
    assert "(the sliders) · explore e = 0.25 · diversify λ = 0.00 · K = 273 (fixed)" in summary
    assert len(explored) == 273 and explored != saccades  # a quarter of them now cover the rest of the image
    _, summary, adaptive, _ = handlers.reselect(arr_model, kept, "topk", 273, 5, True, False, 0.0, 0.0, 0.5)
    K = len(adaptive)
    assert f"**{K} saccades**" in summary and f"K = {K} (adaptive, f = " in summary and 64 <= K <= 512
    _, summary, most, _ = handlers.reselect(arr_model, kept, "topk", 273, 5, True, True, 0.0, 0.0, 1.0)
    assert len(most) == 512 and "K = 512 (adaptive, f = 1.00)" in summary  # f = 1: the ceiling


@pytest.mark.parametrize("ablation", ["no-gestalt", "raster", "fixed-weights"])
def test_the_microscope_analyses_under_an_ablation_and_reselects_under_it(arr_model, ablation):
    kept, _, _, _, summary, rows, _ = handlers.microscope(arr_model, CAT, QUESTION, "topk", 273, CELLS, 5, ablation)
    extra = kept.gestalt_tokens if ablation == "no-gestalt" else 0  # no gestalt: its tokens become saccades
    assert kept.ablation.name == ablation and kept.gestalt_tokens > 0
    assert summary.startswith(f"**{273 + extra} saccades**") and len(rows) == 273 + extra
    assert f"ablation: {kept.ablation.description}" in summary
    _, summary, fewer, _ = handlers.reselect(arr_model, kept, "topk", 50, 5)
    assert summary.startswith(f"**{50 + extra} saccades**") and "ablation" in summary
    if ablation == "raster":  # the same cells fed raster-sorted, still listed most relevant first
        fed = [(row[1], row[2]) for row in sorted(fewer, key=lambda row: row[4])]
        assert fed == sorted(fed) and [row[3] for row in fewer] == sorted((row[3] for row in fewer), reverse=True)
    if ablation == "fixed-weights":
        assert torch.equal(kept.maps.weights, torch.tensor([[0.2, 0.2, 0.6]]))
    with pytest.raises(gr.Error, match="unknown ablation 'nope'"):
        handlers.microscope(arr_model, CAT, QUESTION, "topk", 273, CELLS, 5, "nope")


def test_reselect_before_analysing_is_a_user_error(arr_model, caplog):
    with caplog.at_level(logging.INFO, logger="arr_coc.app"), pytest.raises(gr.Error, match="Analyse an image first"):
        handlers.reselect(arr_model, None, "topk", 50, 5)
    assert [r.getMessage() for r in caplog.records] == [
        "user error: Analyse an image first: re-selection reuses its maps."]


def test_faithfulness_scores_an_answer_with_special_tokens_as_plain_text(arr_model):
    chart, summary = handlers.faithfulness(arr_model, CAT, QUESTION, "<|image_pad|> green <|im_end|>", "topk", 20,
                                           CELLS, progress=lambda *a, **k: None)
    assert "Answer scored: **'<|image_pad|> green <|im_end|>'**" in summary and chart.width > 300


def test_faithfulness_refuses_a_long_answer_before_any_vlm_work(arr_model, monkeypatch):
    monkeypatch.setattr(arr_model, "answer", lambda *a, **k: pytest.fail("the VLM ran"))
    with pytest.raises(gr.Error, match=f"the limit is {MAX_ANSWER_CHARS}"):
        handlers.faithfulness(arr_model, CAT, QUESTION, "x" * (MAX_ANSWER_CHARS + 1), "topk", 20, CELLS,
                              progress=lambda *a, **k: None)


def test_a_slow_generation_yields_each_token_and_stops_when_closed(arr_model, monkeypatch):
    """The model's stream yields after the vision and at each token as the engine makes it, in the caller's thread
    (no second thread), so gradio can close the handler there (Stop); closing it closes the engine at that token
    (no later token is made), and the model is free once close returns."""
    from arr_coc.vlm.base import Generation

    made, threads, closed = [], set(), []

    def slow(inputs, max_new_tokens, min_new_tokens=None, prune=None, keep=False, watch=None):  # generate_tokens'
        try:
            for t in (100, 101, 102):
                time.sleep(0.3)  # a long step
                threads.add(threading.current_thread())
                made.append(t)
                yield t
        finally:
            closed.append(True)
        return Generation(torch.tensor([[100, 101, 102]]))

    monkeypatch.setattr(arr_model.vlm, "generate_tokens", slow)
    stream = arr_model.stream(CAT, QUESTION, "gestalt", max_new_tokens=3)
    assert next(stream) == ""  # the vision is done: a tick before the engine starts
    next(stream)  # the first token's text
    assert made == [100] and arr_model.busy()  # the request holds the model between two tokens
    stream.close()  # Stop
    assert made == [100] and closed == [True] and threads == {threading.current_thread()}
    assert not arr_model.busy()


def test_the_kept_cells_panel_shows_only_for_a_reducer():
    """Stock views and "none" keep every cell: their drawing panel stays hidden instead of an empty frame."""
    from arr_coc.app.handlers import show_kept_cells
    from arr_coc.app.options import NO_REDUCER

    assert [show_kept_cells(name)["visible"] for name in ("divprune", "visionzip", "fastv")] == [True] * 3
    assert [show_kept_cells(name)["visible"] for name in ("full", "gestalt", "budget", NO_REDUCER)] == [False] * 4


# ----------------------------------------------------------------------------- numbering, weights, overlap and Stop


@pytest.fixture
def raster(arr_model):
    """The tiny model with a layer that feeds its saccades in raster order, as pocket-fineprint does."""
    model = ARRCOCQwen(arr_model.vlm)
    model.layer.config.saccade_order = "raster"
    return model


def rank_one_ringed(drawing: Image.Image, cell: tuple[int, int], grid: tuple[int, int]) -> bool:
    """Whether the cell wears rank 1's white ring (viz.draw_saccades), where its number "1" is drawn: most of the
    pixels just left of its box (right of it, on the canvas's left edge) are white."""
    mapped = (drawing.width, drawing.height - viz.key_geometry(drawing.width)[1])  # the map above its key's strip
    x0, y0, x1, y1 = viz.cell_rect(*cell, grid, mapped)
    column = np.asarray(drawing)[y0:y1 + 1, x0 - 1 if x0 > 0 else x1 + 1]
    return (column == 255).all(-1).mean() > 0.5


def test_compare_numbers_a_raster_fed_selection_most_relevant_first(raster):
    """Item 1: a checkpoint that feeds its saccades row by row; the heatmap's "1" (its white ring) and the kept
    saccades go to the highest-scoring cell, then down the scores, not along the top rows."""
    final = list(handlers.compare(raster, CAT, QUESTION, "gestalt", 1, "topk", CELLS, 5))[-1]
    heatmap, kept = final[5], final[-1]
    cells = [tuple(c) for c in kept.positions.tolist()]
    scores = [float(kept.relevance[r, c]) for r, c in cells]
    assert scores == sorted(scores, reverse=True)  # most relevant first...
    assert cells != sorted(cells)  # ...which is not the raster order they were fed in
    assert rank_one_ringed(heatmap, cells[0], kept.grid) and not rank_one_ringed(heatmap, min(cells), kept.grid)


def test_the_microscope_lists_and_numbers_a_raster_fed_selection_by_relevance(raster):
    """Item 1: the saccade list's rank is relevance (its "fed" column the raster order the LLM reads), and the
    heatmap's "1" sits on the highest-scoring cell, after Analyse and after a re-selection."""
    kept, _, _, heatmap, summary, rows, _ = handlers.microscope(raster, CAT, QUESTION, "topk", 50, CELLS, 5)
    reselected, _, fewer, _ = handlers.reselect(raster, kept, "topk", 20, 5)
    assert "fed in raster order" in summary
    for drawing, listed in ((heatmap, rows), (reselected, fewer)):
        scores = [row[3] for row in listed]
        assert [row[0] for row in listed] == list(range(1, len(listed) + 1)) and scores == sorted(scores, reverse=True)
        fed = [(row[1], row[2]) for row in sorted(listed, key=lambda row: row[4])]
        assert fed == sorted(fed) and fed != [(row[1], row[2]) for row in listed]
        assert rank_one_ringed(drawing, (listed[0][1], listed[0][2]), kept.grid)
        assert not rank_one_ringed(drawing, fed[0], kept.grid)


def test_the_weights_chart_shows_each_scorers_share_of_the_saccades(arr_model):
    """Item 2: beside the balancer weights, each scorer map's share of the selected saccades' relevance (they
    sum to 1): what tells the scorers apart when the weights are all 1.00, as on the pocket checkpoint."""
    answer = arr_model.answer(CAT, QUESTION, "arr", max_new_tokens=1)
    out = dataclasses.replace(answer.arr, weights=torch.ones(1, 3))  # a balancer that says nothing
    shares = out.shares()[0]
    standard = torch.stack([out.information, out.perspectival, out.participatory], 1)[0].flatten(1)  # [3, N]
    standard = (standard - standard.mean(1, keepdim=True)) / standard.std(1, unbiased=False, keepdim=True)
    lift = standard[:, out.indices[0]].mean(1)  # each map's mean over the saccades: what lifted them
    torch.testing.assert_close(shares, lift / lift.sum())
    assert float(shares.sum()) == pytest.approx(1.0) and float(shares.max() - shares.min()) > 0.05
    info = out.information  # [1, gh, gw]
    one_map = dataclasses.replace(out, scorers=torch.stack([info, info, 2 * info + 1], 1))  # [1, 3, gh, gw]
    assert float(one_map.agreement()[0]) == pytest.approx(1.0, abs=1e-4) and float(out.agreement()[0]) < 0.99
    final = list(handlers.compare(arr_model, CAT, QUESTION, "gestalt", 1, "topk", CELLS, 5))[-1]
    assert final[7].width > viz.weights_bar(answer.arr.weights[0]).width  # the shares' chart beside the weights'


@pytest.fixture(scope="module")
def pocket():
    """The offline pocket model with its default checkpoint, as `python app.py` serves it offline."""
    from arr_coc.app import ui

    model = ARRCOCQwen.from_pretrained("pocket", device="cpu", dtype=torch.float32)
    ui.install_default_layer(model, None, ROOT / "checkpoints")
    return model


def test_two_overlapping_requests_on_the_pocket_model_answer_as_each_alone(pocket):
    """Item 12: two requests at once (two users, or a new one while a stopped one winds down) take turns on the
    model: each answer equals its lone answer (overlapping, they once shared a decode cache: "7878" became "7")."""
    requests = [(Image.open(ROOT / "assets" / "pocket_fine_print.png"), "What is the value of WIDTH?"),
                (Image.open(ROOT / "assets" / "pocket_box_word.png"), "What word is in the blue box?")]
    lone = [pocket.answer(image, question, "arr", max_new_tokens=16).text for image, question in requests]
    for _ in range(6):  # an overlap corrupts one run in a few, not every one
        together, start = [None, None], threading.Barrier(2)

        def ask(i):
            start.wait()
            together[i] = pocket.answer(*requests[i], "arr", max_new_tokens=16).text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert together == lone


def test_stop_ends_the_generation_at_once_and_frees_the_model(arr_model, monkeypatch):
    """Item 12: Stop (gradio closes the event's generator) ends the decode loop within a token or two, instead of
    letting the 256 tokens run out while the next request starts beside it."""
    decoder, steps = arr_model.vlm.decoder, []
    step = decoder._decode_step
    monkeypatch.setattr(decoder, "_decode_step", lambda cap: steps.append(cap) or step(cap))
    updates = handlers.compare(arr_model, CAT, QUESTION, "gestalt", 256, "topk", CELLS, 5)
    for _ in updates:  # ticks while the baseline decodes
        if len(steps) >= 3:
            break
    updates.close()  # Stop
    assert arr_model.lock.acquire(timeout=30)  # the stopped request let go of the model
    arr_model.lock.release()
    stopped = len(steps)
    time.sleep(1.0)
    assert len(steps) == stopped < 50  # no decode step after the stop; far from the 255 it would have run



def tensors_off_the_cpu(value, path="state", seen=None) -> list[str]:
    """Where a state value (dataclasses, lists, dicts, all the way down) holds a tensor that is not on the CPU."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [] if value.device.type == "cpu" else [f"{path}: tensor on {value.device}"]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [p for f in dataclasses.fields(value)
                for p in tensors_off_the_cpu(getattr(value, f.name), f"{path}.{f.name}", seen)]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in tensors_off_the_cpu(v, f"{path}[{k!r}]", seen)]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in tensors_off_the_cpu(v, f"{path}[{i}]", seen)]
    return []


def test_a_conversation_turn_keeps_cpu_data_and_a_failed_one_leaves_it_as_it_was(arr_model, monkeypatch):
    chat, status, rows, heatmap, moved = handlers.converse(arr_model, None, CAT, QUESTION, "full", 2, 30, False, 5)
    chat, status, rows, heatmap, moved = handlers.converse(arr_model, chat, CAT, "And its nose?", "full", 2, 30,
                                                           False, 5)
    assert [r[0] for r in rows] == [1, 2] and moved is not None and tensors_off_the_cpu(chat) == []
    before = [(len(c.answers), c.answers[-1].history) for c in (chat.arr, chat.baseline)]
    answer = arr_model.answer

    def baseline_fails(image, question, pipeline="arr", **kwargs):
        if getattr(kwargs.get("conversation"), "pipeline", None) == "full":  # the baseline's, in the turn's fork
            raise RuntimeError("the baseline failed")
        return answer(image, question, pipeline, **kwargs)

    monkeypatch.setattr(arr_model, "answer", baseline_fails)
    with pytest.raises(gr.Error, match="the baseline failed"):
        handlers.converse(arr_model, chat, CAT, "Where is it?", "full", 2, 30, False, 5)
    assert [(len(c.answers), c.answers[-1].history) for c in (chat.arr, chat.baseline)] == before
    assert len(chat.rows) == 2 and tensors_off_the_cpu(chat) == []
    monkeypatch.setattr(arr_model, "answer", answer)
    chat, status, rows, *_ = handlers.converse(arr_model, chat, CAT, "Where is it?", "full", 2, 30, False, 5)
    assert [r[0] for r in rows] == [1, 2, 3]  # the conversation goes on from turn 2


def test_a_follow_up_with_no_fresh_cell_left_says_so(arr_model):
    """Issue 68: two turns read every cell of a 32 x 32 grid (700 saccades, then the 324 left: ARR chooses, its
    1024 native cells being more than 256 + 700; at 256 + 768 it would read the page whole, as full does); a
    follow-up with fresh cells only then reads none, and the status line says ARR answered from the conversation
    alone (it said nothing). A follow-up that may re-read cells says nothing of it."""
    page = Image.fromarray(np.random.default_rng(0).integers(0, 255, (896, 896, 3), dtype=np.uint8))
    chat, status, *_ = handlers.converse(arr_model, None, page, QUESTION, "full", 2, 700, False, 5)
    assert chat.arr.answers[0].tokens.saccade == 700 and "Fresh cells" not in status
    chat, status, *_ = handlers.converse(arr_model, chat, page, "Where is it?", "full", 2, 700, True, 5)
    assert chat.arr.answers[1].tokens.saccade == 324 and (
        "Fresh cells only: 324 of the 700 saccades asked for were left unread by earlier turns.") in status
    fork = chat.fork()
    _, status, *_ = handlers.converse(arr_model, chat, page, "And its nose?", "full", 2, 700, True, 5)
    assert ("Fresh cells only: earlier turns read every cell of the image, so ARR read no new cell and answered from "
            "the conversation alone.") in status
    _, status, *_ = handlers.converse(arr_model, fork, page, "And its nose?", "full", 2, 700, False, 5)
    assert "Fresh cells" not in status


def test_a_cancelled_turn_is_not_committed_and_both_conversations_stay_in_step(arr_model):
    """Issue 54 item 4: gradio cancels a turn by dropping its outputs while the handler runs on to its end, so the
    session keeps the Chat it had. A turn must change only the Chat it returns: after a cancelled turn and a
    refused one, the next is turn 2 for ARR and for the baseline alike (it was 15, 15, 16)."""
    chat, *_ = handlers.converse(arr_model, None, CAT, QUESTION, "full", 2, 30, False, 5)
    handlers.converse(arr_model, chat, CAT, "And its nose?", "full", 2, 30, False, 5)  # cancelled: never lands
    assert [len(c.answers) for c in (chat.arr, chat.baseline)] == [1, 1] and len(chat.rows) == 1
    assert all(c.answers[-1].history is not None for c in (chat.arr, chat.baseline))  # still continues
    with pytest.raises(gr.Error, match="this conversation's baseline is full"):
        handlers.converse(arr_model, chat, CAT, "Where is it?", "gestalt", 2, 30, False, 5)
    chat, status, rows, *_ = handlers.converse(arr_model, chat, CAT, "Where is it?", "full", 2, 30, False, 5)
    assert [c.answers[-1].turn for c in (chat.arr, chat.baseline)] == [2, 2] and [r[0] for r in rows] == [1, 2]
    assert status.startswith("Turn 2:") and tensors_off_the_cpu(chat) == []
