"""
What a pipeline is given: the Parts (what of the model it reads: the VLM, the ARR layer, the texture array, the
settings) and the Request (how to answer: the one list of a request's settings), with the request's checks. The
façade takes a Request whole, or its fields by name over one (with_settings), and checks it here (check_request:
an ablation named by a string becomes its Ablation there; which pipeline may take it is the registry's check,
arr_coc.pipelines.check_pipeline).

    request = check_request(with_settings(Request(max_new_tokens=32), dict(budget="auto", ablation="no-gestalt")))
    parts = Parts(vlm, layer, CUDAGraphed(generate_texture_array), PipelineConfig())   # or ARRCOCQwen(...).parts
"""

import math
import threading
from dataclasses import dataclass, fields, replace
from typing import Callable

import torch

from arr_coc.errors import InputError, Stopped, check_text
from arr_coc.relevance import ablation as ablations
from arr_coc.relevance.ablation import NO_ABLATION, Ablation
from arr_coc.relevance.config import TensionSettings
from arr_coc.relevance.layer import ARRCOCLayer
from arr_coc.settings import (CROP_TOKENS, LOOKS, MAX_CELLS, MAX_NEW_TOKENS, MAX_QUESTION_CHARS,
                              MAX_QUESTION_TOKENS, MIN_CROP_TOKENS, REFIXATE_GUIDES, PipelineConfig)
from arr_coc.vlm.base import VLM


@dataclass
class Parts:
    """What of the model a pipeline reads: ARRCOCQwen (arr_coc.model) builds it and hands it down (ARRCOCQwen.parts);
    the pipelines know nothing of the façade above them."""
    vlm: VLM  # the frozen Qwen-VL: one copy of the weights for every pipeline
    layer: ARRCOCLayer  # the ARR layer a request scores with unless it names its own (Request.layer)
    texture: Callable[..., torch.Tensor]  # the texture array (generate_texture_array, CUDA-graphed): [1, 3, H, W],
    # (GH, GW) -> [1, 13, GH, GW]
    pipeline: PipelineConfig  # views, caps, the prior's layer, FastV's K: never from a checkpoint


@dataclass
class Request:
    """How to answer one question (every field optional; None: the model's own setting)."""
    max_new_tokens: int = 64  # at most this many generated tokens
    strategy: str | None = None  # ARR's allocation strategy (arr only; default: the layer's)
    budget: int | str | None = None  # ARR's saccade count, or "auto": the adaptive budget (arr only; default: the layer's)
    layer: ARRCOCLayer | None = None  # the ARR layer to score with (arr only; default: the model's)
    max_cells: int | None = None  # cap on the native-resolution grid (default: the PipelineConfig's): where the
    # request's views are made
    gestalt_tokens: int | None = None  # at most this many gestalt tokens, 1 to max_cells // 4 (default: the
    # PipelineConfig's 256; 576 is Q-Zoom's coarse pass): the views' gestalt grid, which every pipeline reads
    ablation: Ablation | str | None = None  # what of ARR to switch off (arr only; arr_coc.relevance.ablation; None:
    # nothing), or its name: check_request makes a name its Ablation
    options: tuple = ()  # the pipelines' own settings, each an Options of a pipeline's record (arr_coc.pipelines.
    # declared: FastV's K, PixelPrune's tau), at most one of a type: a pipeline reads its own (setting; none of its
    # type: the PipelineConfig's), the others pass it by (one request serves evaluate's every row)
    tensions: TensionSettings | None = None  # ARR's tensions fixed by hand, the adaptive budget's bounds (arr only)
    refixate: float | None = None  # tau: an answer less confident than this looks again (arr only; None: never)
    refixate_budget: int | None = None  # the second look's saccades K2 (default: REFIXATE_SHARE of the first look's K)
    refixate_guide: str = REFIXATE_GUIDES[0]  # what points the second look (one of REFIXATE_GUIDES): "prior", the prior pass
    # again with the first saccades in its context; "attention", where the first answer's own attention fell
    look: str = LOOKS[0]  # how ARR's first look chooses its cells (one of LOOKS): "one", the gestalt's prior alone;
    # "two_scale", the region around the relevance peak re-read as a crop whose own prior chooses the cells inside it
    # (arr only; arr_coc.pipelines.two_scale); the reducers at ARR's count count the crop's tokens too
    crop_tokens: int = CROP_TOKENS  # the two-scale look's crop: this many native cells, read one token a cell
    stop: threading.Event | None = None  # once set, the request raises Stopped at its next generated token (Stop)
    converse: bool = False  # keep the conversation after the answer (Answer.history) for a follow-up question
    fresh_cells: bool = False  # arr's follow-ups: select only cells no earlier turn of the conversation read
    include: torch.Tensor | None = None  # [GH, GW] bool on the views' candidate grid: cells ARR's first look must
    # read, the rest of its budget chosen as ever, the most relevant of them where they outnumber the budget (arr
    # only; evaluate's oracle row forces the asked box's cells in)
    upsample: bool = False  # arr: choose saccades even where the native view holds no more cells than its LLM
    # would read (the candidate grid then upsampled past the image: the warm-up, studies of selection on small
    # images); default: read the native view whole there, as full does (Answer.reads_native says why)


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


def with_settings(request: Request | None, settings: dict, options: tuple[type, ...] = ()) -> Request:
    """`request` (None: Request()) with `settings` (Request field names, or a setting of one of the `options`
    dataclasses: the pipelines' Options, arr_coc.pipelines.OPTIONS -> values) over it, an option into the request's
    Options of its type (None: none, the PipelineConfig's); InputError naming a setting neither has (and TypeError
    for a request that is no Request, e.g. a number passed where ARRCOCQwen.answer once took max_new_tokens)."""
    if request is not None and not isinstance(request, Request):
        raise TypeError(f"request must be a Request, got {type(request).__name__}: pass settings by name")
    names = [f.name for f in fields(Request)]
    owner = {f.name: kind for kind in options for f in fields(kind)}
    unknown = [name for name in settings if name not in names and name not in owner]
    if unknown:
        raise InputError(f"unknown request setting{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}: a "
                         f"Request has {', '.join([*names, *owner])}")
    request = request or Request()
    chosen = tuple(dict.fromkeys(owner[name] for name in settings if name in owner))
    given = [replace(options_of(request, kind) or kind(), **values) for kind in chosen
             if (values := {n: v for n, v in settings.items() if owner.get(n) is kind and v is not None})]
    kept = tuple(o for o in request.options if type(o) not in chosen)  # an option set to None: its default again
    own = {name: value for name, value in settings.items() if name not in owner}
    return replace(request, **own, **({"options": kept + tuple(given)} if chosen else {}))


def options_of(request: Request, kind: type):
    """The request's Options of type `kind` (a pipeline's own settings), None where it has none."""
    return next((o for o in request.options if type(o) is kind), None)


def setting(request: Request, name: str, default):
    """A pipeline's own setting `name` as the request's options hold it (each name is one Options' field: the
    registry refuses two), `default` where none of them has it (the PipelineConfig's)."""
    return next((getattr(o, name) for o in request.options if hasattr(o, name)), default)


def ablation_named(ablation: Ablation | str | None) -> Ablation:
    """An ablation as it is, or by name (None or "none": NO_ABLATION, nothing removed); InputError naming the
    choices for an unknown name."""
    if isinstance(ablation, Ablation):
        return ablation
    try:
        return ablations.get(ablation)
    except KeyError as e:
        raise InputError(e.args[0]) from None


def check_request(request: Request) -> Request:
    """The request, its ablation an Ablation (None for none: NO_ABLATION's name, or the object), its bounds checked."""
    ablation = ablation_named(request.ablation)
    ablation = None if ablation is NO_ABLATION else ablation
    if not 1 <= int(request.max_new_tokens) <= MAX_NEW_TOKENS:
        raise InputError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}, got {request.max_new_tokens}")
    if request.refixate is not None and not (math.isfinite(request.refixate) and 0 <= request.refixate <= 1):
        raise InputError(f"refixate (tau) is a confidence between 0 and 1, got {request.refixate}")
    if len({type(o) for o in request.options}) != len(request.options):
        raise InputError("a request holds at most one Options of a kind (one per pipeline's settings)")
    if request.refixate_guide not in REFIXATE_GUIDES:
        raise InputError(f"refixate_guide must be one of {', '.join(REFIXATE_GUIDES)}, got {request.refixate_guide!r}")
    if request.refixate_budget is not None and int(request.refixate_budget) < 1:
        raise InputError(f"refixate_budget (the second look's saccades) must be at least 1, got {request.refixate_budget}")
    if request.look not in LOOKS:
        raise InputError(f"look must be one of {', '.join(LOOKS)}, got {request.look!r}")
    if not MIN_CROP_TOKENS <= int(request.crop_tokens) <= MAX_CELLS:
        raise InputError(f"crop_tokens (the two-scale look's crop) must be between {MIN_CROP_TOKENS} and {MAX_CELLS}, "
                         f"got {request.crop_tokens}")
    return request if ablation is request.ablation else replace(request, ablation=ablation)


def check_stop(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise Stopped("stopped by the user")
