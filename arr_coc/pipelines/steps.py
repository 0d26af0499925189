"""
The steps every pipeline shares: an image's views, made once where a request starts (views_of); the timed
generation, a generator that yields each new token id as the engine makes it (generate); the Answer's assembly
(finish); and the stock follow-up turn of a conversation (follow_up).

Each pipeline is a generator, as nanochat's Engine.generate is: it yields token ids as they come, None now and then
while it works (a tick: a consumer that must answer often, the app's Stop, gets its turn), and last its Answer.

    steps = pipelines.load("arr").answer(parts, views_of(parts, image), question, Request(max_new_tokens=32))
    answer = finished(steps)                      # the Answer, its tokens passed over (ARRCOCQwen.answer)
    for item in steps: ...                        # int: a new token; None: a tick; Answer: the end (ARRCOCQwen.stream)
"""

import queue
import threading
from dataclasses import replace

import torch
from transformers.generation.streamers import BaseStreamer

from arr_coc.errors import InputError
from arr_coc.pipelines.answer import Answer, Compute, TokenCounts, Timings, answer_confidence
from arr_coc.pipelines.request import Parts, Request, check_stop
from arr_coc.settings import MAX_CONVERSATION_TOKENS
from arr_coc.timing import Stopwatch, TimingStreamer, peak_memory_mb, reset_peak_memory
from arr_coc.vlm.base import VLM, Generation, Prompt, StockInputs, VisualTokens
from arr_coc.vlm.views import Views, make_views

TICK_S = 0.25  # a live generation yields a tick at least this often while no token comes (prefill, a slow step)
DONE = object()  # the engine thread's last word to engine_tokens


def views_of(parts: Parts, image, max_cells: int | None = None) -> Views:
    """Every pipeline's views of an image, at the VLM's cell and min_pixels, from the settings (max_cells overrides
    the cap): made once, where a request starts (ARRCOCQwen), and handed to the pipelines."""
    s = parts.pipeline if max_cells is None else replace(parts.pipeline, max_cells=int(max_cells))  # checks bounds
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
    id (none when `silent`: a first look that may not be the last) -> (the Generation, new tokens) as the
    generator's value. prune = (K, N): FastV's pruned prefill (VLM.generate). Request.live: the tokens as the engine
    makes them (engine_tokens); otherwise after it, the engine running in the caller's thread.
    """
    timer = TimingStreamer(watch)
    check_stop(request.stop)  # stopped before its generation began (in the vision, or waiting for the VLM)
    total = inputs.length + request.max_new_tokens
    if request.converse and total > MAX_CONVERSATION_TOKENS:  # a first turn: continue_prompt checks the later ones
        raise InputError(f"this first turn would start the conversation at {total} tokens, past the "
                         f"{MAX_CONVERSATION_TOKENS} a conversation keeps: ask a shorter question or fewer new tokens")
    stop = request.stop or threading.Event()
    streamer = StopStreamer(stop, timer)

    def run(streamer: BaseStreamer) -> Generation:
        return vlm.generate(inputs, request.max_new_tokens, streamer=streamer, prune=prune, keep=request.converse)

    if request.live:
        generation = yield from engine_tokens(run, streamer, stop, silent)
    else:
        generation = run(streamer)
        if not silent:
            yield from generation.ids[0].tolist()
    return generation, timer.new_tokens


def engine_tokens(run, streamer: BaseStreamer, stop: threading.Event, silent: bool = False):
    """
    run(streamer) in a thread of its own, yielding each token id the streamer is handed as it comes (none when
    `silent`) and a tick (None) every TICK_S while none comes -> what run returned (its error raised here). The
    VLM's engine hands tokens to a callback, not as a generator: this thread is the one place that bridges the two.
    Closed early (the app's Stop): `stop` is set, so the engine ends at its next token, and the thread is awaited.
    """
    tokens, outcome = queue.Queue(), {}

    class Relay(BaseStreamer):
        def put(self, value):
            streamer.put(value)
            for t in value.view(-1).tolist():
                tokens.put(t)

        def end(self):
            streamer.end()

    def work():
        try:
            outcome["generation"] = run(Relay())
        except BaseException as e:  # raised in the caller's thread
            outcome["error"] = e
        finally:
            tokens.put(DONE)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        while (item := next_token(tokens)) is not DONE:
            if item is None or not silent:
                yield item
    except GeneratorExit:
        stop.set()
        raise
    finally:
        thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["generation"]


def next_token(tokens: queue.Queue):
    """The next item of an engine thread's queue, or None (a tick) after TICK_S without one."""
    try:
        return tokens.get(timeout=TICK_S)
    except queue.Empty:
        return None


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
def follow_up(parts: Parts, pipeline: str, last: Answer, question: str, request: Request):
    """
    A later turn of a conversation whose image was read once, in its first turn (the stock baselines and the
    reducers): the question after the last answer, as the stock chat template continues a conversation, only
    the new turn prefilled after the earlier turns' cache. ARR reads anew each turn (arr.follow_up). Yields its
    tokens, then its Answer.
    """
    vlm = parts.vlm
    watch, start = start_watch(vlm.device)
    prompt = continue_prompt(vlm, last, question, [], request)
    generation, new_tokens = yield from generate(vlm, prompt, watch, request)
    yield finish(vlm, pipeline, generation, new_tokens, TokenCounts.of_prompt(prompt.length, 0, 0), watch, start,
                 last.views, vlm.gflops([], prompt.length))
