"""
A request's path, pinned by a probe (issue 50): a forward hook on the vision tower's first module (its patch
embedding) records, each time a request reaches it, the thread it runs in and the project's functions on the stack.
`run`'s ARR request and the app's Compare button reach the vision tower in the caller's own thread, every step a
layer at or below the one before it (tests/test_imports.py's LAYERS), and Compare within 8 calls: from the handler
the button calls to the function that runs the tower's blocks (the last frame, which calls its patch embedding, is
the tower itself): the handler, its steps, the façade's stream, the pipeline, its step (ARR's observe or
encode_saccades), the VLM's encode and the engine's way into its tower.

    .venv/bin/python -m pytest -q tests/test_request_path.py
"""

import inspect
import threading
from pathlib import Path

import pytest
import torch
from PIL import Image

from arr_coc import model as facade
from arr_coc import run
from arr_coc.app import handlers
from test_imports import unit_of

ROOT = Path(__file__).resolve().parents[1]
CAT = ROOT / "assets" / "chelsea.png"
QUESTION = "What colour are the cat's eyes?"
MAX_CALLS = 8  # issue 50: from the Compare button to the vision tower


def module_of(path: str) -> str | None:
    """The project module a stack frame's file is (arr_coc.x.y, or app), None outside the project."""
    file = Path(path).resolve()
    if file == ROOT / "app.py":
        return "app"
    if ROOT / "arr_coc" not in file.parents:
        return None
    parts = file.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Probe:
    """A global forward pre-hook on every patch embedding: per call, (its thread, the project's frames outermost
    first, as (module, function))."""

    def __init__(self):
        self.seen: list[tuple[threading.Thread, list[tuple[str, str]]]] = []

    def __call__(self, module, args):
        if type(module).__name__.endswith("PatchEmbed"):
            frames = [(module_of(f.filename), f.function) for f in reversed(inspect.stack(0)[1:])]
            self.seen.append((threading.current_thread(), [f for f in frames if f[0] is not None]))

    def __enter__(self):
        self.handle = torch.nn.modules.module.register_module_forward_pre_hook(self)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def walk_down(frames: list[tuple[str, str]]) -> list[int]:
    """The layer (LAYERS index) of each frame, outermost first."""
    return [unit_of(module)[0] for module, _ in frames]


def test_runs_arr_request_reaches_the_vision_tower_in_one_thread_going_down(capsys):
    with Probe() as probe:
        assert run.main(["--model", "tiny", "--image", str(CAT), "--question", QUESTION, "--pipelines", "arr",
                         "--max-new-tokens", "1"]) in (0, None)
    assert len(probe.seen) >= 2  # the gestalt and the saccades
    for thread, frames in probe.seen:
        assert thread is threading.main_thread()
        layers = walk_down(frames)
        assert layers == sorted(layers, reverse=True), f"a climb back up a layer: {frames}"
        assert ("arr_coc.pipelines.arr", "answer") in frames, frames


@pytest.mark.parametrize("baseline", ["gestalt", "divprune"])
def test_the_compare_button_reaches_the_vision_tower_within_eight_calls(arr_model, baseline):
    with Probe() as probe:
        final = list(handlers.compare(arr_model, Image.open(CAT), QUESTION, baseline, 1, "topk", 4096, 5))[-1]
    assert final[0].startswith("Done in")
    pipelines = {module for _, frames in probe.seen for module, _ in frames if module.startswith("arr_coc.pipelines.")}
    assert {"arr_coc.pipelines.arr", "arr_coc.pipelines.stock"} <= pipelines  # both answers were probed
    for thread, frames in probe.seen:
        walk = frames[[m for m, _ in frames].index("arr_coc.app.handlers"):-1]  # from the handler to the tower
        assert thread is threading.main_thread()
        assert len(walk) <= MAX_CALLS, f"{len(walk)} calls to the vision tower: {walk}"
        layers = walk_down(walk)
        assert layers == sorted(layers, reverse=True), f"a climb back up a layer: {walk}"


def test_the_compare_button_tokenizes_its_question_once(arr_model, monkeypatch):
    """Issue 62 step 4: the checks, the prior pass, the participatory scorer's query and both pipelines' prompts all
    read the question's ids; the tokenizer sees the question once (eight times before ChatLayout kept them)."""
    question = "How many whiskers does the cat have on its left side?"  # asked by no other test: not yet kept
    tokenizer = arr_model.vlm.chat.tokenizer
    real, seen = type(tokenizer).__call__, []

    def counting(self, text=None, *args, **kwargs):
        seen.extend([text] if isinstance(text, str) and question in text else [])
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", counting)
    image = Image.open(CAT).resize((1400, 1000))  # more cells than ARR reads: it selects, and both pipelines prompt
    final = list(handlers.compare(arr_model, image, question, "divprune", 1, "topk", 4096, 5))[-1]
    assert final[0].startswith("Done in")
    assert seen == [question]


def test_the_compare_button_checks_its_question_once(arr_model, monkeypatch):
    """Issue 62 step 4: Compare's handler checks the question (its text, then its tokens) before its status line
    says it runs, and both pipelines' requests take that checked question as it is (three checks before: the
    handler's, then the façade's for each pipeline)."""
    real, seen = facade.checked_question, []
    monkeypatch.setattr(facade, "checked_question", lambda question, ids: seen.append(question) or real(question, ids))
    image = Image.open(CAT).resize((1400, 1000))
    final = list(handlers.compare(arr_model, image, "  " + QUESTION, "divprune", 1, "topk", 4096, 5))[-1]
    assert final[0].startswith("Done in")
    assert seen == ["  " + QUESTION]


def test_the_compare_button_converts_its_image_to_rgb_once(arr_model, monkeypatch):
    """Issue 62 step 4: an RGBA upload is turned into RGB once, by the handler's check; the views take that RGB
    image as it is (twice before: the check converted it and threw the result away)."""
    real, seen = Image.Image.convert, []

    def counting(self, mode=None, *args, **kwargs):
        seen.extend([self.mode] if mode == "RGB" and self.mode != "RGB" else [])
        return real(self, mode, *args, **kwargs)

    image = Image.open(CAT).resize((1400, 1000)).convert("RGBA")
    monkeypatch.setattr(Image.Image, "convert", counting)
    final = list(handlers.compare(arr_model, image, QUESTION, "divprune", 1, "topk", 4096, 5))[-1]
    assert final[0].startswith("Done in")
    assert seen == ["RGBA"]
