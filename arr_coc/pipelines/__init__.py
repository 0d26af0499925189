"""
The pipelines: one file each, behind one function

    answer(parts, views, question, request) -> its tokens as they come, then its Answer   # a generator (steps.py)

where `parts` (request.Parts) holds the shared VLM, ARR layer, texture array and settings: the façade above
(arr_coc.model.ARRCOCQwen) builds it and hands it down, and no pipeline imports the façade. The registry below names
them for the flags (run, bench, evaluate), the app and ARRCOCQwen.answer: a new pipeline is one file and one
line here, and check_pipeline refuses a request a pipeline cannot run. This module imports nothing heavy, so the
commands check their flags before torch loads.

    from arr_coc import pipelines
    pipelines.PIPELINES                               # ("arr", "full", "gestalt", "budget", "divprune", ..., "pixelprune_n")
    finished(pipelines.load("full").answer(parts, views_of(parts, image), "What is here?", Request()))   # steps.py
"""

import importlib
from types import ModuleType

from arr_coc.errors import InputError
from arr_coc.relevance.ablation import NO_ABLATION, Ablation  # torch-free names

# name -> (module, whether it is a baseline beside ARR (stock or a published reducer), what it reads)
REGISTRY = {
    "arr": ("arr_coc.pipelines.arr", False, "ARR-COC: the gestalt, then saccades chosen by relevance at native resolution"),
    "full": ("arr_coc.pipelines.full", True, "stock: the native view, capped at max_cells (the model as users run it)"),
    "gestalt": ("arr_coc.pipelines.gestalt", True, "stock: the low-res gestalt view alone"),
    "budget": ("arr_coc.pipelines.budget", True, "stock: one view resized to about ARR's token count"),
    "divprune": ("arr_coc.pipelines.divprune", True, "DivPrune: the native view's most diverse tokens, as many as ARR reads"),
    "visionzip": ("arr_coc.pipelines.visionzip", True, "VisionZip: the native view's most-attended tokens plus merged context, as many as ARR reads"),
    "fastv": ("arr_coc.pipelines.fastv", True, "FastV: the native view, only the image tokens layer K-1 attends to most "
              "(ARR's token count) read from layer K on"),
    "pixelprune": ("arr_coc.pipelines.pixelprune", True, "PixelPrune: the native view's pixel-unique cells only "
                   "(a neighbour's duplicate, within tau, dropped before the ViT), every one"),
    "pixelprune_n": ("arr_coc.pipelines.pixelprune_n", True, "PixelPrune at ARR's token count: of its pixel-unique "
                     "cells, the most unique (farthest from the nearest other), as many as ARR reads"),
}
PIPELINES = tuple(REGISTRY)
FAST_ENGINE_ONLY = ("fastv",)  # pipelines stock generate() cannot run (the hf engine): FastV's layers read two lengths
BASELINES = tuple(name for name, (_, baseline, _) in REGISTRY.items() if baseline)
# the pipelines whose LLM reads our own embeddings (vlm.prompt) under either engine; stock generate() cannot take
# Qwen3-VL's (it would drop their DeepStack features), so under its hf engine they have no row
FROM_EMBEDS = ("arr", "divprune", "visionzip", "pixelprune", "pixelprune_n")
REDUCERS = ("divprune", "visionzip", "fastv", "pixelprune", "pixelprune_n")  # the published token reducers: each
# names its kept cells (Answer.kept)
BUDGET_FREE = ("full", "gestalt", "pixelprune")  # the pipelines no budget changes: a budget sweep runs them once


def describe(names: tuple[str, ...] = PIPELINES) -> str:
    """One line naming each pipeline and what it reads (the flags' help)."""
    return "; ".join(f"{name}: {REGISTRY[name][2]}" for name in names)


def load(name: str) -> ModuleType:
    """The module of a registered pipeline (imported on first use): it defines
    answer(parts, views, question, request), a generator of its tokens and then its Answer."""
    if name not in REGISTRY:
        raise KeyError(f"unknown pipeline {name!r}: one of {', '.join(PIPELINES)}")
    return importlib.import_module(REGISTRY[name][0])


def check_pipeline(pipeline: str, request) -> None:
    """A pipeline of the registry, and one that can do what the request (a request.Request) asks: an ablation or a
    second look is ARR's. InputError otherwise."""
    if pipeline not in REGISTRY:
        raise InputError(f"pipeline must be one of {tuple(REGISTRY)}, got {pipeline!r}")
    ablation = request.ablation.name if isinstance(request.ablation, Ablation) else request.ablation
    if ablation not in (None, NO_ABLATION.name) and pipeline != "arr":
        raise InputError(f"an ablation ({ablation}) switches off part of ARR: it needs the arr pipeline, "
                         f"not {pipeline}")
    if request.refixate is not None and pipeline != "arr":
        raise InputError(f"refixation is ARR's second look: it needs the arr pipeline, not {pipeline}")
    if request.include is not None and pipeline != "arr":
        raise InputError(f"cells forced into the selection (include) are ARR's saccades: they need the arr pipeline, "
                         f"not {pipeline}")
