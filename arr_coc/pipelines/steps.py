"""
The steps every pipeline shares: an image's views, made once where a request starts (views_of); the timed
generation, a generator that yields each new token id as the engine makes it (generate); the Answer's assembly
(finish); one whole view read by the stock model (read_view: the stock baselines, and ARR where the native view
holds no more cells than it would read); and the stock follow-up turn of a conversation (follow_up).

Each pipeline is a generator, as nanochat's Engine.generate is: it yields token ids as the engine makes them, None
between its stages (a tick: a consumer that must answer often, the app's Stop, gets its turn), and last its Answer.
The engine yields its tokens itself (VLM.generate_tokens), so a request runs in its caller's thread, start to end.

    steps = pipelines.answer_of("arr")(parts, views_of(parts, image), question, Request(max_new_tokens=32))
    answer = finished(steps)                      # the Answer, its tokens passed over (ARRCOCQwen.answer)
    for item in steps: ...                        # int: a new token; None: a tick; Answer: the end (ARRCOCQwen.stream)
"""

from dataclasses import replace

import torch

from arr_coc.errors import InputError
from arr_coc.pipelines.answer import Answer, Compute, TokenCounts, Timings, answer_confidence
from arr_coc.pipelines.request import Parts, Request, check_stop
from arr_coc.settings import GESTALT_PER_CELLS, MAX_CONVERSATION_TOKENS
from arr_coc.runtime.timing import Stopwatch, peak_memory_mb, reset_peak_memory, timed_module
from arr_coc.vlm.base import VLM, Generation, Prompt, StockInputs, VisualTokens
from arr_coc.vlm.views import Views, make_views


def views_of(parts: Parts, image, max_cells: int | None = None, gestalt_tokens: int | None = None) -> Views:
    """Every pipeline's views of an image, at the VLM's cell and min_pixels, from the settings (max_cells overrides
    the cap, gestalt_tokens the gestalt's size: InputError beyond max_cells // 4): made once, where a request starts
    (ARRCOCQwen), and handed to the pipelines."""
    s = parts.pipeline if max_cells is None else replace(parts.pipeline, max_cells=int(max_cells))  # checks bounds
    if gestalt_tokens is not None:
        if not 1 <= int(gestalt_tokens) <= s.max_cells // GESTALT_PER_CELLS:
            raise InputError(f"gestalt_tokens must be between 1 and max_cells // {GESTALT_PER_CELLS} = "
                             f"{s.max_cells // GESTALT_PER_CELLS}, got {gestalt_tokens}")
        s = replace(s, gestalt_max_tokens=int(gestalt_tokens))
    vlm = parts.vlm
    return make_views(image, s.gestalt_max_tokens, s.budget_tokens, s.max_cells, vlm.device, vlm.cell, vlm.min_pixels)


def finished(steps) -> Answer:
    """The Answer a pipeline's steps end with, their tokens and ticks passed over."""
    item = None
    for item in steps:
        pass
    if not isinstance(item, Answer):
        raise RuntimeError(f"a pipeline's steps ended with {type(item).__name__}, not its Answer")
    return item


def generate(vlm: VLM, inputs: Prompt | StockInputs, watch: Stopwatch, request: Request,
             prune: tuple[int, int] | None = None, silent: bool = False):
    """
    Greedy generation timed into watch (prefill up to the first token, decode after it), yielding each new token
    id as the engine makes it (a tick, None, instead when `silent`: a first look that may not be the last) -> (the
    Generation, new tokens) as the generator's value. prune = (K, N): FastV's pruned prefill (VLM.generate_tokens).
    Stop (request.stop set) raises Stopped at the next token; closed or stopped, the engine is closed at once.
    """
    check_stop(request.stop)  # stopped before its generation began (in the vision, or waiting for the VLM)
    total = inputs.length + request.max_new_tokens
    if request.converse and total > MAX_CONVERSATION_TOKENS:  # a first turn: continue_prompt checks the later ones
        raise InputError(f"this first turn would start the conversation at {total} tokens, past the "
                         f"{MAX_CONVERSATION_TOKENS} a conversation keeps: ask a shorter question or fewer new tokens")
    tokens = vlm.generate_tokens(inputs, request.max_new_tokens, prune=prune, keep=request.converse, watch=watch)
    try:
        while True:
            try:
                token = next(tokens)
            except StopIteration as end:
                generation: Generation = end.value
                return generation, generation.ids.shape[1]
            check_stop(request.stop)  # Stop pressed: the engine ends at this token
            yield None if silent else token
    finally:
        tokens.close()


@torch.no_grad()
def read_view(parts: Parts, pipeline: str, view_name: str, views: Views, question: str, request: Request,
              watch: Stopwatch, start: float, **fields):
    """
    The stock model's answer from one whole view of `views` ("native", "gestalt", "budget"), timed into the
    request's `watch` from `start`: its tokens as they come, then its Answer (`fields`: more of its fields). The fast
    engine encodes the view and prompts with its tokens; the hf engine runs transformers' own forward from pixels.
    """
    vlm = parts.vlm
    with watch.section("vision"):
        view, grid = views.tensor(view_name), views.grid(view_name)  # [1, 3, h, w]
    n = grid[0] * grid[1]
    if vlm.engine == "fast":
        with watch.section("vision"):
            tokens = vlm.encode_view(view)  # [n, D]
        yield None
        inputs = vlm.prompt(question, [tokens])
        generation, new_tokens = yield from generate(vlm, inputs, watch, request)
    else:
        inputs = vlm.stock_inputs(question, view)
        before = watch.ms["vision"]
        with timed_module(vlm.vision_tower, watch, "vision"):  # vision runs inside the stock prefill
            generation, new_tokens = yield from generate(vlm, inputs, watch, request)
        watch.ms["prefill"] -= watch.ms["vision"] - before  # prefill excl. the vision tower inside it
    tokens = TokenCounts.of_prompt(inputs.length, n if view_name == "gestalt" else 0, 0, total_visual=n)
    yield finish(vlm, pipeline, generation, new_tokens, tokens, watch, start, views, vlm.gflops([n], inputs.length),
                 **fields)


def start_watch(device) -> tuple[Stopwatch, float]:
    """A request's stopwatch and its start, with the device's peak memory reset: each Answer reports its own peak."""
    watch = Stopwatch(device)
    reset_peak_memory(device)
    return watch, watch.now()


def finish(vlm: VLM, pipeline: str, generation: Generation, new_tokens: int, tokens: TokenCounts, watch: Stopwatch,
           start: float, views: Views, compute: dict, **arr) -> Answer:
    """The Answer of a finished generation; compute: VLM.gflops's {vision, prefill}; `arr` holds ARR's own fields
    (arr, saccades, observation) or a reducer's (kept, merged)."""
    watch.add("total", (watch.now() - start) * 1000)
    return Answer(pipeline, vlm.decode(generation.ids), tokens, Timings.of(watch.ms), peak_memory_mb(vlm.device),
                  new_tokens, views, Compute(**compute), safe_mode=generation.safe_mode,
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
def follow_up(parts: Parts, pipeline: str, last: Answer, question: str, request: Request, **fields):
    """
    A later turn of a conversation whose image was read once, in its first turn (the stock baselines and the
    reducers, and ARR after a first turn that read the whole native view): the question after the last answer, as
    the stock chat template continues a conversation, only the new turn prefilled after the earlier turns' cache.
    ARR reads anew each turn (arr.follow_up). Yields its tokens, then its Answer (`fields`: more of its fields).
    """
    vlm = parts.vlm
    watch, start = start_watch(vlm.device)
    prompt = continue_prompt(vlm, last, question, [], request)
    generation, new_tokens = yield from generate(vlm, prompt, watch, request)
    yield finish(vlm, pipeline, generation, new_tokens, TokenCounts.of_prompt(prompt.length, 0, 0), watch, start,
                 last.views, vlm.gflops([], prompt.length), **fields)
