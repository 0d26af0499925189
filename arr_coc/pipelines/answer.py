"""
What every pipeline takes and returns: the Parts (what of the model it reads: the VLM, the ARR layer, the texture
array, the settings), the Request (how to answer), the Answer (text, token counts, latency split, memory,
compute), and the steps the pipelines share (question check, timed generation, the Answer's assembly). What only
ARR has (its Observation, Scene, Saccade and Fixation, its visual-token count, the adaptive budget) is in
arr_coc.pipelines.arr, which imports this module and never the other way round.

    parts = Parts(vlm, layer, CUDAGraphed(generate_texture_array), PipelineConfig())   # or ARRCOCQwen(...).parts
    answer = pipelines.load("arr").answer(parts, image, question, Request(max_new_tokens=32))
    answer.text, answer.tokens, answer.timings_ms, answer.saccades, answer.confidence, answer.to_json()
    answer = pipelines.load("arr").answer(parts, image, question, Request(refixate=0.5))   # a second look below 0.5
    answer.refixated, [f.text for f in answer.fixations]
    first = pipelines.load("full").answer(parts, image, question, Request(converse=True))   # a conversation's turn 1
    second = follow_up(parts, "full", first, "And the date?", Request())   # turn 2 (arr has its own: arr.follow_up)

A Request is the one list of a request's settings: the façade takes one whole, or its fields by name over one
(with_settings), and checks it here (check_request: an ablation named by a string becomes its Ablation there;
which pipeline may take it is the registry's check, arr_coc.pipelines.check_pipeline).

    request = check_request(with_settings(Request(max_new_tokens=32), dict(budget="auto", ablation="no-gestalt")))
"""

import math
import threading
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Callable

import torch
from transformers.generation.streamers import BaseStreamer

from arr_coc.settings import MAX_CONVERSATION_TOKENS, MAX_NEW_TOKENS, MAX_QUESTION_CHARS, PipelineConfig
from arr_coc.errors import InputError, Stopped
from arr_coc.relevance import ablation as ablations
from arr_coc.relevance.ablation import NO_ABLATION, Ablation
from arr_coc.relevance.layer import ARRCOCLayer, ARRCOCOutput
from arr_coc.relevance.config import TensionSettings
from arr_coc.timing import TIMING_KEYS, Stopwatch, TimingStreamer, peak_memory_mb, reset_peak_memory
from arr_coc.vlm.base import VLM, Generation, History, Prompt, StockInputs, VisualTokens
from arr_coc.vlm.views import Views, make_views

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
    streamer: object = None  # a transformers streamer that receives the new tokens
    max_cells: int | None = None  # cap on the native-resolution grid (default: the PipelineConfig's)
    ablation: Ablation | str | None = None  # what of ARR to switch off (arr only; arr_coc.relevance.ablation; None:
    # nothing), or its name: check_request makes a name its Ablation
    fastv_layer: int | None = None  # FastV's K (fastv only; default: the PipelineConfig's)
    tensions: TensionSettings | None = None  # ARR's tensions fixed by hand, the adaptive budget's bounds (arr only)
    refixate: float | None = None  # tau: an answer less confident than this looks again (arr only; None: never)
    refixate_budget: int | None = None  # the second look's saccades K2 (default: REFIXATE_SHARE of the first look's K)
    stop: threading.Event | None = None  # once set, the request raises Stopped at its next generated token (Stop)
    converse: bool = False  # keep the conversation after the answer (Answer.history) for a follow-up question
    fresh_cells: bool = False  # arr's follow-ups: select only cells no earlier turn of the conversation read
    views: Views | None = None  # views already made of the image (a request that runs several pipelines on one image
    # makes them once: ARRCOCQwen.views); views_for reads them where they are the ones it would make, else makes its own


@dataclass
class Answer:
    pipeline: str  # a name in arr_coc.pipelines.PIPELINES
    text: str  # the generated answer
    tokens: dict  # {gestalt, saccade, text, total_visual}
    timings_ms: dict  # {vision, selection, prefill, decode, total}
    peak_memory_mb: float  # GPU peak allocated, or process peak RSS on CPU
    new_tokens: int  # generated tokens
    views: Views = field(repr=False)
    arr: ARRCOCOutput | None = field(default=None, repr=False)  # the ARR layer's output (arr only)
    saccades: list = field(default_factory=list)  # arr.Saccade, relevance-ordered (arr only)
    safe_mode: bool = False  # the answer was redone with an fp32 residual stream after fp16 overflowed
    gflops: dict = field(default_factory=dict)  # {vision, prefill} estimated from the config (arr_coc.flops)
    observation: object = field(default=None, repr=False)  # arr.Observation: what ARR read (arr only; faithfulness
    # reuses it)
    ablation: str | None = None  # the name of the ablation ARR ran under (arr only; None: none)
    kept: torch.Tensor | None = field(default=None, repr=False)  # [N, 2] (row, col) on the native grid a reducer
    # kept: the places of the image tokens its LLM read (divprune, visionzip, fastv), raster order
    merged: torch.Tensor | None = field(default=None, repr=False)  # [C, 2] the kept places that hold merged context
    # rather than their own cell (VisionZip's contextual tokens; None for the other reducers)
    confidence: float | None = None  # the least probable answer token's probability (answer_confidence)
    fixations: list = field(default_factory=list)  # arr.Fixation: under Request.refixate 1 round, or 2 if it fired
    refixate: float | None = None  # the threshold tau the answer ran under (None: refixation off)
    history: History | None = field(default=None, repr=False)  # the conversation after this answer (Request.converse)
    turn: int | None = None  # in a conversation: this answer's turn, 1 for the first (None: a single question)
    context: int | None = None  # in a conversation: the tokens of the whole conversation after this answer

    @property
    def refixated(self) -> bool:
        """Whether a second fixation fired (the first answer's confidence was below tau)."""
        return len(self.fixations) > 1

    @property
    def answer_decode_ms(self) -> float:
        """The decode time of the answer returned: after a second look, its own (timings_ms holds both looks')."""
        return self.fixations[-1].timings_ms["decode"] if self.refixated else self.timings_ms["decode"]

    @property
    def tokens_per_s(self) -> float:
        """Decode rate: the tokens after the first (which the prefill produces) over the decode time."""
        return max(self.new_tokens - 1, 0) / max(self.answer_decode_ms, 1e-6) * 1000

    @property
    def decode_ms_per_token(self) -> float:
        """Decode time per token after the first (the app's stats and run --json show it)."""
        return self.answer_decode_ms / max(self.new_tokens - 1, 1)

    @property
    def ttft_ms(self) -> float:
        """Time to first token: vision, selection and prefill (after a second look, the first answer's decode
        too: the answer returned starts only after it)."""
        first_decode = self.fixations[0].timings_ms["decode"] if self.refixated else 0.0
        return sum(self.timings_ms[k] for k in ("vision", "selection", "prefill")) + first_decode

    @property
    def prefilled(self) -> int:
        """Tokens this answer's prefill read: its whole prompt, or a follow-up's new turn only."""
        return self.tokens["text"] + self.tokens["total_visual"]

    def to_json(self) -> dict:
        out = dict(answer=self.text, tokens=self.tokens, timings_ms={k: round(v, 2) for k, v in self.timings_ms.items()},
                   ttft_ms=round(self.ttft_ms, 2), decode_ms_per_token=round(self.decode_ms_per_token, 3),
                   peak_memory_mb=round(self.peak_memory_mb, 1), new_tokens=self.new_tokens, safe_mode=self.safe_mode,
                   gflops={k: round(v, 1) for k, v in self.gflops.items()}, image_size=list(self.views.image.size),
                   native_grid=list(self.views.native_grid), candidate_grid=list(self.views.candidate_grid))
        if self.arr is not None:
            out.update(grid=list(self.arr.grid), saccades=[asdict(s) for s in self.saccades],
                       weights=[round(w, 4) for w in self.arr.weights[0].tolist()], fallback=self.arr.fallback[0],
                       strategy=self.arr.strategy, ablation=self.ablation, tensions=tension_record(self.arr))
        if self.kept is not None:  # a reducer: the (row, col) native cells its LLM read, and the merged ones
            out.update(kept=self.kept.tolist(), merged=None if self.merged is None else self.merged.tolist())
        if self.confidence is not None:
            out["confidence"] = round(self.confidence, 6)
        if self.turn is not None:
            out["conversation"] = dict(turn=self.turn, prefilled=self.prefilled, context=self.context)
        if self.refixate is not None:
            out["refixation"] = dict(tau=self.refixate, fired=self.refixated,
                                     answers=[f.text for f in self.fixations],
                                     confidences=[round(f.confidence, 6) for f in self.fixations],
                                     saccades=[f.saccades for f in self.fixations],
                                     timings_ms=[{k: round(v, 2) for k, v in f.timings_ms.items()}
                                                 for f in self.fixations])
        return out


def tension_record(out: ARRCOCOutput) -> dict:
    """The first image's tensions as run, evaluate and the app record them: e, lambda, f, K, whether K was adaptive,
    the image's structure (the busy-image test's number) and the order the saccades were fed in."""
    return dict(explore=round(float(out.explore[0]), 4), diversify=round(float(out.diversify[0]), 4),
                particularize=round(float(out.particularize[0]), 4), budget=out.budgets[0], auto_budget=out.auto_budget,
                structure=round(float(out.structure[0]), 3), saccade_order=out.saccade_order)


def check_question(question) -> str:
    if not isinstance(question, str) or not question.strip():
        raise InputError("the question is empty: type a question about the image")
    if len(question) > MAX_QUESTION_CHARS:
        raise InputError(f"the question is {len(question)} characters long; the limit is {MAX_QUESTION_CHARS}")
    return question.strip()


def with_settings(request: Request | None, settings: dict) -> Request:
    """`request` (None: Request()) with `settings` (Request field names -> values) over it; InputError naming a
    setting a Request does not have (and TypeError for a request that is no Request, e.g. a number passed where
    ARRCOCQwen.answer once took max_new_tokens)."""
    if request is not None and not isinstance(request, Request):
        raise TypeError(f"request must be a Request, got {type(request).__name__}: pass settings by name")
    names = [f.name for f in fields(Request)]
    unknown = [name for name in settings if name not in names]
    if unknown:
        raise InputError(f"unknown request setting{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}: a "
                         f"Request has {', '.join(names)}")
    return replace(request or Request(), **settings)


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
    if request.refixate_budget is not None and int(request.refixate_budget) < 1:
        raise InputError(f"refixate_budget (the second look's saccades) must be at least 1, got {request.refixate_budget}")
    return request if ablation is request.ablation else replace(request, ablation=ablation)


def answer_confidence(vlm: VLM, generation: Generation) -> float | None:
    """
    How sure the model is of its answer: the probability of its least probable token (special tokens such as
    EOS left out, as the answer's text leaves them out); 0 for an empty answer; None without probabilities.
    The minimum, not the mean: in fine print one misread character makes the answer wrong, and a mean over the
    other, easy tokens would hide it.
    """
    if generation.probs is None:
        return None
    special = torch.tensor(sorted(vlm.tokenizer.all_special_ids), device=generation.ids.device)
    text = ~torch.isin(generation.ids[0], special)  # [T]
    return float(generation.probs[text.to(generation.probs.device)].min()) if text.any() else 0.0


def views_for(vlm: VLM, settings: PipelineConfig, image, max_cells: int | None = None,
              views: Views | None = None) -> Views:
    """
    Every pipeline's views of an image, at the VLM's cell and min_pixels, from the settings (max_cells overrides the
    cap). `views`: views already made (Request.views), returned as they are where views_for made them of this very
    image (`image` is their own RGB image, views.image) at these settings, so their grids are the ones it would make;
    otherwise (another image, cap or VLM; views made elsewhere) new ones are made.
    """
    s = settings if max_cells is None else replace(settings, max_cells=int(max_cells))  # checks the bounds
    made_at = (s.gestalt_max_tokens, s.budget_tokens, s.max_cells, vlm.device, vlm.cell, vlm.min_pixels)
    if views is not None and views.image is image and views.made_at == made_at:
        return views
    views = make_views(image, *made_at)
    views.made_at = made_at
    return views


def generate(vlm: VLM, inputs: Prompt | StockInputs, watch: Stopwatch, request: Request,
             prune: tuple[int, int] | None = None) -> tuple[Generation, int]:
    """Greedy generation timed into watch (prefill up to the first token, decode after it) -> (it, new tokens).
    prune = (K, N): FastV's pruned prefill (VLM.generate)."""
    timer = TimingStreamer(watch, request.streamer)
    check_stop(request.stop)  # stopped before its generation began (in the vision, or waiting for the VLM)
    total = inputs.length + request.max_new_tokens
    if request.converse and total > MAX_CONVERSATION_TOKENS:  # a first turn: continue_prompt checks the later ones
        raise InputError(f"this first turn would start the conversation at {total} tokens, past the "
                         f"{MAX_CONVERSATION_TOKENS} a conversation keeps: ask a shorter question or fewer new tokens")
    streamer = timer if request.stop is None else StopStreamer(request.stop, timer)
    generation = vlm.generate(inputs, request.max_new_tokens, streamer=streamer, prune=prune, keep=request.converse)
    return generation, timer.new_tokens


def check_stop(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise Stopped("stopped by the user")


class StopStreamer(BaseStreamer):
    """
    Passes each token on to a streamer, and raises Stopped at the first token after `stop` is set: every decode loop
    (the Decoder's, stock generate()'s) hands each new token to its streamer, so Stop ends the loop there.
    """

    def __init__(self, stop: threading.Event, inner: BaseStreamer):
        self.stop, self.inner = stop, inner

    def put(self, value):
        check_stop(self.stop)
        self.inner.put(value)

    def end(self):
        self.inner.end()


def token_counts(prompt_length: int, gestalt: int, saccade: int, total_visual: int | None = None) -> dict:
    """{gestalt, saccade, text, total_visual} tokens of a prompt."""
    visual = gestalt + saccade if total_visual is None else total_visual
    return dict(gestalt=gestalt, saccade=saccade, text=int(prompt_length) - visual, total_visual=visual)


def latency_split(ms: dict) -> dict:
    """Fill the four-way latency split (missing parts are 0) plus the total."""
    return {k: ms.get(k, 0.0) for k in TIMING_KEYS}


def start_watch(device) -> tuple[Stopwatch, float]:
    """A request's stopwatch and its start, with the device's peak memory reset: each Answer reports its own peak."""
    watch = Stopwatch(device)
    reset_peak_memory(device)
    return watch, watch.now()


def finish(vlm: VLM, pipeline: str, generation: Generation, new_tokens: int, tokens: dict, watch: Stopwatch,
           start: float, views: Views, gflops: dict, **arr) -> Answer:
    """The Answer of a finished generation; `arr` holds ARR's own fields (arr, saccades, observation)."""
    watch.add("total", (watch.now() - start) * 1000)
    return Answer(pipeline, vlm.decode(generation.ids), tokens, latency_split(watch.ms), peak_memory_mb(vlm.device),
                  new_tokens, views, safe_mode=generation.safe_mode, gflops=gflops,
                  confidence=answer_confidence(vlm, generation), history=generation.history,
                  context=None if generation.history is None else generation.history.length + 1, **arr)


def continue_prompt(vlm: VLM, last: Answer, question: str, images: list[VisualTokens], request: Request) -> Prompt:
    """A conversation's next turn after `last` (its images, then the question); refused when the conversation
    would outgrow MAX_CONVERSATION_TOKENS."""
    if last.history is None:
        raise ValueError("a follow-up needs the answer of a conversation's turn (asked with Request(converse=True))")
    prompt = vlm.prompt(question, images, history=last.history)
    total = last.history.length + prompt.length + request.max_new_tokens
    if total > MAX_CONVERSATION_TOKENS:
        raise InputError(f"this conversation holds {last.history.length} tokens; this turn would take it to {total}, "
                         f"past the {MAX_CONVERSATION_TOKENS} a conversation keeps: start a new one")
    return prompt


@torch.no_grad()
def follow_up(parts: Parts, pipeline: str, last: Answer, question: str, request: Request) -> Answer:
    """
    A later turn of a conversation whose image was read once, in its first turn (the stock baselines and the
    reducers): the question after the last answer, as the stock chat template continues a conversation, only
    the new turn prefilled after the earlier turns' cache. ARR reads anew each turn (arr.follow_up).
    """
    vlm = parts.vlm
    watch, start = start_watch(vlm.device)
    prompt = continue_prompt(vlm, last, question, [], request)
    generation, new_tokens = generate(vlm, prompt, watch, request)
    return finish(vlm, pipeline, generation, new_tokens, token_counts(prompt.length, 0, 0), watch, start, last.views,
                  vlm.gflops([], prompt.length))
