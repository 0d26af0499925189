"""
The pipelines: each behind one function

    answer(parts, views, question, request) -> its tokens as they come, then its Answer   # a generator (steps.py)

where `parts` (request.Parts) holds the shared VLM, ARR layer, texture array and settings: the façade above
(arr_coc.model.ARRCOCQwen) builds it and hands it down, and no pipeline imports the façade. The registry below names
them for the flags (run, bench, evaluate), the app and ARRCOCQwen.answer, read from each pipeline's record (its
declaration, arr_coc/pipelines/declared/: pipeline.Pipeline): a new pipeline is its module and its declaration, and
check_pipeline refuses a request a pipeline cannot run. This module imports nothing heavy, so the
commands check their flags before torch loads.

    from arr_coc import pipelines
    pipelines.PIPELINES                               # ("arr", "full", "gestalt", "budget", "divprune", ..., "pixelprune_n")
    finished(pipelines.answer_of("full")(parts, views_of(parts, image), "What is here?", Request()))   # steps.py
"""

import importlib
import pkgutil
from types import ModuleType
from typing import Callable

from arr_coc.errors import InputError
from arr_coc.pipelines import declared
from arr_coc.pipelines.pipeline import Pipeline, option_names
from arr_coc.pipelines import arr_options  # torch-free: ARR's settings


def declarations(package=declared) -> dict[str, Pipeline]:
    """name -> record of every pipeline declared in `package` (each module's PIPELINE), in the records' order;
    ValueError for two of one name, or two Options declaring one setting (a setting is one flag)."""
    records = [importlib.import_module(f"{package.__name__}.{m.name}").PIPELINE
               for m in pkgutil.iter_modules(package.__path__)]
    found = {}
    for record in sorted(records, key=lambda r: (r.order, r.name)):
        if record.name in found:
            raise ValueError(f"two pipelines are named {record.name!r}")
        found[record.name] = record
    owners = {}
    for record in found.values():
        for name in option_names(record.options):
            if owners.setdefault(name, record.options) is not record.options:
                raise ValueError(f"the setting {name!r} is declared twice (pipeline {record.name}'s options)")
    return found


REGISTRY = declarations()  # name -> Pipeline (arr_coc.pipelines.pipeline), arr_coc/pipelines/declared's records
PIPELINES = tuple(REGISTRY)
FAST_ENGINE_ONLY = tuple(n for n, r in REGISTRY.items() if "hf" not in r.engines)  # pipelines stock generate() cannot
# run (the hf engine): FastV's layers read two lengths
BASELINES = tuple(n for n, r in REGISTRY.items() if r.baseline)  # stock or a published reducer
# the pipelines whose LLM reads our own embeddings (vlm.prompt) under either engine; stock generate() cannot take
# Qwen3-VL's (it would drop their DeepStack features), so under its hf engine they have no row
FROM_EMBEDS = tuple(n for n, r in REGISTRY.items() if r.from_embeds)
REDUCERS = tuple(n for n, r in REGISTRY.items() if r.kind == "reducer")  # the published token reducers: each names
# its kept cells (Answer.kept)
BUDGET_FREE = tuple(n for n, r in REGISTRY.items() if r.budget_free)  # the pipelines no budget changes: a budget
# sweep runs them once
OPTIONS = tuple(dict.fromkeys(r.options for r in REGISTRY.values() if r.options is not None))  # the pipelines' own
# settings' dataclasses, each once (pixelprune_n shares pixelprune's): Request.options, with_settings' names, and
# run's and evaluate's flags (those whose fields are flags: ARR's are not, its flags are the commands' own)


def describe(names: tuple[str, ...] = PIPELINES) -> str:
    """One line naming each pipeline and what it reads (the flags' help)."""
    return "; ".join(f"{name}: {REGISTRY[name].what}" for name in names)


def record(name: str) -> Pipeline:
    """The record of a registered pipeline; KeyError naming the registered ones otherwise."""
    if name not in REGISTRY:
        raise KeyError(f"unknown pipeline {name!r}: one of {', '.join(PIPELINES)}")
    return REGISTRY[name]


def load(name: str) -> ModuleType:
    """The module of a registered pipeline's answer (imported on first use)."""
    return record(name).load()


def answer_of(name: str) -> Callable:
    """A registered pipeline's answer(parts, views, question, request): a generator of its tokens and then its
    Answer (its module imported on first use)."""
    return record(name).answer_function()


def check_pipeline(pipeline: str, request) -> None:
    """A pipeline of the registry, and one that can do what the request (a request.Request) asks: what only ARR does
    (an ablation, a second look, cells forced in: arr_options.Options.arr_only) needs a pipeline whose record takes
    ARR's Options. InputError otherwise."""
    if pipeline not in REGISTRY:
        raise InputError(f"pipeline must be one of {tuple(REGISTRY)}, got {pipeline!r}")
    if REGISTRY[pipeline].options is not arr_options.Options and (why := arr_options.arr_options(request).arr_only(
            pipeline)):
        raise InputError(why)
