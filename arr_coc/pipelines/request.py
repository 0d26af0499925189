"""
What a pipeline is given: the Parts (what of the model it reads: the VLM, the ARR layer, the texture array, the
settings) and the Request (how to answer: what every pipeline shares, and in Request.options each pipeline's own
settings, ARR's among them: arr_coc.pipelines.arr_options), with the request's checks. The façade takes a Request
whole, or its settings by name over one (with_settings: a pipeline's own into its Options), and checks it here
(check_request, ARR's settings by their Options.check: an ablation named by a string becomes its Ablation there;
which pipeline may take it is the registry's check, arr_coc.pipelines.check_pipeline).

    request = check_request(with_settings(Request(max_new_tokens=32), dict(budget="auto", ablation="no-gestalt")))
    # ablation: a setting of ARR's, into its Options
    arr_options(request).ablation                               # ABLATIONS["no-gestalt"]
    parts = Parts(vlm, layer, CUDAGraphed(generate_texture_array), PipelineConfig())   # or ARRCOCQwen(...).parts
"""

import threading
from dataclasses import dataclass, fields, replace
from typing import Callable

import torch

from arr_coc import pipelines  # the registry (torch-free; it imports no request)
from arr_coc.errors import InputError, Stopped, check_text
from arr_coc.pipelines.arr_options import Options as ArrOptions
from arr_coc.relevance.layer import ARRCOCLayer
from arr_coc.settings import MAX_NEW_TOKENS, MAX_QUESTION_CHARS, MAX_QUESTION_TOKENS, PipelineConfig
from arr_coc.vlm.base import VLM


@dataclass
class Parts:
    """What of the model a pipeline reads: ARRCOCQwen (arr_coc.model) builds it and hands it down (ARRCOCQwen.parts);
    the pipelines know nothing of the façade above them."""
    vlm: VLM  # the frozen Qwen-VL: one copy of the weights for every pipeline
    layer: ARRCOCLayer  # the ARR layer a request scores with unless it names its own (ARR's Options.layer)
    texture: Callable[..., torch.Tensor]  # the texture array (generate_texture_array, CUDA-graphed): [1, 3, H, W],
    # (GH, GW) -> [1, 13, GH, GW]
    pipeline: PipelineConfig  # views, caps, the prior's layer, FastV's K: never from a checkpoint


@dataclass
class Request:
    """How to answer one question, what every pipeline shares (every field optional; None: the model's own setting),
    and the pipelines' own settings (options: ARR's, arr_coc.pipelines.arr_options; FastV's K, ...)."""
    max_new_tokens: int = 64  # at most this many generated tokens
    budget: int | str | None = None  # ARR's saccade count, or "auto": the adaptive budget (default: the layer's); the
    # reducers keep as many tokens (ARR's count)
    max_cells: int | None = None  # cap on the native-resolution grid (default: the PipelineConfig's): where the
    # request's views are made
    gestalt_tokens: int | None = None  # at most this many gestalt tokens, 1 to max_cells // 4 (default: the
    # PipelineConfig's 256; 576 is Q-Zoom's coarse pass): the views' gestalt grid, which every pipeline reads
    options: tuple = ()  # the pipelines' own settings, each an Options of a pipeline's record (arr_coc.pipelines.
    # declared: ARR's strategy, ablation, second look, ... (arr_options), FastV's K, PixelPrune's tau), at most one of
    # a type: a pipeline reads its own (arr_options, setting; none of its type: its defaults, the PipelineConfig's),
    # the others pass it by (one request serves evaluate's every row)
    stop: threading.Event | None = None  # once set, the request raises Stopped at its next generated token (Stop)
    converse: bool = False  # keep the conversation after the answer (Answer.history) for a follow-up question


def check_question(question) -> str:
    if not isinstance(question, str) or not question.strip():
        raise InputError("the question is empty: type a question about the image")
    if len(question) > MAX_QUESTION_CHARS:
        raise InputError(f"the question is {len(question)} characters long; the limit is {MAX_QUESTION_CHARS}")
    return question.strip()


class CheckedQuestion(str):
    """A question that passed checked_question: the façade checks a request's question once and hands a CheckedQuestion
    back as it is (ARRCOCQwen.check_question), so the app's handler, which checks it before its status line says it
    runs, and each pipeline the request runs (Compare: two) do not check it again."""


def checked_question(question, question_ids: Callable[[str], list[int]]) -> CheckedQuestion:
    """
    check_question's checks (some text, at most MAX_QUESTION_CHARS characters, valid Unicode), then its length in
    the model's tokens (question_ids: ChatLayout.question_ids, special tokens as plain text), before any VLM work:
    at most MAX_QUESTION_TOKENS (4000 four-byte characters can be 16,000 tokens; one prompt that long took 12 GB).
    The façade's check (ARRCOCQwen.check_question) and vLLM's front end's. -> the question, stripped, a CheckedQuestion.
    """
    question = check_text(check_question(question), "question")
    tokens = len(question_ids(question))
    if tokens > MAX_QUESTION_TOKENS:
        raise InputError(f"the question is {tokens} tokens long; the limit is {MAX_QUESTION_TOKENS} tokens: "
                         "shorten it")
    return CheckedQuestion(question)


def with_settings(request: Request | None, settings: dict, options: tuple[type, ...] | None = None) -> Request:
    """`request` (None: Request()) with `settings` (Request field names, or a setting of one of the `options`
    dataclasses: None, the registry's, arr_coc.pipelines.OPTIONS, read when called -> values) over it, an option into the request's
    Options of its type, None its field's default (an Options a None leaves at its defaults: none, the pipeline's);
    InputError naming a setting neither has (and TypeError for a request that is no Request, e.g. a number passed
    where ARRCOCQwen.answer once took max_new_tokens)."""
    if request is not None and not isinstance(request, Request):
        raise TypeError(f"request must be a Request, got {type(request).__name__}: pass settings by name")
    names = [f.name for f in fields(Request)]
    owner = {f.name: kind for kind in (pipelines.OPTIONS if options is None else options) for f in fields(kind)}
    unknown = [name for name in settings if name not in names and name not in owner]
    if unknown:
        raise InputError(f"unknown request setting{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}: a "
                         f"Request has {', '.join([*names, *owner])}")
    request = request or Request()
    options = list(request.options)
    for kind in dict.fromkeys(owner[name] for name in settings if name in owner):
        given = {n: v for n, v in settings.items() if owner.get(n) is kind}
        new = replace(options_of(request, kind) or kind(),
                      **{n: field_default(kind, n) if v is None else v for n, v in given.items()})
        at = next((i for i, o in enumerate(options) if type(o) is kind), len(options))  # its place; a new one last
        reset = any(v is None for v in given.values()) and at_defaults(new)  # None put it back to its defaults: none
        options[at:at + 1] = [] if reset else [new]
    own = {name: value for name, value in settings.items() if name not in owner}
    return replace(request, **own, options=tuple(options))


def field_default(kind: type, name: str):
    """The default of the Options dataclass `kind`'s field `name`."""
    return next(f.default for f in fields(kind) if f.name == name)


def at_defaults(option) -> bool:
    """Whether an Options holds its defaults alone (a field defaulting to None: None; a tensor is never compared)."""
    return all(getattr(option, f.name) is None if f.default is None else getattr(option, f.name) == f.default
               for f in fields(option))


def options_of(request: Request, kind: type):
    """The request's Options of type `kind` (a pipeline's own settings), None where it has none."""
    return next((o for o in request.options if type(o) is kind), None)


def setting(request: Request, name: str, default):
    """A pipeline's own setting `name` as the request's options hold it (each name is one Options' field: the
    registry refuses two), `default` where none of them has it (the PipelineConfig's)."""
    return next((getattr(o, name) for o in request.options if hasattr(o, name)), default)


def check_request(request: Request) -> Request:
    """The request, its bounds checked, and ARR's Options' (arr_options.Options.check: its ablation an Ablation, None
    for none); the same request where nothing changed."""
    if not 1 <= int(request.max_new_tokens) <= MAX_NEW_TOKENS:
        raise InputError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}, got {request.max_new_tokens}")
    if len({type(o) for o in request.options}) != len(request.options):
        raise InputError("a request holds at most one Options of a kind (one per pipeline's settings)")
    checked = tuple(o.check() if isinstance(o, ArrOptions) else o for o in request.options)
    unchanged = all(c is o for c, o in zip(checked, request.options))
    return request if unchanged else replace(request, options=checked)


def check_stop(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise Stopped("stopped by the user")
