"""
What every pipeline returns: the Answer (text, token counts, latency split, memory, compute), as typed fields
(TokenCounts, Timings, Compute), and how an Answer is written out as JSON (Answer.to_json: run --json, the app).
What only ARR adds (its Saccade and Fixation, its Observation) is in arr_coc.pipelines.arr_scene and .refixation;
the request a pipeline is given is in arr_coc.pipelines.request; the steps the pipelines share in
arr_coc.pipelines.steps.

    answer = model.answer(image, question, "arr")                # arr_coc.model.ARRCOCQwen
    answer.text, answer.tokens.saccade, answer.timings.prefill, answer.compute.vision, answer.ttft_ms
    answer.to_json()                                             # {"answer", "tokens", "timings_ms", "gflops", ...}
"""

from dataclasses import asdict, dataclass, field, fields

import torch

from arr_coc.relevance.layer import ARRCOCOutput
from arr_coc.vlm.base import VLM, Generation, History
from arr_coc.vlm.views import Views


@dataclass
class TokenCounts:
    """The tokens of an answer's prompt (a follow-up's: its own turn's), by kind."""
    gestalt: int  # the gestalt view's tokens the LLM read (ARR, and the gestalt baseline)
    saccade: int  # ARR's saccade tokens (both looks' under a second look)
    text: int  # every other prompt token: the chat template and the question
    total_visual: int  # every image token the LLM read (a stock view's, a reducer's kept ones; ARR's crop's too)
    crop: int = 0  # ARR's two-scale look: its crop's tokens, read by the vision tower and the prior pass, not by the
    # answer's prompt (arr_coc.pipelines.two_scale), counted in total_visual

    @classmethod
    def of_prompt(cls, prompt_length: int, gestalt: int, saccade: int, total_visual: int | None = None,
                  crop: int = 0) -> "TokenCounts":
        """A prompt of prompt_length tokens split into gestalt, saccades (or total_visual image tokens) and text;
        `crop` more visual tokens read before the prompt (the two-scale look's)."""
        visual = gestalt + saccade if total_visual is None else total_visual
        return cls(gestalt, saccade, int(prompt_length) - visual, visual + crop, crop)

    def as_dict(self) -> dict[str, int]:
        """The counts by kind, the crop's only where one was read (a one-look answer's JSON as before it)."""
        return {k: v for k, v in asdict(self).items() if k != "crop" or v}


@dataclass
class Timings:
    """An answer's latency split, ms (a part a pipeline does not run is 0)."""
    vision: float = 0.0  # the vision tower: views, gestalt, saccades or the stock view
    selection: float = 0.0  # ARR's prior pass, texture array, scorers and allocator; a reducer's selection
    prefill: float = 0.0  # up to the first generated token
    decode: float = 0.0  # after the first generated token
    total: float = 0.0  # the whole request

    @classmethod
    def of(cls, ms: dict) -> "Timings":
        """A stopwatch's sections (name -> ms) as a Timings; names it has no field for are left out."""
        return cls(**{f.name: ms.get(f.name, 0.0) for f in fields(cls)})

    def rounded(self) -> dict:
        """{vision, selection, prefill, decode, total} to 0.01 ms, as the JSON records hold them."""
        return {k: round(v, 2) for k, v in asdict(self).items()}


@dataclass
class Compute:
    """An answer's estimated compute, GFLOPs (arr_coc.vlm.flops, from the config; VLM.gflops)."""
    vision: float  # the vision tower's passes
    prefill: float  # the LLM's prefill (and ARR's prior pass up to its layer)

    @property
    def total(self) -> float:
        return self.vision + self.prefill


@dataclass
class Answer:
    pipeline: str  # a name in arr_coc.pipelines.PIPELINES
    text: str  # the generated answer
    tokens: TokenCounts  # the prompt's tokens by kind
    timings: Timings  # the latency split, ms
    peak_memory_mb: float  # GPU peak allocated, or process peak RSS on CPU
    new_tokens: int  # generated tokens
    views: Views = field(repr=False)
    compute: Compute = field(default_factory=lambda: Compute(0.0, 0.0))  # estimated GFLOPs
    arr: ARRCOCOutput | None = field(default=None, repr=False)  # the ARR layer's output (arr only)
    saccades: list = field(default_factory=list)  # arr.Saccade, relevance-ordered (arr only)
    safe_mode: bool = False  # the answer was redone with an fp32 residual stream after fp16 overflowed
    observation: object = field(default=None, repr=False)  # arr.Observation: what ARR read (arr only; faithfulness
    # reuses it)
    ablation: str | None = None  # the name of the ablation ARR ran under (arr only; None: none)
    kept: torch.Tensor | None = field(default=None, repr=False)  # [N, 2] (row, col) on the native grid a reducer
    # kept: the places of the image tokens its LLM read (divprune, visionzip, fastv), raster order
    merged: torch.Tensor | None = field(default=None, repr=False)  # [C, 2] the kept places that hold merged context
    # rather than their own cell (VisionZip's contextual tokens; None for the other reducers)
    confidence: float | None = None  # the least probable answer token's probability (answer_confidence)
    fixations: list = field(default_factory=list)  # arr.Fixation: under ARR's Options.refixate 1 round, or 2 if it fired
    refixate: float | None = None  # the threshold tau the answer ran under (None: refixation off)
    history: History | None = field(default=None, repr=False)  # the conversation after this answer (Request.converse)
    turn: int | None = None  # in a conversation: this answer's turn, 1 for the first (None: a single question)
    context: int | None = None  # in a conversation: the tokens of the whole conversation after this answer
    reads_native: str | None = None  # arr: why it read the native view whole, as full does, instead of choosing
    # saccades (the image holds no more cells than the gestalt plus the budget: arr_scene.native_reason); None: it chose

    @property
    def refixated(self) -> bool:
        """Whether a second fixation fired (the first answer's confidence was below tau)."""
        return len(self.fixations) > 1

    @property
    def answer_decode_ms(self) -> float:
        """The decode time of the answer returned: after a second look, its own (timings holds both looks')."""
        return self.fixations[-1].timings.decode if self.refixated else self.timings.decode

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
        first_decode = self.fixations[0].timings.decode if self.refixated else 0.0
        return self.timings.vision + self.timings.selection + self.timings.prefill + first_decode

    @property
    def prefilled(self) -> int:
        """Tokens this answer's prefill read: its whole prompt, or a follow-up's new turn only (a crop's are not in it)."""
        return self.tokens.text + self.tokens.total_visual - self.tokens.crop

    def to_json(self) -> dict:
        tokens = self.tokens.as_dict()
        out = dict(answer=self.text, tokens=tokens, timings_ms=self.timings.rounded(),
                   ttft_ms=round(self.ttft_ms, 2), decode_ms_per_token=round(self.decode_ms_per_token, 3),
                   peak_memory_mb=round(self.peak_memory_mb, 1), new_tokens=self.new_tokens, safe_mode=self.safe_mode,
                   gflops={k: round(v, 1) for k, v in asdict(self.compute).items()},
                   image_size=list(self.views.image.size), native_grid=list(self.views.native_grid),
                   candidate_grid=list(self.views.candidate_grid))
        if self.arr is not None:
            out.update(grid=list(self.arr.grid), saccades=[asdict(s) for s in self.saccades],
                       weights=[round(w, 4) for w in self.arr.weights[0].tolist()], fallback=self.arr.fallback[0],
                       strategy=self.arr.strategy, ablation=self.ablation, tensions=tension_record(self.arr))
        if self.kept is not None:  # a reducer: the (row, col) native cells its LLM read, and the merged ones
            out.update(kept=self.kept.tolist(), merged=None if self.merged is None else self.merged.tolist())
        if self.pipeline == "arr":  # why ARR read the whole native view (None: it chose saccades)
            out["reads_native"] = self.reads_native
        if (crop := getattr(self.observation, "crop", None)) is not None:  # the two-scale look's, in candidate cells
            out["crop"] = dict(top=crop.top, left=crop.left, height=crop.height, width=crop.width, tokens=len(crop.tokens))
        if self.confidence is not None:
            out["confidence"] = round(self.confidence, 6)
        if self.turn is not None:
            out["conversation"] = dict(turn=self.turn, prefilled=self.prefilled, context=self.context)
        if self.refixate is not None:
            out["refixation"] = dict(tau=self.refixate, fired=self.refixated,
                                     answers=[f.text for f in self.fixations],
                                     confidences=[round(f.confidence, 6) for f in self.fixations],
                                     saccades=[f.saccades for f in self.fixations],
                                     timings_ms=[f.timings.rounded() for f in self.fixations],
                                     guide=self.fixations[-1].guide)
        return out


def tension_record(out: ARRCOCOutput) -> dict:
    """The first image's tensions as run, evaluate and the app record them: e, lambda, f, K, whether K was adaptive,
    the image's structure (the busy-image test's number) and the order the saccades were fed in."""
    return dict(explore=round(float(out.explore[0]), 4), diversify=round(float(out.diversify[0]), 4),
                particularize=round(float(out.particularize[0]), 4), budget=out.budgets[0], auto_budget=out.auto_budget,
                structure=round(float(out.structure[0]), 3), saccade_order=out.saccade_order)


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
