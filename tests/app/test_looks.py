"""
The Microscope's "Where the model looks" panel (issue 52; arr_coc/app/looks.py, handlers.where_it_looks): the overlap
numbers on hand-made maps, an example page's asked box, the event on a pocket page with a known box (its numbers
derived here from the teacher and ARR read on their own, the box's cells by hand), bad input, and Stop.

    .venv/bin/python -m pytest tests/app/test_looks.py -q
"""

import re
import threading
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.app import handlers, looks, ui
from arr_coc.distill.teacher import TeacherHeads, teach
from arr_coc.errors import Stopped
from arr_coc.model import ARRCOCQwen

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "assets" / "examples.json"
PAGE = Image.open(ROOT / "assets" / "pocket_fine_print.png")  # 896 x 896: 32 x 32 cells of 28 px
QUESTION = "What is the value of PAGE?"  # its box in examples.json: (210, 191, 276, 201)
BOX_CELLS = (slice(6, 8), slice(7, 10))  # y 191..201 px: rows 6 (168..196) and 7; x 210..276 px: cols 7, 8 and 9
POCKET_HEADS = TeacherHeads("pocket", [(3, 3), (3, 1), (3, 2), (3, 0)], [35, 35, 35, 33], 48)  # docs/teacher.md's


def test_the_overlap_numbers_of_hand_made_maps():
    teacher = torch.tensor([[0.6, 0.4], [0.0, 0.0]])
    relevance = torch.tensor([[1.0, 1.0], [1.0, 1.0]])  # uniform: 0.25 a cell once normalised
    saccades = torch.tensor([[0, 0], [1, 1]])
    numbers = looks.overlap_of(teacher, relevance, saccades)
    assert numbers.overlap == pytest.approx(0.5)  # min: 0.25 + 0.25 + 0 + 0
    assert numbers.teacher_on_saccades == pytest.approx(0.6)  # 0.6 at (0, 0), 0 at (1, 1)
    assert numbers.saccade_share == pytest.approx(0.5)  # the teacher's 2 hottest: (0, 0), (0, 1); ARR read (0, 0)
    assert (numbers.saccades, numbers.uniform_on_saccades) == (2, pytest.approx(0.5))
    assert numbers.teacher_in_box is None
    right = looks.overlap_of(teacher, relevance, saccades, (60, 0, 90, 40), (100, 100))  # cell (0, 1) only
    assert (right.teacher_in_box, right.arr_in_box, right.uniform_in_box) == pytest.approx((0.4, 0.25, 0.25))
    assert (right.teacher_peak_in_box, right.saccades_in_box) == (False, 0)
    left = looks.overlap_of(teacher, relevance, saccades, (0, 0, 10, 10), (100, 100))  # cell (0, 0) only
    assert (left.teacher_in_box, left.teacher_peak_in_box, left.saccades_in_box) == (pytest.approx(0.6), True, 1)


def test_an_example_pages_box_is_found_by_its_pixels_and_question():
    assert looks.example_box(PAGE, QUESTION, EXAMPLES) == (210, 191, 276, 201)
    assert looks.example_box(PAGE.convert("RGBA"), f" {QUESTION} ", EXAMPLES) == (210, 191, 276, 201)
    assert looks.example_box(PAGE, "What is the value of WIDTH?", EXAMPLES) is None  # another question: no box
    cat = Image.open(ROOT / "assets" / "chelsea.png")
    assert looks.example_box(cat, QUESTION, EXAMPLES) is None  # the question of another page
    edited = PAGE.convert("RGB")
    edited.putpixel((0, 0), (1, 2, 3))
    assert looks.example_box(edited, QUESTION, EXAMPLES) is None  # other pixels


@pytest.fixture(scope="module")
def pocket():
    """The offline pocket model with its default checkpoint, and the teacher's heads docs/teacher.md reports for it."""
    model = ARRCOCQwen.from_pretrained("pocket", device="cpu", dtype=torch.float32)
    ui.install_default_layer(model, None, ROOT / "checkpoints")
    looks.HEADS[model.vlm] = POCKET_HEADS
    return model


def table_value(summary: str, name: str) -> str:
    return re.search(rf"^\| {re.escape(name)} \| ([^|]+) \|", summary, flags=re.M).group(1).strip()


def test_the_panel_on_a_pocket_page_with_a_known_box(pocket):
    """The event's drawing and numbers, against the teacher (distill.teacher.teach) and ARR (a plain answer) read on
    their own, the box's cells counted by hand: on this page the teacher looks at the asked field, ARR's map less."""
    updates = list(handlers.where_it_looks(pocket, EXAMPLES, PAGE, QUESTION, "topk", 273, 4096))
    summary, drawing = updates[-1]
    assert updates[0][0].startswith(handlers.RUNNING) and summary.startswith("Done in")
    assert "answered **'6407'**" in summary  # examples.json's expected answer, read on the whole view
    assert isinstance(drawing, Image.Image) and drawing.width > 3 * 500  # three panels of the page
    assert (np.asarray(drawing.convert("RGB")) == (0, 255, 0)).all(-1).sum() > 100  # the asked box, in green
    assert pocket.views(PAGE, 4096).candidate_grid == (32, 32)
    teacher = teach(pocket.vlm, POCKET_HEADS, PAGE, QUESTION, max_cells=4096).map.numpy()  # [32, 32]
    arr = pocket.answer(PAGE, QUESTION, "arr", max_new_tokens=1)
    relevance = arr.arr.relevance[0].clamp(min=0).numpy()
    relevance = relevance / relevance.sum()  # [32, 32]
    rows, cols = arr.arr.positions[0, :, 0].numpy(), arr.arr.positions[0, :, 1].numpy()
    assert float(table_value(summary, "teacher's mass in the asked box")) == pytest.approx(
        teacher[BOX_CELLS].sum(), abs=6e-4)
    assert float(table_value(summary, "ARR relevance's mass in the asked box")) == pytest.approx(
        relevance[BOX_CELLS].sum(), abs=6e-4)
    assert float(table_value(summary, "teacher's mass on ARR's saccades")) == pytest.approx(
        teacher[rows, cols].sum(), abs=6e-4)
    touching = int(((rows >= 6) & (rows < 8) & (cols >= 7) & (cols < 10)).sum())
    assert int(table_value(summary, "ARR's saccades touching the box")) == touching
    assert table_value(summary, "teacher's hottest cell in the box") == "yes"
    assert teacher[BOX_CELLS].sum() > 20 * 6 / 1024  # over 20 times a uniform map's 6 cells of 1024


@pytest.mark.parametrize("image, question, strategy, message", [
    (None, QUESTION, "topk", "image"), (PAGE, "   ", "topk", "question"), (PAGE, "x" * 5000, "topk", "4000"),
    (PAGE, QUESTION, "spiral", "spiral")])
def test_bad_input_gets_a_one_line_message_before_any_vlm_work(arr_model, image, question, strategy, message):
    updates = handlers.where_it_looks(arr_model, EXAMPLES, image, question, strategy, 273, 4096)
    failed = next(updates)
    assert failed[0].startswith("**Failed**") and "\n" not in failed[0]
    with pytest.raises(gr.Error) as error:
        next(updates)
    assert message in error.value.message.lower() and "\n" not in error.value.message
    assert not arr_model.busy()


def test_stop_ends_the_teacher_and_frees_the_model(arr_model, monkeypatch):
    """Stop (gradio closes the event's generator at a tick) while the teacher runs: it ends in Stopped at its next
    block, and the model is free. On the tiny model the heads are chosen at first use, on one page."""
    monkeypatch.setattr(looks, "CALIBRATION_PAGES", 1)
    looks.HEADS.pop(arr_model.vlm, None)
    entered, release, ended = threading.Event(), threading.Event(), []

    def held_teach(*args, **kwargs):  # waits until Stop is pressed, then runs the real teacher
        entered.set()
        release.wait(30)
        try:
            return teach(*args, **kwargs)
        except Stopped as e:
            ended.append(e)
            raise

    monkeypatch.setattr(handlers, "teach", held_teach)
    updates = handlers.where_it_looks(arr_model, EXAMPLES, PAGE, QUESTION, "topk", 64, 1024)
    assert "first use: choosing its heads on 1 pages" in next(updates)[0]
    while not entered.is_set():  # ticks while the heads are chosen, until the teacher is held
        assert next(updates)[0].startswith(handlers.RUNNING)
    threading.Timer(0.3, release.set).start()
    updates.close()  # Stop
    assert len(ended) == 1 and isinstance(ended[0], Stopped)
    assert arr_model.lock.acquire(timeout=30)
    arr_model.lock.release()
    assert len(looks.HEADS[arr_model.vlm].heads) == 4  # chosen before Stop, kept
