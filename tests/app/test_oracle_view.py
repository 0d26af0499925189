"""
The Microscope's oracle (issue 61; handlers.oracle, looks.oracle_text): evaluate's oracle row, the asked box's cells
forced into ARR's budget, shown on an example page with a known box, and nothing oracle-ish on an image without one.

    .venv/bin/python -m pytest tests/app/test_oracle.py -q
"""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from arr_coc.app import handlers, looks
from arr_coc.pipelines import arr_scene

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "assets" / "examples.json"
PAGE = Image.open(ROOT / "assets" / "pocket_fine_print.png")  # 896 x 896: 32 x 32 cells of 28 px
QUESTION = "What is the value of PAGE?"  # its box in examples.json: (210, 191, 276, 201)
BOX_CELLS = {(6, 7), (6, 8), (6, 9), (7, 7), (7, 8), (7, 9)}  # y 191..201 px: rows 6 (168..196) and 7 (196..224);
# x 210..276 px: cols 7 (196..224), 8 and 9 (252..280)
BUDGET = 20


def test_the_oracle_line_by_hand():
    assert looks.oracle_text(6, 20, 3) == ("oracle: the asked box's 6 cells forced into the 20 saccades; ARR found 3 "
                                           "of them (box recall 0.50).")
    assert looks.oracle_text(6, 4, 4) == ("oracle: the 4 most relevant of the asked box's 6 cells forced in (the box "
                                          "holds more than the budget); ARR found 4 of them (box recall 0.67).")


@pytest.fixture(scope="module")
def analysed(arr_model):
    """The Microscope's kept maps of the example page (Analyse, on the tiny model)."""
    assert arr_model.views(PAGE, 4096).candidate_grid == (32, 32)
    return handlers.microscope(arr_model, PAGE, QUESTION, "topk", BUDGET, 4096, 5)[0]


def test_the_oracle_forces_the_whole_box_into_the_budget(arr_model, analysed):
    request = handlers.microscope_request(BUDGET, strategy="topk")
    forced, inside = handlers.oracle_selection(arr_model, analysed, (210, 191, 276, 201), PAGE.size, request)
    assert {tuple(c) for c in np.argwhere(inside.numpy())} == BOX_CELLS
    cells = [tuple(c) for c in forced.positions[0].tolist()]
    assert len(cells) == BUDGET and len(set(cells)) == BUDGET  # exactly the budget, each cell once
    assert all(0 <= r < 32 and 0 <= c < 32 for r, c in cells)
    assert BOX_CELLS <= set(cells)


def test_the_event_on_the_example_page(arr_model, analysed):
    drawing, line = handlers.oracle(arr_model, EXAMPLES, analysed, PAGE, QUESTION, "topk", BUDGET)
    own = arr_scene.select(arr_model.layer, analysed.maps, (32, 32), analysed.gestalt_tokens, BUDGET, "topk")
    found = len(BOX_CELLS & {tuple(c) for c in own.positions[0].tolist()})  # ARR's own saccades in the box
    assert line == (f"oracle: the asked box's 6 cells forced into the {BUDGET} saccades; ARR found {found} of them "
                    f"(box recall {found / 6:.2f}).")
    assert isinstance(drawing, Image.Image)
    assert (np.asarray(drawing.convert("RGB")) == looks.BOX_COLOUR).all(-1).sum() > 50  # the box, outlined


def test_nothing_oracle_ish_without_a_known_box(arr_model):
    cat = Image.open(ROOT / "assets" / "chelsea.png")
    kept = handlers.microscope(arr_model, cat, QUESTION, "topk", BUDGET, 4096, 5)[0]
    assert handlers.oracle(arr_model, EXAMPLES, kept, cat, QUESTION, "topk", BUDGET) == (None, looks.NO_BOX)
    assert "no known asked box" in looks.NO_BOX
    assert handlers.oracle(arr_model, EXAMPLES, None, PAGE, QUESTION, "topk", BUDGET) == (None, "")  # not analysed
