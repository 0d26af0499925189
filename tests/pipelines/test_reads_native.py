"""
ARR never reads more than the baseline (issue 67 item 1): where the native view holds no more cells than ARR's LLM
would read (the gestalt plus the budget), ARR reads the native view whole, exactly as `full` does, and says why
(Answer.reads_native, run's table and --json). The cat (assets/chelsea.png, 451x300) holds 11x16 = 176 cells; ARR
read 247 + 273 = 520 tokens of a 26x38 candidate grid (1064x728 px, upsampled past the image) against full's 176.

    python -m pytest -q tests/pipelines/test_reads_native.py
"""

import json

import pytest
from PIL import Image

from arr_coc.run import main
from conftest import scene_image

CAT = "assets/chelsea.png"  # 451 x 300 px
WHY = "the image holds 176 cells (11x16) <= gestalt 247 + budget 273"
LINE = f"arr: read the native view whole, as full does: {WHY}"


def run_cat(tmp_path, capsys, model: str) -> tuple[dict, str]:
    out = tmp_path / f"{model}.json"
    assert main(["--model", model, "--image", CAT, "--question", "What colour are the cat's eyes?",
                 "--pipelines", "arr,full", "--max-new-tokens", "2", "--json", str(out)]) == 0
    return json.loads(out.read_text())["pipelines"], capsys.readouterr().out


@pytest.mark.usefixtures("tiny_loaded_once")
def test_on_the_cat_arr_reads_the_native_view_as_full_does_and_says_why_tiny(tmp_path, capsys):
    assert Image.open(CAT).size == (451, 300)
    results, printed = run_cat(tmp_path, capsys, "tiny")
    arr, full = results["arr"], results["full"]
    assert arr["tokens"] == full["tokens"] == dict(gestalt=0, saccade=0, text=arr["tokens"]["text"], total_visual=176)
    assert arr["reads_native"] == WHY and "reads_native" not in full
    assert arr["answer"] == full["answer"] and "saccades" not in arr  # the same reading: the same greedy answer
    assert LINE in printed


def test_on_the_cat_arr_reads_the_native_view_as_full_does_and_says_why_pocket(tmp_path, capsys):
    results, printed = run_cat(tmp_path, capsys, "pocket")
    arr, full = results["arr"], results["full"]
    assert arr["tokens"]["total_visual"] == full["tokens"]["total_visual"] == 176
    assert arr["reads_native"] == WHY and arr["answer"] == full["answer"]
    assert LINE in printed


def test_at_the_boundary_arr_chooses_below_it_and_reads_native_at_it(arr_model):
    """With a 3x5 gestalt (15 tokens) the cat's 176 cells are read whole from a budget of 161 (15 + 161 = 176) on;
    at 160 ARR chooses 160 cells of the native 11x16 grid itself (twice the gestalt's 3x5 is less), 175 tokens."""
    cat = Image.open(CAT)
    chose = arr_model.answer(cat, "What is it?", "arr", max_new_tokens=1, gestalt_tokens=16, budget=160)
    assert chose.reads_native is None and chose.tokens.total_visual == 15 + 160 and chose.arr.grid == (11, 16)
    at = arr_model.answer(cat, "What is it?", "arr", max_new_tokens=1, gestalt_tokens=16, budget=161)
    assert at.reads_native == "the image holds 176 cells (11x16) <= gestalt 15 + budget 161"
    assert at.tokens.total_visual == 176 and at.arr is None and at.saccades == []


def test_a_page_with_more_cells_than_arr_reads_is_still_chosen_from(arr_model):
    """896 px square: 32x32 = 1024 native cells > 256 + 273: ARR's saccades, as ever."""
    a = arr_model.answer(scene_image(896, 896), "What is it?", "arr", max_new_tokens=1)
    assert a.reads_native is None and a.tokens.total_visual == 256 + 273 and a.arr.grid == (32, 32)
    assert a.to_json()["reads_native"] is None


def test_the_adaptive_budget_decides_after_selection_and_upsample_keeps_the_old_reading(arr_model):
    cat = Image.open(CAT)
    auto = arr_model.answer(cat, "What is it?", "arr", max_new_tokens=1, budget="auto")
    assert auto.reads_native.startswith("the image holds 176 cells (11x16) <= gestalt 247 + budget ")
    assert auto.tokens.total_visual == 176
    old = arr_model.answer(cat, "What is it?", "arr", max_new_tokens=1, upsample=True)
    assert old.reads_native is None and old.tokens.total_visual == 247 + 273 and old.arr.grid == (26, 38)


def test_the_baselines_matched_to_arr_read_what_it_reads(arr_model):
    """budget and the reducers read ARR's visual-token count: on the cat, the native view's 176 (not 520)."""
    cat = Image.open(CAT)
    assert arr_model.answer(cat, "What is it?", "budget", max_new_tokens=1).tokens.total_visual == 176
    assert arr_model.answer(cat, "What is it?", "divprune", max_new_tokens=1).tokens.total_visual == 176


def test_a_conversation_whose_first_turn_read_natively_continues_as_full_does(arr_model):
    from arr_coc.pipelines.conversation import Conversation

    chat = Conversation("arr", Image.open(CAT))
    first = arr_model.answer(None, "What is it?", conversation=chat, max_new_tokens=2)
    second = arr_model.answer(None, "And its eyes?", conversation=chat, max_new_tokens=2)
    assert first.reads_native == second.reads_native == WHY and chat.read is None
    assert second.turn == 2 and second.tokens.total_visual == 0  # the question alone, after the first turn's view
    assert [m.new for m in chat.moves()] == [[]]  # no saccades to move


@pytest.mark.usefixtures("tiny_loaded_once")
def test_run_on_the_cat_says_faithfulness_has_no_saccades_and_draws_no_arr_pictures(tmp_path, capsys):
    args = ["--model", "tiny", "--image", CAT, "--question", "What is it?", "--pipelines", "arr", "--max-new-tokens", "1"]
    assert main([*args, "--faithfulness"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --faithfulness needs ARR's saccades, and ARR read the native view whole ({WHY}): no saccades to remove")
    assert main([*args, "--save-dir", str(tmp_path / "png")]) == 0
    assert LINE in capsys.readouterr().out and not (tmp_path / "png").exists()  # nothing chosen: nothing to draw
