"""
ARRCOCQwen: the baseline and ARR-COC pipelines over one frozen Qwen2-VL.

    model = ARRCOCQwen.from_pretrained("tiny")               # or "Qwen/Qwen2-VL-2B-Instruct", a folder
    answer = model.answer(image, "What does the sign say?", pipeline="arr")
    answer.text, answer.tokens, answer.timings_ms, answer.saccades

Pipelines: "arr" (gestalt + 273 saccades), and the stock baselines "full" (high-res view), "gestalt"
(low-res view) and "budget" (~529 tokens). All share one copy of the weights and one resize path.
"""

import gc
import queue
import threading
from dataclasses import asdict, dataclass, field

import torch
from transformers import TextIteratorStreamer

from arr_coc.config import BASELINES, PIPELINES, ARRCOCConfig
from arr_coc.layer import ARRCOCLayer, ARRCOCOutput
from arr_coc.qwen import (DEFAULT_MODEL, ImageBlock, InputError, QwenVL, Views, make_views, mrope_position_ids,
                          raster_block, upsample_map, view_tensor)
from arr_coc.graphs import CUDAGraphed
from arr_coc.texture import generate_texture_array
from arr_coc.timing import TIMING_KEYS, Stopwatch, TimingStreamer, peak_memory_mb, reset_peak_memory, timed_module

MAX_QUESTION_CHARS = 4000


class OutOfMemory(RuntimeError):
    """CUDA ran out of memory; the memory was freed and the model is ready for the next request."""


@dataclass
class Saccade:
    rank: int  # 1 = most relevant
    row: int  # candidate-grid row
    col: int  # candidate-grid column
    score: float  # relevance
    box: list[int]  # [x0, y0, x1, y1] in the original image's pixels


@dataclass
class Observation:
    """What the frozen VLM and the texture array make of an image and a question: ARR's inputs, before any ARR weight."""
    views: Views
    question: str
    gestalt: torch.Tensor  # [Ng, D] gestalt tokens
    question_embeds: torch.Tensor  # [1, Lq, D] the question's token embeddings
    prior: torch.Tensor  # [1, GH, GW] question->gestalt attention on the candidate grid, in [0, 1]
    highres: torch.Tensor  # [1, 3, H, W] the high-res view on the device, in [0, 1]
    textures: torch.Tensor  # [1, 13, GH, GW] texture array of the high-res view


@dataclass
class Scene:
    """An observation scored by one ARR layer, kept so a new strategy or budget re-selects instantly."""
    observation: Observation
    maps: dict  # ARRCOCLayer.score output: textures, scorer maps, weights, relevance

    @property
    def views(self) -> Views:
        return self.observation.views


@dataclass
class Answer:
    pipeline: str  # arr | full | gestalt | budget
    text: str  # the generated answer
    tokens: dict  # {gestalt, saccade, text, total_visual}
    timings_ms: dict  # {vision, selection, prefill, decode, total}
    peak_memory_mb: float  # GPU peak allocated, or process peak RSS on CPU
    new_tokens: int  # generated tokens
    views: Views = field(repr=False)
    arr: ARRCOCOutput | None = field(default=None, repr=False)  # the ARR layer's output (arr only)
    saccades: list[Saccade] = field(default_factory=list)  # relevance-ordered (arr only)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / max(self.timings_ms["decode"] + self.timings_ms["prefill"], 1e-6) * 1000

    def to_json(self) -> dict:
        out = dict(answer=self.text, tokens=self.tokens, timings_ms={k: round(v, 2) for k, v in self.timings_ms.items()},
                   peak_memory_mb=round(self.peak_memory_mb, 1), new_tokens=self.new_tokens)
        if self.arr is not None:
            out.update(grid=list(self.arr.grid), saccades=[asdict(s) for s in self.saccades],
                       weights=[round(w, 4) for w in self.arr.weights[0].tolist()], fallback=self.arr.fallback[0],
                       strategy=self.arr.strategy)
        return out


def check_question(question) -> str:
    if not isinstance(question, str) or not question.strip():
        raise InputError("the question is empty: type a question about the image")
    if len(question) > MAX_QUESTION_CHARS:
        raise InputError(f"the question is {len(question)} characters long; the limit is {MAX_QUESTION_CHARS}")
    return question.strip()


class ARRCOCQwen:
    def __init__(self, vlm: QwenVL, layer: ARRCOCLayer | None = None, notice: str | None = None):
        self.vlm = vlm
        self.notice = notice  # shown to users, e.g. that the tiny fallback model is running
        self.layer = layer or self.prior_layer()
        self.texture = CUDAGraphed(generate_texture_array)  # launch-bound at batch 1: replayed as one graph

    @classmethod
    def from_pretrained(cls, model: str = DEFAULT_MODEL, checkpoint: str | None = None, device: str | None = None,
                        dtype: torch.dtype | None = None, fallback_to_tiny: bool = False) -> "ARRCOCQwen":
        """Load the VLM (hub id, folder or "tiny"); with fallback_to_tiny, an unloadable model becomes the tiny one."""
        notice = None
        try:
            vlm = QwenVL.from_pretrained(model, device, dtype)
        except Exception as e:  # no network, no cache, bad folder: the offline model keeps the app useful
            if not fallback_to_tiny or model == "tiny":
                raise
            reason = str(e).splitlines()[0][:200]
            vlm = QwenVL.from_pretrained("tiny", device, dtype)
            notice = (f"Could not load {model} ({type(e).__name__}: {reason}). Running the offline tiny Qwen2-VL "
                      "with random weights: its answers are meaningless, but the views, maps and saccades are real.")
        if model == "tiny":
            notice = ("Running the offline tiny Qwen2-VL with random weights (--model tiny): its answers are "
                      "meaningless, but the views, maps and saccades are real.")
        self = cls(vlm, notice=notice)
        if checkpoint:
            self.layer = self.load_layer(checkpoint)
        return self

    # --- ARR layers (checkpoint A/B swaps these without touching the VLM) ---

    def prior_layer(self) -> ARRCOCLayer:
        """The untrained layer: the hand-designed priors, sized for this VLM."""
        config = ARRCOCConfig(base_model_family=self.vlm.family, hidden_size=self.vlm.hidden_size)
        return ARRCOCLayer(config).to(self.vlm.device).eval()

    def load_layer(self, checkpoint: str) -> ARRCOCLayer:
        """A checkpoint folder -> layer on this VLM's device; CheckpointError if it was made for another model."""
        layer = ARRCOCLayer.from_pretrained(checkpoint, expect_family=self.vlm.family,
                                            expect_hidden_size=self.vlm.hidden_size)
        return layer.to(self.vlm.device).eval()

    # --- ARR: scoring and selection ---

    @torch.no_grad()
    def observe(self, image, question: str, watch: Stopwatch | None = None) -> Observation:
        """Gestalt encode, the gestalt-guided attention prior and the texture array: all that ARR reads."""
        question = check_question(question)
        vlm, config = self.vlm, self.layer.config
        watch = watch or Stopwatch(vlm.device)
        views = make_views(image, config.gestalt_max_tokens, config.budget_tokens)
        with watch.section("vision"):
            pixels, grid_thw = vlm.image_inputs(views.gestalt)
            gestalt = vlm.encode_image(pixels, grid_thw)  # [Ng, D]
        with watch.section("selection"):
            ids = vlm.prompt_ids(question, [gestalt.shape[0]])  # [1, L]
            image_at = (ids[0] == vlm.image_token_id).nonzero()[:, 0]
            span = (int(image_at[0]), int(image_at[-1]) + 1)
            positions = mrope_position_ids(ids, vlm.image_token_id, [raster_block(views.gestalt_grid)])
            attention = vlm.gestalt_attention(vlm.embed(ids, [gestalt]), positions, span, span[1] + 1,
                                              config.prior_layer_fraction)  # [Ng]
            prior = upsample_map(attention, views.gestalt_grid, views.candidate_grid)  # [1, GH, GW]
            highres = view_tensor(views.highres).to(vlm.device)
            textures = self.texture(highres, views.candidate_grid)  # [1, 13, GH, GW]
        return Observation(views, question, gestalt, vlm.question_embeds(question), prior, highres, textures)

    @torch.no_grad()
    def prepare(self, image, question: str, layer: ARRCOCLayer | None = None, watch: Stopwatch | None = None) -> Scene:
        """Observe, then score with an ARR layer: everything up to selection."""
        watch = watch or Stopwatch(self.vlm.device)
        observation = self.observe(image, question, watch)
        with watch.section("selection"):
            maps = self.score(observation, layer)
        return Scene(observation, maps)

    def score(self, observation: Observation, layer: ARRCOCLayer | None = None) -> dict:
        """
        Run an ARR layer's scorers and balancer over an observation. Differentiable when gradients are on
        (training); under no_grad on CUDA it replays a CUDA graph per layer and input shape.
        """
        o = observation
        return (layer or self.layer).graphed_score(o.textures, o.question_embeds, None, o.gestalt.unsqueeze(0), o.prior)

    def select(self, scene: Scene, strategy: str | None = None, budget: int | None = None,
               layer: ARRCOCLayer | None = None) -> ARRCOCOutput:
        """Re-select saccades from a prepared scene (no VLM work)."""
        return (layer or self.layer).select(scene.maps, scene.views.candidate_grid, budget, strategy)

    # --- answering ---

    def answer(self, image, question: str, pipeline: str = "arr", max_new_tokens: int = 64,
               strategy: str | None = None, budget: int | None = None, layer: ARRCOCLayer | None = None,
               streamer=None) -> Answer:
        """Answer one question with one pipeline; CUDA OOM becomes OutOfMemory after the memory is freed."""
        if pipeline not in PIPELINES:
            raise InputError(f"pipeline must be one of {PIPELINES}, got {pipeline!r}")
        question = check_question(question)
        if not 1 <= int(max_new_tokens) <= 1024:
            raise InputError(f"max_new_tokens must be between 1 and 1024, got {max_new_tokens}")
        try:
            if pipeline == "arr":
                return self._answer_arr(image, question, max_new_tokens, strategy, budget, layer, streamer)
            return self._answer_stock(image, question, pipeline, max_new_tokens, streamer)
        except torch.cuda.OutOfMemoryError:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            raise OutOfMemory(f"CUDA ran out of memory in the {pipeline} pipeline. The memory was freed: "
                              "try fewer new tokens, a smaller budget, or the gestalt baseline.") from None

    @torch.no_grad()
    def _answer_arr(self, image, question, max_new_tokens, strategy, budget, layer, streamer) -> Answer:
        vlm, layer = self.vlm, layer or self.layer
        watch = Stopwatch(vlm.device)
        reset_peak_memory(vlm.device)
        start = watch.now()
        scene = self.prepare(image, question, layer, watch)
        views = scene.views
        with watch.section("selection"):
            out = self.select(scene, strategy, budget, layer)
        K = out.indices.shape[1]
        blocks = [raster_block(views.gestalt_grid)]
        features = [scene.observation.gestalt]
        with watch.section("vision"):
            if K > 0:
                pixels, _ = vlm.image_inputs(scene.observation.highres)
                features.append(vlm.encode_cells(pixels, views.candidate_grid, out.positions[0]))  # [K, D]
                blocks.append(ImageBlock(views.candidate_grid, out.positions[0].cpu()))
        ids = vlm.prompt_ids(scene.observation.question, [b.positions.shape[0] for b in blocks])
        positions = mrope_position_ids(ids, vlm.image_token_id, blocks)
        timer = TimingStreamer(watch, streamer)
        new = vlm.generate(max_new_tokens, streamer=timer, inputs_embeds=vlm.embed(ids, features),
                           position_ids=positions)
        watch.add("total", (watch.now() - start) * 1000)
        saccades = [Saccade(rank=i + 1, row=int(r), col=int(c), score=float(s), box=views.cell_box(int(r), int(c)))
                    for i, ((r, c), s) in enumerate(zip(out.positions[0].tolist(), out.scores[0].tolist()))]
        n_gestalt = scene.observation.gestalt.shape[0]
        return Answer("arr", vlm.decode(new), self._tokens(ids, n_gestalt, K), _split(watch.ms),
                      peak_memory_mb(vlm.device), timer.new_tokens, views, out, saccades)

    @torch.no_grad()
    def _answer_stock(self, image, question, pipeline, max_new_tokens, streamer) -> Answer:
        vlm = self.vlm
        watch = Stopwatch(vlm.device)
        reset_peak_memory(vlm.device)
        start = watch.now()
        views = make_views(image, self.layer.config.gestalt_max_tokens, self.layer.config.budget_tokens)
        view = {"full": views.highres, "gestalt": views.gestalt, "budget": views.budget}[pipeline]
        pixels, grid_thw = vlm.image_inputs(view)
        n = int(grid_thw.prod()) // 4
        ids = vlm.prompt_ids(question, [n])
        timer = TimingStreamer(watch, streamer)
        with timed_module(vlm.visual, watch, "vision"):  # vision runs inside the stock prefill
            new = vlm.generate(max_new_tokens, streamer=timer, input_ids=ids, pixel_values=pixels,
                               image_grid_thw=grid_thw, mm_token_type_ids=(ids == vlm.image_token_id).int())
        watch.ms["prefill"] = watch.ms.get("prefill", 0.0) - watch.ms.get("vision", 0.0)  # prefill excl. vision
        watch.add("total", (watch.now() - start) * 1000)
        tokens = self._tokens(ids, n if pipeline == "gestalt" else 0, 0, total_visual=n)
        return Answer(pipeline, vlm.decode(new), tokens, _split(watch.ms), peak_memory_mb(vlm.device),
                      timer.new_tokens, views)

    def _tokens(self, ids: torch.Tensor, gestalt: int, saccade: int, total_visual: int | None = None) -> dict:
        visual = gestalt + saccade if total_visual is None else total_visual
        return dict(gestalt=gestalt, saccade=saccade, text=int(ids.shape[1]) - visual, total_visual=visual)

    def stream(self, image, question: str, pipeline: str = "arr", **kwargs):
        """Yield the answer text as it grows, then the finished Answer (generation runs in a thread)."""
        streamer = TextIteratorStreamer(self.vlm.tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=600)
        result: queue.Queue = queue.Queue()

        def run():
            try:
                result.put(self.answer(image, question, pipeline, streamer=streamer, **kwargs))
            except BaseException as e:  # re-raised in the caller's thread
                result.put(e)
                streamer.end()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        text = ""
        for chunk in streamer:
            text += chunk
            yield text
        thread.join()
        outcome = result.get()
        if isinstance(outcome, BaseException):
            raise outcome
        yield outcome


def _split(ms: dict) -> dict:
    """Fill the four-way latency split (missing parts are 0) plus the total."""
    return {k: ms.get(k, 0.0) for k in TIMING_KEYS}
