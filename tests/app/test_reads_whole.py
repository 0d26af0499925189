"""
The app where ARR reads the image whole, as full does (issue 67 item 1): the cat (assets/chelsea.png, 451x300) holds
11x16 = 176 native cells, no more than the tiny model's gestalt (247 tokens) plus the default budget (273), so ARR
chooses nothing. Every tab says so in one line, draws no selection, and stays up. Run:

    nice .venv/bin/python -m pytest -q tests/app/test_reads_whole.py
"""

from pathlib import Path

import gradio as gr
import pytest
from PIL import Image

from arr_coc.app import handlers, ui

ROOT = Path(__file__).resolve().parents[2]
CAT = Image.open(ROOT / "assets" / "chelsea.png")
QUESTION = "What colour are the cat's eyes?"
NOTE = ("ARR read the image whole, as full does (the image holds 176 cells (11x16) <= gestalt 247 + budget 273): "
        "choosing saccades would read more tokens than full, so there is no selection to draw.")


def test_compare_on_the_cat_says_arr_read_it_whole_and_draws_no_selection(arr_model):
    last = list(handlers.compare(arr_model, CAT, QUESTION, "full", 2, "topk", 4096, 5))[-1]
    status, _, base_stats, _, arr_stats, heatmap, gestalt, weights, mosaic, cells, kept = last
    assert status.startswith("Done in") and status.endswith(f" s. {NOTE}")
    assert (heatmap, weights, mosaic, cells, kept) == (None, None, None, None, None) and gestalt is not None
    assert ["no selection", NOTE] in arr_stats and ["visual tokens: total", 176] in arr_stats
    assert ["visual tokens: total", 176] in base_stats and not any(r[0] == "no selection" for r in base_stats)
    assert handlers.redraw(kept, 3) == (None, None)  # the numbered slider after it: nothing to redraw, no crash


def test_faithfulness_on_the_cat_is_refused_in_one_line(arr_model):
    with pytest.raises(gr.Error) as refused:
        handlers.faithfulness(arr_model, CAT, QUESTION, "", "topk", 273, 4096)
    assert refused.value.message == f"{NOTE} Faithfulness needs saccades to remove: try a larger image."


def test_a_conversation_on_the_cat_reads_it_whole_each_turn_and_says_so(arr_model):
    chat, status, rows, heatmap, drawing = handlers.converse(arr_model, None, CAT, QUESTION, "full", 2, 273, True, 5)
    assert status.startswith("Turn 1: ") and NOTE in status and "Fresh cells" not in status
    assert (heatmap, drawing) == (None, None)
    chat, status, rows, heatmap, drawing = handlers.converse(arr_model, chat, CAT, "And its nose?", "full", 2, 273,
                                                             True, 5)
    assert status.startswith("Turn 2: ") and NOTE in status and (heatmap, drawing) == (None, None)
    assert [r[-1] for r in rows] == ["-", "-"]  # no saccades moved
    assert rows[0][6] == rows[0][7] and rows[1][6] == rows[1][7]  # ARR prefilled what full did: the same reading


def test_checkpoint_ab_on_the_cat_compares_the_answers_alone(arr_model, tmp_path):
    *drawings, text_a, text_b, summary = list(handlers.ab(arr_model, tmp_path, CAT, QUESTION, ui.PRIOR, None,
                                                          ui.PRIOR, None, "topk", 2, 4096))[-1]
    assert drawings == [None, None, None] and text_a == text_b
    assert summary == f"Checkpoint A: {NOTE}\n\nCheckpoint B: {NOTE}\n\nAnswers: agree."
