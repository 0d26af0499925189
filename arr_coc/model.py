"""
ARRCOCQwen: the baseline and ARR-COC pipelines over one frozen Qwen-VL (Qwen2-VL, Qwen2.5-VL or Qwen3-VL).

    model = ARRCOCQwen.from_pretrained("tiny")               # or "Qwen/Qwen2-VL-2B-Instruct", a folder
    answer = model.answer(image, "What does the sign say?", pipeline="arr")
    answer.text, answer.tokens, answer.timings_ms, answer.saccades

Pipelines: "arr" (gestalt + 273 saccades out of the native-resolution candidate grid), and the stock
baselines "full" (the native view, capped at max_cells tokens: the model as users run it), "gestalt"
(low-res view) and "budget" (~529 tokens). All share one copy of the weights and one resize path.
"""

import gc
import queue
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np
import torch
from PIL import Image
from transformers import TextIteratorStreamer

from arr_coc.config import DEFAULT_MODEL, PIPELINES, PipelineConfig
from arr_coc.errors import InputError, OutOfMemory
from arr_coc.flops import prefill_gflops, vision_gflops
from arr_coc.graphs import CUDAGraphed
from arr_coc.relevance.config import ARRCOCConfig
from arr_coc.relevance.layer import ARRCOCLayer, ARRCOCOutput
from arr_coc.relevance.texture import generate_texture_array
from arr_coc.timing import TIMING_KEYS, Stopwatch, TimingStreamer, peak_memory_mb, reset_peak_memory, timed_module
from arr_coc.vlm.families import load_vlm
from arr_coc.vlm.positions import ImageBlock, raster_block
from arr_coc.vlm.qwen2_vl import Prompt, QwenVL, upsample_map
from arr_coc.vlm.tiny import TINY_MODELS
from arr_coc.vlm.views import Views, make_views

MAX_QUESTION_CHARS = 4000
WARMUP_QUESTION = "What is in this image?"  # the warm-up captures the prompt-length bucket of short questions


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
    maps: dict  # ARRCOCLayer output (its scoring forward): textures, scorer maps, weights, relevance

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
    safe_mode: bool = False  # the answer was redone with an fp32 residual stream after fp16 overflowed
    gflops: dict = field(default_factory=dict)  # {vision, prefill} estimated from the config (arr_coc.flops)
    observation: Observation | None = field(default=None, repr=False)  # what ARR read (arr only; faithfulness reuses it)

    @property
    def tokens_per_s(self) -> float:
        """Decode rate: the tokens after the first (which the prefill produces) over the decode time."""
        return max(self.new_tokens - 1, 0) / max(self.timings_ms["decode"], 1e-6) * 1000

    @property
    def ttft_ms(self) -> float:
        """Time to first token: vision, selection and prefill."""
        return sum(self.timings_ms[k] for k in ("vision", "selection", "prefill"))

    def to_json(self) -> dict:
        out = dict(answer=self.text, tokens=self.tokens, timings_ms={k: round(v, 2) for k, v in self.timings_ms.items()},
                   ttft_ms=round(self.ttft_ms, 2), peak_memory_mb=round(self.peak_memory_mb, 1),
                   new_tokens=self.new_tokens, safe_mode=self.safe_mode,
                   gflops={k: round(v, 1) for k, v in self.gflops.items()}, image_size=list(self.views.image.size),
                   native_grid=list(self.views.native_grid), candidate_grid=list(self.views.candidate_grid))
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
    def __init__(self, vlm: QwenVL, layer: ARRCOCLayer | None = None, notice: str | None = None,
                 pipeline: PipelineConfig | None = None):
        self.vlm = vlm
        self.notice = notice  # shown to users, e.g. that the tiny fallback model is running
        self.pipeline = pipeline or PipelineConfig()  # views, caps and the prior's layer: never from a checkpoint
        self.layer = layer or self.prior_layer()
        self.texture = CUDAGraphed(generate_texture_array)  # launch-bound at batch 1: replayed as one graph

    @classmethod
    def from_pretrained(cls, model: str = DEFAULT_MODEL, checkpoint: str | None = None, device: str | None = None,
                        dtype: torch.dtype | None = None, fallback_to_tiny: bool = False, engine: str = "fast",
                        pipeline: PipelineConfig | None = None) -> "ARRCOCQwen":
        """Load the VLM (hub id, folder or "tiny"); with fallback_to_tiny, an unloadable model becomes the tiny one."""
        notice = None
        try:
            vlm = load_vlm(model, device, dtype, engine)
        except Exception as e:  # no network, no cache, bad folder: the offline model keeps the app useful
            if not fallback_to_tiny or model in TINY_MODELS:
                raise
            reason = str(e).splitlines()[0][:200]
            vlm = load_vlm("tiny", device, dtype, engine)
            notice = (f"Could not load {model} ({type(e).__name__}: {reason}). Running the offline tiny Qwen2-VL "
                      "with random weights: its answers are meaningless, but the views, maps and saccades are real.")
        if model in TINY_MODELS:
            notice = (f"Running the offline {model} model ({vlm.family}) with random weights (--model {model}): its "
                      "answers are meaningless, but the views, maps and saccades are real.")
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
                                            expect_hidden_size=self.vlm.hidden_size)
        return layer.to(self.vlm.device).eval()

    # --- ARR: scoring and selection ---

    def views(self, image, max_cells: int | None = None) -> Views:
        """Every pipeline's views of an image, from the pipeline settings (max_cells overrides the cap)."""
        p = self.pipeline if max_cells is None else replace(self.pipeline, max_cells=int(max_cells))
        return make_views(image, p.gestalt_max_tokens, p.budget_tokens, p.max_cells, self.vlm.device, self.vlm.cell)

    @torch.no_grad()
    def observe(self, image, question: str, watch: Stopwatch | None = None, max_cells: int | None = None) -> Observation:
        """Gestalt encode, the gestalt-guided attention prior and the texture array: all that ARR reads."""
        question = check_question(question)
        vlm = self.vlm
        watch = watch or Stopwatch(vlm.device)
        with watch.section("vision"):
            views = self.views(image, max_cells)
            gestalt = vlm.encode_view(views.tensor("gestalt"))  # [Ng, D]
        with watch.section("selection"):
            attention = vlm.gestalt_attention(question, gestalt, views.gestalt_grid,
                                              self.pipeline.prior_layer_fraction)  # [Ng]
            prior = upsample_map(attention, views.gestalt_grid, views.candidate_grid)  # [1, GH, GW]
            highres = views.tensor("highres")  # [1, 3, H, W]
            textures = self.texture(highres, views.candidate_grid)  # [1, 13, GH, GW]
        return Observation(views, question, gestalt, vlm.question_embeds(question), prior, highres, textures)

    @torch.no_grad()
    def prepare(self, image, question: str, layer: ARRCOCLayer | None = None, watch: Stopwatch | None = None,
                max_cells: int | None = None) -> Scene:
        """Observe, then score with an ARR layer: everything up to selection."""
        watch = watch or Stopwatch(self.vlm.device)
        observation = self.observe(image, question, watch, max_cells)
        with watch.section("selection"):
            maps = self.score(observation, (layer or self.layer).graphed_score)
        return Scene(observation, maps)

    def score(self, observation: Observation, scorer: Callable[..., dict] | None = None) -> dict:
        """
        Run an ARR layer's scorers and balancer over an observation. `scorer` is called like the layer: by
        default this model's layer.graphed_score (under no_grad on CUDA, a CUDA graph replay per input shape;
        eager and differentiable when gradients are on); training passes its DDP-wrapped layer.
        """
        o = observation
        scorer = scorer or self.layer.graphed_score
        return scorer(o.textures, o.question_embeds, None, o.gestalt.unsqueeze(0), o.prior)

    def select(self, scene: Scene, strategy: str | None = None, budget: int | None = None,
               layer: ARRCOCLayer | None = None) -> ARRCOCOutput:
        """Re-select saccades from a prepared scene (no VLM work)."""
        return (layer or self.layer).select(scene.maps, scene.views.candidate_grid, budget, strategy)

    # --- ARR's LLM input: every caller (answer, training, faithfulness) builds it here ---

    def encode_saccades(self, observation: Observation, positions: torch.Tensor) -> torch.Tensor:
        """The high-res view's cells at `positions` [K, 2] through the vision tower, at their true places -> [K, D]."""
        pixels, _ = self.vlm.image_inputs(observation.highres)
        return self.vlm.encode_cells(pixels, observation.views.candidate_grid, positions)

    def arr_prompt(self, observation: Observation, saccades: torch.Tensor | None, positions: torch.Tensor,
                   answer: str | None = None) -> Prompt:
        """
        The gestalt block, the saccades [K, D] at `positions` [K, 2] as a second block (none when K = 0), the
        question, and optionally an answer to teacher-force.
        """
        views = observation.views
        images = [(observation.gestalt, raster_block(views.gestalt_grid))]
        if len(positions):
            images.append((saccades, ImageBlock(views.candidate_grid, positions.cpu())))
        return self.vlm.prompt(observation.question, images, answer=answer)

    # --- answering ---

    def answer(self, image, question: str, pipeline: str = "arr", max_new_tokens: int = 64,
               strategy: str | None = None, budget: int | None = None, layer: ARRCOCLayer | None = None,
               streamer=None, max_cells: int | None = None) -> Answer:
        """Answer one question with one pipeline; CUDA OOM becomes OutOfMemory after the memory is freed."""
        if pipeline not in PIPELINES:
            raise InputError(f"pipeline must be one of {PIPELINES}, got {pipeline!r}")
        question = check_question(question)
        if not 1 <= int(max_new_tokens) <= 1024:
            raise InputError(f"max_new_tokens must be between 1 and 1024, got {max_new_tokens}")
        try:
            if pipeline == "arr":
                return self._answer_arr(image, question, max_new_tokens, strategy, budget, layer, streamer, max_cells)
            return self._answer_stock(image, question, pipeline, max_new_tokens, streamer, max_cells)
        except torch.cuda.OutOfMemoryError:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            raise OutOfMemory(f"CUDA ran out of memory in the {pipeline} pipeline. The memory was freed: "
                              "try fewer new tokens, a smaller budget or max cells, or the gestalt baseline.") from None

    @torch.no_grad()
    def _answer_arr(self, image, question, max_new_tokens, strategy, budget, layer, streamer, max_cells) -> Answer:
        vlm, layer = self.vlm, layer or self.layer
        watch = Stopwatch(vlm.device)
        reset_peak_memory(vlm.device)
        start = watch.now()
        scene = self.prepare(image, question, layer, watch, max_cells)
        views = scene.views
        with watch.section("selection"):
            out = self.select(scene, strategy, budget, layer)
        K = out.indices.shape[1]
        with watch.section("vision"):
            saccades = self.encode_saccades(scene.observation, out.positions[0]) if K else None  # [K, D]
        prompt = self.arr_prompt(scene.observation, saccades, out.positions[0])
        ids = prompt.ids
        timer = TimingStreamer(watch, streamer)
        new = vlm.generate(max_new_tokens, streamer=timer, inputs_embeds=prompt.embeds,
                           position_ids=prompt.position_ids)
        watch.add("total", (watch.now() - start) * 1000)
        saccades = [Saccade(rank=i + 1, row=int(r), col=int(c), score=float(s), box=views.cell_box(int(r), int(c)))
                    for i, ((r, c), s) in enumerate(zip(out.positions[0].tolist(), out.scores[0].tolist()))]
        n_gestalt = scene.observation.gestalt.shape[0]
        config = vlm.model.config
        prior_layers = int(self.pipeline.prior_layer_fraction * config.text_config.num_hidden_layers)
        gflops = dict(vision=vision_gflops(config.vision_config, 4 * n_gestalt) + vision_gflops(config.vision_config, 4 * K),
                      prefill=prefill_gflops(config.text_config, ids.shape[1] - (K + 2 if K else 0), prior_layers, False)
                      + prefill_gflops(config.text_config, ids.shape[1]))
        return Answer("arr", vlm.decode(new), self._tokens(ids, n_gestalt, K), _split(watch.ms),
                      peak_memory_mb(vlm.device), timer.new_tokens, views, out, saccades, vlm.safe_mode, gflops,
                      scene.observation)

    @torch.no_grad()
    def _answer_stock(self, image, question, pipeline, max_new_tokens, streamer, max_cells) -> Answer:
        """A stock baseline: one view, the whole vision tower, one image block (the fast engine or stock generate)."""
        vlm = self.vlm
        watch = Stopwatch(vlm.device)
        reset_peak_memory(vlm.device)
        start = watch.now()
        with watch.section("vision"):
            views = self.views(image, max_cells)
            name = {"full": "native", "gestalt": "gestalt", "budget": "budget"}[pipeline]
            view, grid = views.tensor(name), views.grid(name)  # [1, 3, h, w]
        n = grid[0] * grid[1]
        if vlm.engine == "fast":
            with watch.section("vision"):
                features = vlm.encode_view(view)  # [n, D]
            prompt = vlm.prompt(question, [(features, raster_block(grid))])
            ids = prompt.ids
            timer = TimingStreamer(watch, streamer)
            new = vlm.generate(max_new_tokens, streamer=timer, inputs_embeds=prompt.embeds,
                               position_ids=prompt.position_ids)
        else:  # transformers' own path end to end: the reference the fast engine is measured against
            ids = vlm.prompt_ids(question, [n])
            pixels, grid_thw = vlm.image_inputs(view)
            timer = TimingStreamer(watch, streamer)
            before = watch.ms["vision"]
            with timed_module(vlm.visual, watch, "vision"):  # vision runs inside the stock prefill
                new = vlm.generate(max_new_tokens, streamer=timer, input_ids=ids, pixel_values=pixels,
                                   image_grid_thw=grid_thw, mm_token_type_ids=(ids == vlm.image_token_id).int())
            watch.ms["prefill"] -= watch.ms["vision"] - before  # prefill excl. the vision tower inside it
        watch.add("total", (watch.now() - start) * 1000)
        tokens = self._tokens(ids, n if pipeline == "gestalt" else 0, 0, total_visual=n)
        config = vlm.model.config
        gflops = dict(vision=vision_gflops(config.vision_config, 4 * n), prefill=prefill_gflops(config.text_config, ids.shape[1]))
        return Answer(pipeline, vlm.decode(new), tokens, _split(watch.ms), peak_memory_mb(vlm.device),
                      timer.new_tokens, views, safe_mode=vlm.safe_mode, gflops=gflops)

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
