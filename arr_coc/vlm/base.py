"""
The VLM interface: the few operations ARR-COC's pipelines ask of a frozen vision-language model, and the
dataclasses they pass. Each family (qwen2_vl.py, qwen2_5_vl.py, qwen3_vl.py) implements it; no caller outside
arr_coc/vlm/ builds prompt ids, position ids or embeddings, or drives the decoder.

    tokens = vlm.encode_view(views.tensor("gestalt"))                    # VisualTokens: [Ng, D] at their places
    saccades = vlm.encode_cells(views.tensor("highres"), positions)      # any cells [K, 2] at their true places
    prompt = vlm.prompt(question, [tokens, saccades])                    # Prompt: ids, embeds, M-RoPE ids
    attention = vlm.prior_attention(question, tokens, 0.5)               # [Ng]: the question's gaze on the gestalt
    attention = vlm.prior_attention(question, tokens, 0.5, [saccades])   # ... with saccades read in between
    prior = vlm.prior_pass(question, tokens, 0.5)                        # PriorPass: + the layer's hidden states
    generation = vlm.generate(prompt, max_new_tokens=64)                 # Generation: ids [1, T], probs [T], safe_mode
    for token in vlm.generate_tokens(prompt, 64): ...                    # each new token id as the engine makes it
    first = vlm.generate(prompt, 64, keep=True)                           # a conversation's turn 1: + its History
    more = vlm.prompt("And the date?", [saccades_2], history=first.history)   # turn 2: the new tokens only
    second = vlm.generate(more, 64)                                      # continues turn 1's cache (+ its History)
    pruned = vlm.generate(prompt, 64, prune=(2, 529))                    # FastV: layers >= 2 read 529 image tokens
    scores = vlm.answer_logprobs([vlm.prompt(question, [tokens], answer="a cat")])   # teacher forcing
    looks = vlm.answer_attention(vlm.prompt(question, [tokens], answer="a cat"), [2])   # .weights [1, H, A, n_image]
    stock = vlm.stock_inputs(question, view)                             # transformers' own inputs (baselines)
    vlm.gflops(vision_cells=[256, 273], prefill_tokens=580, prior_tokens=300)
    tokens, attention = vlm.encode_view_attention(view)               # + the ViT's last-block attention per cell
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Callable

import torch

from arr_coc.vlm.positions import ImageBlock

SINK_RATIO = 10.0  # an image token whose hidden-state norm exceeds this many times the median's is a sink


@dataclass
class VisualTokens:
    """Encoded cells of one view: what the LLM reads of them (the merged tokens) and where they sit on the view."""
    features: torch.Tensor  # [K, D] merged tokens, in the LLM's width
    grid: tuple[int, int]  # (rows, cols) of the view's cell grid
    positions: torch.Tensor  # [K, 2] (row, col) of each token on that grid, in sequence order (CPU long)
    deepstack: torch.Tensor | None = None  # [k, K, D] Qwen3-VL's DeepStack features of the same cells; None elsewhere

    def __len__(self) -> int:
        return self.features.shape[0]

    @property
    def block(self) -> ImageBlock:
        """Where these tokens sit, as M-RoPE lays them out."""
        return ImageBlock(self.grid, self.positions)

    def take(self, index: torch.Tensor) -> "VisualTokens":
        """Some of the tokens [n] (indices into these K), with their positions and DeepStack features."""
        deepstack = None if self.deepstack is None else self.deepstack[:, index.to(self.deepstack.device)]
        return VisualTokens(self.features[index.to(self.features.device)], self.grid,
                            self.positions[index.cpu()], deepstack)

    @staticmethod
    def cat(parts: list["VisualTokens"]) -> "VisualTokens":
        """Encodings of cells of one view as one block, in order (a second fixation's saccades after the first's)."""
        if len({part.grid for part in parts}) != 1:
            raise ValueError(f"blocks of different grids {[part.grid for part in parts]} are not one view's cells")
        deepstack = None if parts[0].deepstack is None else torch.cat([part.deepstack for part in parts], dim=1)
        return VisualTokens(torch.cat([part.features for part in parts]), parts[0].grid,
                            torch.cat([part.positions for part in parts]), deepstack)

    def scaled(self, weights: torch.Tensor) -> "VisualTokens":
        """The tokens times weights [K, 1] (training's straight-through product); DeepStack features unchanged."""
        return replace(self, features=self.features * weights.to(self.features.dtype))


@dataclass
class VisionAttention:
    """The vision tower's last block over a whole view, per cell (raster order): what VisionZip reads."""
    received: torch.Tensor  # [K] attention the cell receives: per patch head-averaged and summed over queries, cell mean
    keys: torch.Tensor  # [K, hd] the cell's last-block key (post-rotary), averaged over heads and its 4 patches


@dataclass
class AnswerAttention:
    """Where a teacher-forced answer looks (VLM.answer_attention): per asked layer, what the teacher reads."""
    weights: torch.Tensor  # [len(layers), H, A, n] fp32: the rows predicting the A answer tokens, on the n image tokens
    norms: torch.Tensor  # [len(layers), n] fp32: each image token's hidden-state norm entering the layer (sinks: huge)
    layers: tuple[int, ...]  # the layers read, in the order asked

    def head_maps(self, sink_ratio: float = SINK_RATIO) -> torch.Tensor:
        """Each head's mean over the answer's rows, the layer's attention sinks zeroed -> [len(layers), H, n]. A sink
        is an image token whose hidden-state norm entering the layer exceeds sink_ratio x the layer's median image
        token's (a massive activation, Sun et al. 2024; the sink tokens of VLMs, Kang et al. 2025)."""
        sinks = self.norms > sink_ratio * self.norms.median(dim=-1, keepdim=True).values  # [L, n]
        return self.weights.mean(dim=2).masked_fill(sinks[:, None, :], 0.0)


@dataclass
class PriorPass:
    """The prior pass at its middle layer (VLM.prior_pass): the question's gaze on the gestalt, the layer's states."""
    attention: torch.Tensor  # [Ng] the query rows' attention to each gestalt token, mean over the readout's heads
    # and rows (arr_coc.vlm.readout; by default every head and the question's rows)
    gestalt_states: torch.Tensor  # [Ng, D] the gestalt tokens' hidden states entering that layer
    question_states: torch.Tensor  # [Lq, D] the question rows' hidden states entering it (the question to the end)


@dataclass
class SavedCache:
    """The LLM's keys and values of a conversation so far: every token read, and where the next one goes."""
    keys: list[torch.Tensor]  # per layer [1, Hkv, n, hd]
    values: list[torch.Tensor]  # per layer [1, Hkv, n, hd]
    position: int  # the M-RoPE position of the next token (the last answer's last one), t = h = w for text

    @property
    def length(self) -> int:
        return self.keys[0].shape[2]

    def to(self, device) -> "SavedCache":
        return SavedCache([t.to(device) for t in self.keys], [t.to(device) for t in self.values], self.position)


@dataclass
class History:
    """A conversation after a turn (Generation.history): what the next turn's prompt continues."""
    cache: SavedCache  # the LLM's keys and values of `ids`, and where the next token goes
    ids: torch.Tensor  # [1, n] every token read so far, turns in order (the last answer's last token excluded)
    last: int  # the last answer's last token, not yet read: the next turn begins with it (or, at an EOS, with the
    # chat template's end of turn)

    @property
    def length(self) -> int:
        """Tokens in the conversation's context so far."""
        return self.ids.shape[1]

    def to(self, device) -> "History":
        """The same conversation with its keys, values and token ids on `device` (the app keeps it on the CPU)."""
        return History(self.cache.to(device), self.ids.to(device), self.last)


@dataclass
class Prompt:
    """A chat prompt with image blocks, as the LLM reads it (built by VLM.prompt only)."""
    ids: torch.Tensor  # [1, L] token ids, each image block's pads expanded
    embeds: torch.Tensor  # [1, L, D] token embeddings, image features in place of the pads
    position_ids: torch.Tensor  # [3, 1, L] M-RoPE (t, h, w) ids
    answer_start: int  # where a teacher-forced answer begins (L when there is none)
    deepstack: torch.Tensor | None = None  # [k, 1, L, D] DeepStack features at the image tokens, zeros elsewhere
    history: History | None = None  # the conversation this prompt's turn follows (then it holds the new tokens only)

    @property
    def length(self) -> int:
        return self.ids.shape[1]


@dataclass
class StockInputs:
    """transformers' own inputs for one view and a question: what stock generate() reads from pixels."""
    input_ids: torch.Tensor  # [1, L] the prompt with the view's pads expanded
    pixel_values: torch.Tensor  # [N, C * t * p * p] the image processor's patches
    image_grid_thw: torch.Tensor  # [1, 3] (t, h, w) in patches
    mm_token_type_ids: torch.Tensor  # [1, L] 1 at image tokens

    @property
    def length(self) -> int:
        return self.input_ids.shape[1]


@dataclass
class CompileSeconds:
    """Seconds spent compiling (Inductor) before CUDA-graph captures, so far: paid at warm-up."""
    decode: float  # the decode step's compile (the first capture pays it)
    vision: float  # the vision tower's compiles


@dataclass
class Generation:
    """What one greedy generation returns."""
    ids: torch.Tensor  # [1, T] the new token ids (EOS included when reached)
    safe_mode: bool = False  # the request was redone with an fp32 residual stream after fp16 overflowed
    kept: torch.Tensor | None = None  # [N] under FastV: indices into the prompt's image tokens that layers >= K read
    probs: torch.Tensor | None = None  # [T] each new token's probability under the model (softmax of its logits)
    history: History | None = None  # the conversation after this turn (generate(keep=True), or a follow-up prompt)


class VLM(ABC):
    """The frozen VLM as the pipelines see it. Attributes every family sets: the names below.

    Three reads serve one caller each and stay here, not in a hook beside it, because each is taken inside a forward
    that differs by family: encode_view_attention (VisionZip) is the last vision block's attention, which each
    family's tower computes its own way (Qwen2.5-VL's windows, Qwen3-VL's DeepStack taps); generate_tokens' prune
    (FastV) cuts the image tokens between two decoder layers of the prefill, and answer_attention (the teacher) reads
    the attention of chosen decoder layers: a hook would have to re-enter the family's forward at the same place.
    """
    name: str  # what it was loaded from (hub id, folder, tiny model name)
    family: str  # the config's model_type, e.g. "qwen2_vl"
    hidden_size: int  # the LLM's width D
    num_layers: int  # the LLM's decoder layers (FastV's K and the prior's layer are counted in them)
    engine: str  # "fast" (our decoder) or "hf" (transformers' generate)
    tokenizer: object  # the family's tokenizer (the streamed text is decoded with it)

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abstractmethod
    def cell(self) -> int:
        """px per cell side: one merged visual token."""

    @property
    @abstractmethod
    def min_pixels(self) -> int:
        """The image processor's lower bound on a view's area, in px (stock reads small images at least this big)."""

    @property
    @abstractmethod
    def vision_tower(self) -> torch.nn.Module:
        """The vision hook: the tower's module, whose forward is every vision pass (stock generate()'s inside its
        prefill too), e.g. to time it with forward hooks."""

    @abstractmethod
    def set_block_check(self, check: Callable[[], None] | None) -> None:
        """Call check() (None: nothing) before every vision block and LLM layer that runs eagerly, the stock forward's
        included; what it raises ends the pass there (the app's Stop). A CUDA-graph replay or compiled step runs none."""

    @abstractmethod
    def set_compile(self, on: bool) -> None:
        """Whether the decode step and the vision tower are compiled (Inductor) before their CUDA-graph capture."""

    @abstractmethod
    def compile_seconds(self) -> CompileSeconds:
        """Time spent compiling so far."""

    @abstractmethod
    def encode_view(self, view) -> VisualTokens:
        """A whole view (PIL, or [1, 3, H, W] in [0, 1], a multiple of the cell) -> all its cells, raster order."""

    @abstractmethod
    def encode_view_attention(self, view) -> tuple[VisualTokens, VisionAttention]:
        """encode_view, plus the last block's attention computed explicitly (chunked over queries) per cell."""

    @abstractmethod
    def encode_cells(self, view, positions: torch.Tensor) -> VisualTokens:
        """The cells at positions [K, 2] of a view, each at its true place, as one attention sequence."""

    @abstractmethod
    def question_embeds(self, question: str) -> torch.Tensor:
        """The question's own token embeddings [1, Lq, D] (the participatory scorer's query)."""

    @abstractmethod
    def prompt(self, question: str, images: list[VisualTokens], answer: str | None = None,
               history: History | None = None) -> Prompt:
        """The chat prompt: image blocks, the question, and optionally an answer to teacher-force. With a
        conversation's history: the next user turn (its image blocks and question) after the last answer."""

    @abstractmethod
    def stock_inputs(self, question: str, view) -> StockInputs:
        """transformers' own inputs for one view and a question (the stock baselines under the hf engine)."""

    @abstractmethod
    def prior_attention(self, question: str, gestalt: VisualTokens, layer_fraction: float,
                        context: list[VisualTokens] = ()) -> torch.Tensor:
        """The prior pass: the question's attention to each gestalt token at one middle layer -> [Ng]; `context`
        are image blocks read between the gestalt and the question (a second fixation's first saccades)."""

    @abstractmethod
    def prior_pass(self, question: str, gestalt: VisualTokens, layer_fraction: float,
                   context: list[VisualTokens] = ()) -> PriorPass:
        """prior_attention's pass, with the hidden states of the gestalt and question rows entering that layer."""

    @abstractmethod
    def prior_rows(self, question: str, gestalt: VisualTokens, layers: list[int]) -> tuple[torch.Tensor, int]:
        """Every query row's attention to the gestalt per head at `layers` -> ([len(layers), H, R, Ng], the
        question's tokens among the R rows): what the prior's calibration (arr_coc.distill.prior) chooses from."""

    @abstractmethod
    def answer_logprobs(self, prompts: list[Prompt], batch_size: int = 8) -> torch.Tensor:
        """Each prompt's teacher-forced answer, mean log-probability per token -> [len(prompts)]; differentiable."""

    @abstractmethod
    def answer_attention(self, prompt: Prompt, layers: list[int]) -> AnswerAttention:
        """Where a teacher-forced answer looks: the attention of the A rows that predict its tokens (answer_start - 1
        .. L - 2) to the prompt's n image tokens, per head, at each of `layers` (computed explicitly in fp32, the rows
        chunked; the layers above the highest never run) -> AnswerAttention (weights [len(layers), H, A, n_image],
        the image tokens' hidden-state norms [len(layers), n_image]); not differentiable."""

    @abstractmethod
    def generate_tokens(self, inputs: Prompt | StockInputs, max_new_tokens: int, min_new_tokens: int | None = None,
                        prune: tuple[int, int] | None = None, keep: bool = False, watch=None):
        """Greedy decoding with self.engine (a Prompt) or stock generate() from pixels (StockInputs), a generator (as
        nanochat's Engine.generate): it yields each new token id as the engine makes it, and its value is the
        Generation. prune = (K, N): FastV on the fast engine: layers >= K read only the N image tokens that layer
        K - 1's last prompt token attends to most (Generation.kept names them). keep (or a prompt with a history): a
        conversation's turn, Generation.history what the next turn continues (the fast engine only). watch (a
        timing.Stopwatch): the engine's own "prefill" (to the first token) and "decode" time are added to it.
        Closing it early ends the generation at the token it yielded last."""

    def generate(self, inputs: Prompt | StockInputs, max_new_tokens: int, min_new_tokens: int | None = None,
                 prune: tuple[int, int] | None = None, keep: bool = False) -> Generation:
        """generate_tokens run to its end -> its Generation."""
        tokens = self.generate_tokens(inputs, max_new_tokens, min_new_tokens, prune, keep)
        while True:
            try:
                next(tokens)
            except StopIteration as end:
                return end.value

    @abstractmethod
    def decode(self, ids: torch.Tensor) -> str:
        """New ids [1, T] -> the answer text."""

    @abstractmethod
    def gflops(self, vision_cells: list[int], prefill_tokens: int, prior_tokens: int = 0,
               prior_layer_fraction: float = 0.5, pruned: tuple[int, int] | None = None) -> dict:
        """Estimated compute {vision, prefill}: one vision pass per entry of vision_cells, the prior, the prefill
        (pruned = (K, full tokens): FastV's, K layers over the full prompt and the rest over prefill_tokens)."""
