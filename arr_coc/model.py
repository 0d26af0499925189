"""
ARRCOCQwen: the façade over one frozen Qwen-VL (Qwen2-VL, Qwen2.5-VL or Qwen3-VL), its ARR layer and the
pipeline settings. It loads them, and dispatches each request to a pipeline of the registry
(arr_coc.pipelines: arr, full, gestalt, budget, divprune, visionzip, one file each), which walks the image down once:
views -> VLM -> relevance -> VLM -> answer.

    model = ARRCOCQwen.from_pretrained("tiny")               # or "Qwen/Qwen2-VL-2B-Instruct", a folder
    answer = model.answer(image, "What does the sign say?", pipeline="arr")
    answer.text, answer.tokens, answer.timings_ms, answer.saccades
    chat = Conversation("arr", image)                        # several questions about one image, in a row
    first = model.answer(None, "What does the sign say?", conversation=chat)
    second = model.answer(None, "And the date under it?", conversation=chat, fresh_cells=True)

The Answer, Saccade, Observation and Scene dataclasses live in arr_coc.pipelines.answer and are importable from here.
"""

import gc
import queue
import threading
import time
from typing import Callable

import numpy as np
import torch
from PIL import Image
from transformers import TextIteratorStreamer

from arr_coc import pipelines
from arr_coc.config import DEFAULT_MODEL, PIPELINES, PipelineConfig
from arr_coc.errors import InputError, OutOfMemory
from arr_coc.graphs import CUDAGraphed
from arr_coc.pipelines import arr
from arr_coc.pipelines.answer import (MAX_QUESTION_CHARS, Answer, Observation, Request, Saccade, Scene,  # noqa: F401
                                      check_question, check_request, check_stop, views_for)
from arr_coc.pipelines.conversation import Conversation
from arr_coc.relevance import ablation as ablations
from arr_coc.relevance.config import ARRCOCConfig
from arr_coc.relevance.layer import ARRCOCLayer, ARRCOCOutput
from arr_coc.relevance.config import TensionSettings
from arr_coc.relevance.texture import generate_texture_array
from arr_coc.timing import Stopwatch
from arr_coc.vlm.base import VLM
from arr_coc.vlm.families import load_vlm
from arr_coc.checkpoints import POCKET, POCKET_NOTICE
from arr_coc.vlm.tiny import TINY_MODELS
from arr_coc.vlm.views import Views

WARMUP_QUESTION = "What is in this image?"  # the warm-up captures the prompt-length bucket of short questions


class ARRCOCQwen:
    def __init__(self, vlm: VLM, layer: ARRCOCLayer | None = None, notice: str | None = None,
                 pipeline: PipelineConfig | None = None):
        self.vlm = vlm
        self.notice = notice  # shown to users, e.g. that the tiny fallback model is running
        self.pipeline = pipeline or PipelineConfig()  # views, caps and the prior's layer: never from a checkpoint
        self.layer = layer or self.prior_layer()
        self.texture = CUDAGraphed(generate_texture_array)  # launch-bound at batch 1: replayed as one graph
        # one request at a time on the VLM: its decode caches and every CUDA graph's static buffers are shared, so two
        # overlapping requests (two app users, or a stopped one still winding down) would corrupt each other
        self.lock = threading.RLock()

    @classmethod
    def from_pretrained(cls, model: str = DEFAULT_MODEL, checkpoint: str | None = None, device: str | None = None,
                        dtype: torch.dtype | None = None, offline_fallback: bool = False, engine: str = "fast",
                        pipeline: PipelineConfig | None = None) -> "ARRCOCQwen":
        """Load the VLM (hub id, folder, "pocket" or "tiny"); with offline_fallback, an unloadable model becomes the
        shipped pocket model, and the notice says so."""
        notice = None
        try:
            vlm = load_vlm(model, device, dtype, engine)
        except Exception as e:  # no network, no cache, bad folder: the offline model keeps the app useful
            if not offline_fallback or model in TINY_MODELS or model == POCKET:
                raise
            reason = str(e).splitlines()[0][:200]
            vlm = load_vlm(POCKET, device, dtype, engine)
            notice = f"Could not load {model} ({type(e).__name__}: {reason}). {POCKET_NOTICE}"
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

    # --- ARR: scoring and selection (the arr pipeline's own steps, for the app and training) ---

    def views(self, image, max_cells: int | None = None) -> Views:
        """Every pipeline's views of an image, from the pipeline settings (max_cells overrides the cap)."""
        return views_for(self.vlm, self.pipeline, image, max_cells)

    @torch.no_grad()
    def observe(self, image, question: str, watch: Stopwatch | None = None, max_cells: int | None = None) -> Observation:
        """Gestalt encode, the gestalt-guided attention prior and the texture array: all that ARR reads."""
        return arr.observe(self, image, check_question(question), watch or Stopwatch(self.vlm.device), max_cells)

    @torch.no_grad()
    def prepare(self, image, question: str, layer: ARRCOCLayer | None = None, watch: Stopwatch | None = None,
                max_cells: int | None = None, ablation: str | None = None) -> Scene:
        """Observe, then score with an ARR layer (under an ablation's prior and weights): everything up to selection."""
        watch = watch or Stopwatch(self.vlm.device)
        chosen = self.ablation(ablation)
        with self.lock:
            observation = self.observe(image, question, watch, max_cells)
            with watch.section("selection"):
                maps = arr.score(observation, (layer or self.layer).graphed_score, chosen)
        return Scene(observation, maps, chosen)

    def score(self, observation: Observation, scorer: Callable[..., dict] | None = None) -> dict:
        """
        Run an ARR layer's scorers and balancer over an observation. `scorer` is called like the layer: by
        default this model's layer.graphed_score (under no_grad on CUDA, a CUDA graph replay per input shape;
        eager and differentiable when gradients are on); training passes its DDP-wrapped layer.
        """
        return arr.score(observation, scorer or self.layer.graphed_score)

    def select(self, scene: Scene, strategy: str | None = None, budget: int | str | None = None,
               layer: ARRCOCLayer | None = None, tensions: TensionSettings | None = None) -> ARRCOCOutput:
        """Re-select saccades from a prepared scene (no VLM work), as many and in the order its ablation says;
        budget "auto" is the adaptive budget, tensions fix ARR's tensions by hand (arr_coc.relevance.tensions)."""
        return arr.select(layer or self.layer, scene.maps, scene.views.candidate_grid, len(scene.observation.gestalt),
                          budget, strategy, scene.ablation or ablations.NO_ABLATION, tensions)

    @staticmethod
    def ablation(name: str | None) -> ablations.Ablation:
        """An ablation by name (None or "none": nothing removed); InputError naming the choices for another."""
        try:
            return ablations.get(name)
        except KeyError as e:
            raise InputError(e.args[0]) from None

    # --- answering ---

    def answer(self, image, question: str, pipeline: str = "arr", max_new_tokens: int = 64,
               strategy: str | None = None, budget: int | str | None = None, layer: ARRCOCLayer | None = None,
               streamer=None, max_cells: int | None = None, ablation: str | None = None,
               fastv_layer: int | None = None, tensions: TensionSettings | None = None,
               refixate: float | None = None, refixate_budget: int | None = None,
               stop: threading.Event | None = None, conversation: Conversation | None = None,
               fresh_cells: bool = False) -> Answer:
        """
        Answer one question with one pipeline; CUDA OOM becomes OutOfMemory after the memory is freed. Requests
        take turns on the VLM (self.lock); setting `stop` ends this one at its next generated token (Stopped).
        ablation names what of ARR to switch off (arr_coc.relevance.ablation.ABLATIONS; arr only); fastv_layer is
        FastV's K (fastv only). budget "auto" is ARR's adaptive budget, and tensions fix its tensions by hand
        (arr_coc.relevance.tensions); the reducers then keep as many tokens as ARR reads of that image. refixate is
        tau: ARR looks again, refixate_budget more saccades, when its answer's confidence is below it (arr only;
        None: never). conversation: ask the question as its next turn (arr_coc.pipelines.conversation): its image
        and pipeline are the ones it was made with (`image` and `pipeline` are then not read); fresh_cells: ARR's
        follow-ups read only cells no earlier turn read.
        """
        if conversation is not None:
            pipeline = conversation.pipeline
        if pipeline not in pipelines.REGISTRY:
            raise InputError(f"pipeline must be one of {tuple(pipelines.REGISTRY)}, got {pipeline!r}")
        if ablation not in (None, ablations.NO_ABLATION.name) and pipeline != "arr":
            raise InputError(f"an ablation ({ablation}) switches off part of ARR: it needs the arr pipeline, not {pipeline}")
        if refixate is not None and pipeline != "arr":
            raise InputError(f"refixation is ARR's second look: it needs the arr pipeline, not {pipeline}")
        question = check_question(question)
        chosen = self.ablation(ablation)
        request = check_request(Request(max_new_tokens, strategy, budget, layer, streamer, max_cells,
                                        ablation=None if chosen is ablations.NO_ABLATION else chosen,
                                        fastv_layer=fastv_layer, tensions=tensions, refixate=refixate,
                                        refixate_budget=refixate_budget, stop=stop, fresh_cells=fresh_cells))
        try:
            with self.lock:
                check_stop(stop)  # stopped while it waited for the VLM: nothing to run
                if conversation is not None:
                    return conversation.ask(self, question, request)
                return pipelines.load(pipeline).answer(self, image, question, request)
        except torch.cuda.OutOfMemoryError:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            raise OutOfMemory(f"CUDA ran out of memory in the {pipeline} pipeline. The memory was freed: "
                              "try fewer new tokens, a smaller budget or max cells, or the gestalt baseline.") from None

    def stream(self, image, question: str, pipeline: str = "arr", stop: threading.Event | None = None, **kwargs):
        """
        Yield the answer text as it grows, then the finished Answer (generation runs in a thread). Closing this
        generator early (the app's Stop) sets `stop`, so the generation ends at its next token instead of running on.
        """
        streamer = TextIteratorStreamer(self.vlm.tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=600)
        result: queue.Queue = queue.Queue()
        stop = stop or threading.Event()

        def run():
            try:
                result.put(self.answer(image, question, pipeline, streamer=streamer, stop=stop, **kwargs))
            except BaseException as e:  # re-raised in the caller's thread
                result.put(e)
                streamer.end()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        text = ""
        try:
            for chunk in streamer:
                text += chunk
                yield text
        except GeneratorExit:  # closed before the end: the generation stops at its next token
            stop.set()
            raise
        thread.join()
        outcome = result.get()
        if isinstance(outcome, BaseException):
            raise outcome
        yield outcome

