"""
Stop frees the model (issue 54 item 5): a stopped request ends at the next vision block or LLM layer, not after its
whole vision encode and prefill, and the next request says it waits for the stopped one until the model is free.

    .venv/bin/python -m pytest tests/app/test_stop.py -q
"""

import threading
from pathlib import Path

import pytest
from PIL import Image

from arr_coc.app import handlers
from arr_coc.errors import Stopped

ROOT = Path(__file__).resolve().parents[2]
CAT = Image.open(ROOT / "assets" / "chelsea.png")
QUESTION = "What colour are the cat's eyes?"


def blocks(model, suffix: str) -> list:
    """The VLM's vision blocks' first norms (".norm1") or its LLM layers' (".input_layernorm")."""
    return [m for name, m in model.vlm.model.named_modules() if name.endswith(suffix) and name.count(".") >= 3]


def stopped_at(model, pipeline: str, pressed_in) -> list:
    """Answer with Stop pressed right after the module `pressed_in` runs (once); -> one entry per LLM layer that
    started after that. The request must end in Stopped, and the model must answer the next one."""
    stop, llm_ran = threading.Event(), []
    pressed = pressed_in.register_forward_hook(lambda *_: stop.set())

    def count(*_):  # a layer starting after Stop (a pre-hook returns nothing: its inputs stay as they are)
        if stop.is_set():
            llm_ran.append(1)

    counting = [m.register_forward_pre_hook(count) for m in blocks(model, ".input_layernorm")]
    try:
        with pytest.raises(Stopped):
            model.answer(CAT, QUESTION, pipeline, max_new_tokens=4, stop=stop)
    finally:
        for hook in (pressed, *counting):
            hook.remove()
    assert model.answer(CAT, QUESTION, pipeline, max_new_tokens=1).new_tokens == 1  # the model is free again
    return llm_ran


@pytest.mark.parametrize("pipeline", ["full", "arr"])
def test_stop_during_a_prefill_or_prior_pass_ends_it_at_the_next_layer(family, pipeline):
    """Stop pressed as the LLM's first layer runs (the full baseline's prefill, ARR's prior pass): no later layer
    starts. It used to run the whole pass (and ARR its selection, saccades and prefill) and stop at the first token."""
    assert stopped_at(family, pipeline, blocks(family, ".input_layernorm")[0]) == []


def test_stop_during_arrs_gestalt_encode_ends_it_before_the_llm_runs(family):
    assert stopped_at(family, "arr", blocks(family, ".norm1")[0]) == []


def test_the_next_compare_says_it_waits_for_the_stopped_request(arr_model):
    """While another request still holds the model, Compare's status says so; once it is free, that it runs."""
    holding, release = threading.Event(), threading.Event()

    def stopped_request():
        with arr_model.lock:
            holding.set()
            release.wait(30)

    threading.Thread(target=stopped_request, daemon=True).start()
    holding.wait(30)
    steps = handlers.compare_steps(arr_model, CAT, QUESTION, "gestalt", 1, "topk", 4096, 5)
    assert next(steps)[0] == "Waiting for the model: it is finishing the request that was stopped…"
    release.set()
    assert next(steps)[0] == "Running the **gestalt** baseline…"
    steps.close()
    fresh = handlers.compare_steps(arr_model, CAT, QUESTION, "gestalt", 1, "topk", 4096, 5)
    assert next(fresh)[0] == "Running the **gestalt** baseline…"  # a free model: no waiting line
    fresh.close()


def test_a_second_facade_over_the_same_vlm_keeps_stop_working(arr_model):
    """Another ARRCOCQwen over the same weights (another layer's, as the handlers' tests make) shares the VLM's one
    block check and lock: before, it replaced the first facade's check, and the first one's Stop ran on to the end."""
    from arr_coc.model import ARRCOCQwen

    other = ARRCOCQwen(arr_model.vlm)
    assert other.lock is arr_model.lock and other.stop_check is arr_model.stop_check
    assert stopped_at(arr_model, "full", blocks(arr_model, ".input_layernorm")[0]) == []
