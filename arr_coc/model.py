"""
ARRCOCQwen: the façade over one frozen Qwen-VL (Qwen2-VL, Qwen2.5-VL or Qwen3-VL), its ARR layer and the
pipeline settings. It loads them, and dispatches each request to a pipeline of the registry
(arr_coc.pipelines: arr, full, gestalt, budget, divprune, visionzip, fastv, one file each), which walks the image
down once: views -> VLM -> relevance -> VLM -> answer. A pipeline is handed the model's Parts (the VLM, the layer,
the texture array, the settings: ARRCOCQwen.parts), never the façade itself.

    model = ARRCOCQwen.from_pretrained("tiny")               # or "Qwen/Qwen2-VL-2B-Instruct", a folder
    answer = model.answer(image, "What does the sign say?", pipeline="arr")
    answer.text, answer.tokens, answer.timings, answer.saccades
    for text_or_answer in model.stream(image, "What does the sign say?", "full"): ...   # the text as it grows
    views = model.views(image)                               # made once for a request that runs several pipelines
    answer = model.answer(views, "What does the sign say?", "full")
    chat = Conversation("arr", image)                        # several questions about one image, in a row
    first = model.answer(None, "What does the sign say?", conversation=chat)
    second = model.answer(None, "And the date under it?", conversation=chat, fresh_cells=True)
    with model.serving():                                    # the lock, Stop and OOM for a pipeline's own steps
        scene = arr_scene.prepare(model.parts, views, "What does the sign say?", Request())

Each pipeline is a generator of its tokens and then its Answer (arr_coc.pipelines.steps): answer runs one to its end,
stream hands on its text as it grows, in the caller's thread. The Answer (arr_coc.pipelines.answer), the Request
(arr_coc.pipelines.request) and ARR's Saccade, Observation and Scene (arr_coc.pipelines.arr_scene) are importable
from here.
"""

import gc
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch
from PIL import Image

from arr_coc import pipelines
from arr_coc.settings import DEFAULT_MODEL, PipelineConfig
from arr_coc.errors import OutOfMemory, Stopped
from arr_coc.runtime.graphs import CUDAGraphed
from arr_coc.pipelines import PIPELINES, check_pipeline
from arr_coc.pipelines.answer import Answer
from arr_coc.pipelines.arr_scene import Observation, Saccade, Scene  # noqa: F401
from arr_coc.pipelines.conversation import Conversation
from arr_coc.pipelines.request import (MAX_QUESTION_CHARS, Parts, CheckedQuestion, Request, check_question,  # noqa: F401
                                       check_request, check_stop, checked_question, with_settings)
from arr_coc.pipelines.steps import finished, views_of
from arr_coc.relevance.config import ARRCOCConfig
from arr_coc.relevance.layer import ARRCOCLayer
from arr_coc.relevance.texture import generate_texture_array
from arr_coc.vlm.base import VLM
from arr_coc.vlm.families import load_vlm
from arr_coc.checkpoints import POCKET, POCKET_NOTICE
from arr_coc.vlm.tiny import TINY_MODELS
from arr_coc.vlm.views import Views

WARMUP_QUESTION = "What is in this image?"  # the warm-up captures the prompt-length bucket of short questions


class StopCheck:
    """
    The VLM's block check (VLM.set_block_check: before every vision block and LLM layer that runs eagerly, the fast
    engine's loops and the stock forward's alike): once the stop of the request under way (watching) is set, the
    next block raises Stopped. Stop so frees the model within one block, not after the whole vision encode and
    prefill (a 1700x2200 page's full baseline ran on for 30 s on a CPU); decoding still ends at its next token
    (steps.generate).
    """

    def __init__(self, vlm: VLM):
        self.event: threading.Event | None = None  # the stop of the request that holds the model, if any
        vlm.set_block_check(self)

    def __call__(self) -> None:
        if self.event is not None and self.event.is_set():
            raise Stopped("stopped by the user")

    @contextmanager
    def watching(self, event: threading.Event | None):
        """Check `event` while the block runs (a request's, under the model's lock); the one before after it."""
        outer, self.event = self.event, event
        try:
            yield
        finally:
            self.event = outer


_SERVING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # VLM -> (its lock, its StopCheck)


def serving_of(vlm: VLM) -> tuple[threading.Lock, StopCheck]:
    """The VLM's one lock and one StopCheck, shared by every ARRCOCQwen over it (a second facade over the same
    weights, e.g. another layer's): the VLM holds one block check and one set of caches, so a facade of its own would
    replace the first one's check (its Stop would no longer reach the layers) and let two requests overlap."""
    if vlm not in _SERVING:
        _SERVING[vlm] = (threading.Lock(), StopCheck(vlm))
    return _SERVING[vlm]


class ARRCOCQwen:
    def __init__(self, vlm: VLM, layer: ARRCOCLayer | None = None, notice: str | None = None,
                 pipeline: PipelineConfig | None = None):
        self.vlm = vlm
        self.notice = notice  # shown to users, e.g. that the tiny fallback model is running
        self.pipeline = pipeline or PipelineConfig()  # views, caps and the prior's layer: never from a checkpoint
        self.layer = layer or self.prior_layer()
        self.texture = CUDAGraphed(generate_texture_array)  # launch-bound at batch 1: replayed as one graph
        # one request at a time on the VLM: its decode caches and every CUDA graph's static buffers are shared, so two
        # overlapping requests (two app users, or a stopped one still winding down) would corrupt each other. Not
        # reentrant: a stream holds it across its yields, and gradio resumes and closes a generator from any thread
        self.lock, self.stop_check = serving_of(vlm)  # a stopped request frees the model at its next block

    def busy(self) -> bool:
        """Whether another thread's request holds the VLM now (in the app: a stopped one, finishing its block)."""
        if not self.lock.acquire(blocking=False):
            return True
        self.lock.release()
        return False

    @classmethod
    def from_pretrained(cls, model: str = DEFAULT_MODEL, checkpoint: str | None = None, device: str | None = None,
                        dtype: torch.dtype | None = None, engine: str = "fast",
                        pipeline: PipelineConfig | None = None) -> "ARRCOCQwen":
        """Load the VLM (hub id, folder, "pocket" or "tiny"); an offline model's notice says what it is. The pocket
        model standing in for one that does not load is the commands' and the app's (cli.load_vlm)."""
        vlm = load_vlm(model, device, dtype, engine)
        notice = None
        if model in TINY_MODELS:
            notice = (f"Running the offline {model} model ({vlm.family}) with random weights (--model {model}): its "
                      "answers are meaningless, but the views, maps and saccades are real.")
        if model == POCKET:
            notice = POCKET_NOTICE
        self = cls(vlm, notice=notice, pipeline=pipeline)
        if checkpoint:
            self.layer = self.load_layer(checkpoint)
        return self

    def warmup(self) -> float:
        """
        Run every pipeline once on a square image, so the CUDA graphs of the shapes the app uses (the 16x16
        gestalt, 273 saccades, short prompts, the decode step) are captured before the first user comes.
        Other shapes are captured when first seen. Returns the seconds it took (0 off CUDA: nothing to capture).
        """
        if self.vlm.device.type != "cuda":
            return 0.0
        start = time.perf_counter()
        rng = np.random.default_rng(0)
        for size in (448, 1792):
            image = Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))
            for pipeline in PIPELINES:
                if not (pipeline in pipelines.FAST_ENGINE_ONLY and self.vlm.engine != "fast"):
                    self.answer(image, WARMUP_QUESTION, pipeline, max_new_tokens=2)
        return time.perf_counter() - start

    @property
    def parts(self) -> Parts:
        """What the pipelines read of this model, as it is now (the layer may have been swapped since)."""
        return Parts(self.vlm, self.layer, self.texture, self.pipeline)

    # --- ARR layers (checkpoint A/B swaps these without touching the VLM) ---

    def prior_layer(self) -> ARRCOCLayer:
        """The untrained layer: the hand-designed priors, sized for this VLM."""
        config = ARRCOCConfig(base_model_family=self.vlm.family, hidden_size=self.vlm.hidden_size)
        return ARRCOCLayer(config).to(self.vlm.device).eval()

    def load_layer(self, checkpoint: str) -> ARRCOCLayer:
        """A checkpoint folder -> layer on this VLM's device; CheckpointError if it was made for another model."""
        layer = ARRCOCLayer.from_pretrained(checkpoint, expect_family=self.vlm.family,
                                            expect_hidden_size=self.vlm.hidden_size, expect_model=self.vlm.name)
        return layer.to(self.vlm.device).eval()

    def check_question(self, question) -> CheckedQuestion:
        """The question checked for this model (checked_question: its text, then its length in this model's tokens)
        before any VLM work -> the question, stripped; one checked already (a CheckedQuestion) as it is: a request's
        question is checked once, however many pipelines it runs."""
        return question if isinstance(question, CheckedQuestion) else checked_question(question, self.vlm.question_ids)

    def views(self, image, max_cells: int | None = None, gestalt_tokens: int | None = None) -> Views:
        """Every pipeline's views of an image, from the pipeline settings (max_cells overrides the cap, gestalt_tokens
        the gestalt's size): a request that runs several pipelines on one image makes them once and passes them to
        each as its image."""
        return views_of(self.parts, image, max_cells, gestalt_tokens)

    @contextmanager
    def serving(self, pipeline: str = "arr", stop: threading.Event | None = None):
        """
        The model held for one request (self.lock: requests take turns), `stop` watched at every vision block and LLM
        layer (StopCheck), and CUDA OOM made OutOfMemory once the memory is freed: around answer and stream, and
        around a pipeline's own steps called with self.parts (the app's Microscope: arr_scene.prepare).
        """
        try:
            with self.lock, self.stop_check.watching(stop):
                check_stop(stop)  # stopped while it waited for the VLM: nothing to run
                yield
        except torch.cuda.OutOfMemoryError:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            raise OutOfMemory(f"CUDA ran out of memory in the {pipeline} pipeline. The memory was freed: "
                              "try fewer new tokens, a smaller budget or max cells, or the gestalt baseline.") from None

    def steps(self, image, question: str, pipeline: str, request: Request, conversation: Conversation | None = None):
        """
        A request checked and dispatched -> (its pipeline's name, the request, the pipeline's steps: a generator of
        its tokens and then its Answer, not started). `image`: an image, or its Views already made (self.views); the
        views are made here otherwise, once (none for a conversation's later turns, which read the first's).
        """
        if conversation is not None:
            pipeline = conversation.pipeline
        check_pipeline(pipeline, request)
        question = self.check_question(question)
        request = check_request(request)
        first = conversation is None or not conversation.answers
        if first and not isinstance(image, Views):
            image = self.views(conversation.image if image is None and conversation else image, request.max_cells,
                               request.gestalt_tokens)
        if conversation is not None:
            return pipeline, request, conversation.ask(self.parts, image if first else None, question, request)
        return pipeline, request, pipelines.answer_of(pipeline)(self.parts, image, question, request)

    # --- answering ---

    def answer(self, image, question: str, pipeline: str = "arr", request: Request | None = None, *,
               conversation: Conversation | None = None, **settings) -> Answer:
        """
        Answer one question with one pipeline, as `request` (arr_coc.pipelines.request.Request; None: the defaults)
        with `settings` over it: any of its fields by name (max_new_tokens=32, budget="auto", ablation="no-gestalt",
        refixate=0.5, ..., or a pipeline's own: fastv_layer=3, pixelprune_tau=4, into request.options; InputError
        naming one it does not have), so a Request's fields are listed once, there.
        `image`: an image, or its views (self.views). CUDA OOM becomes OutOfMemory after the memory is freed. Requests
        take turns on the VLM (self.lock); setting the request's `stop` ends it at its next vision block, LLM layer or
        token (Stopped). An ablation (arr_coc.relevance.ablation, an Ablation or its name) and a second look
        (refixate) are ARR's: other pipelines refuse them. conversation: ask the question as its next turn
        (arr_coc.pipelines.conversation): its image and pipeline are the ones it was made with (`image` may be its
        views for the first turn; `pipeline` is not read).
        """
        pipeline, request, steps = self.steps(image, question, pipeline,
                                                with_settings(request, settings), conversation)
        with self.serving(pipeline, request.stop):
            return finished(steps)

    def stream(self, image, question: str, pipeline: str = "arr", request: Request | None = None, *,
               conversation: Conversation | None = None, **settings):
        """
        Yield the answer text as it grows, token by token as the engine makes them (again, unchanged, at a tick: the
        pipeline yields one between its stages), then the finished Answer; the request and its settings as answer
        takes them. All in the caller's thread: the engine yields its tokens (VLM.generate_tokens). Closing this
        generator early (the app's Stop, between two yields) sets the request's `stop` (one is made if it has none)
        and closes the pipeline and its engine, which lets go of the model.
        """
        request = with_settings(request, settings)
        request = replace(request, stop=request.stop or threading.Event())
        pipeline, request, steps = self.steps(image, question, pipeline, request, conversation)
        ids, text, answered = [], "", False
        with self.serving(pipeline, request.stop):
            try:
                for item in steps:
                    answered = isinstance(item, Answer)
                    if not answered:
                        ids += [] if item is None else [item]
                        text = grown(self.vlm.tokenizer, ids, text)
                    yield item if answered else text
            finally:  # closed before the end: the request stops at its next block or token before the model is let go
                if not answered:
                    request.stop.set()
                steps.close()


def grown(tokenizer, ids: list[int], text: str) -> str:
    """The text of `ids` so far (special tokens left out), or `text` while the last token ends in part of a character."""
    new = tokenizer.decode(ids, skip_special_tokens=True)
    return text if new.endswith("\ufffd") else new
