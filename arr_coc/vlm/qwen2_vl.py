"""
QwenVL: the VLM interface (base.py) over Qwen2-VL (transformers' Qwen2VLForConditionalGeneration), and the
base the other families (qwen2_5_vl.py, qwen3_vl.py) override where they differ. It joins three parts: the
vision tower (vision.py, `vlm.vision`: patches, whole-view and sparse cell encoding), the prompt layout (chat.py,
`vlm.chat`: chat template, ids, embeddings, M-RoPE ids) and the engine (decoder.py, `vlm.decoder`), and runs
the "gestalt guides gaze" prior pass, teacher forcing and generation over them. families.py loads the right one.

Everything runs the frozen model's own modules. Three small pieces are re-implemented, each pinned to the
stock code by a test: the pixel patch layout (the image processor's, but on the device), the position-id
layout (`get_rope_index`'s, for any subset of cells), and one layer's attention readout for the prior.

    vlm = load_vlm("tiny")                   # arr_coc.vlm.families; or "Qwen/Qwen2-VL-2B-Instruct", or a folder
    views = make_views(pil_image, device=vlm.device, cell=vlm.cell, min_pixels=vlm.min_pixels)
    gestalt = vlm.encode_view(views.tensor("gestalt"))       # VisualTokens [Ng, D]
"""

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from PIL import Image

from arr_coc.settings import ENGINES
from arr_coc.vlm.flops import prefill_gflops, vision_gflops
from arr_coc.runtime.timing import Stopwatch, TimingStreamer, timed_tokens
from arr_coc.vlm.base import (VLM, AnswerAttention, CompileSeconds, Generation, History, PriorPass, Prompt,
                              SavedCache, StockInputs, VisionAttention, VisualTokens)
from arr_coc.vlm.chat import CHAT_TEMPLATE, ChatLayout
from arr_coc.vlm.decoder import Decoder, Pruning
from arr_coc.vlm.readout import (DEFAULT, GENERIC_QUESTION, PriorReadout, head_weights, prior_index,
                                 relative_attention, row_weights)
from arr_coc.vlm.vision import QwenVision
from arr_coc.vlm.views import MERGE


class QwenVL(VLM):
    """The adapter over one Qwen-VL family (this class: Qwen2-VL); a family overrides what differs."""
    hf_class = "Qwen2VLForConditionalGeneration"  # the transformers class this adapter wraps
    stock_generate_takes_embeds = True  # whether stock generate() runs our embeddings as they are (the hf engine's ARR)
    default_chat_template = CHAT_TEMPLATE  # the family's template, for a folder that ships none
    vision_class = QwenVision  # the family's vision tower (vision.py; Qwen2.5-VL's windows, Qwen3-VL's DeepStack)

    @classmethod
    def chat_layout(cls, tokenizer, image_token_id: int, eos_token_ids: list[int], embeddings=None,
                    device=lambda: torch.device("cpu")) -> ChatLayout:
        """The family's prompt layout over a tokenizer (the folder's own chat template, else the family's): the
        model's own, and vLLM's front end's (arr_coc/engines/vllm_model.py: no weights there, so no embeddings)."""
        template = getattr(tokenizer, "chat_template", None) or cls.default_chat_template
        return ChatLayout(tokenizer, template, image_token_id, eos_token_ids, embeddings, device)

    def __init__(self, model, tokenizer, image_processor, name: str, engine: str = "fast"):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.model, self.tokenizer, self.image_processor, self.name = model, tokenizer, image_processor, name
        self.engine = engine  # "fast": the Decoder (static cache + CUDA graphs); "hf": stock generate()
        if self.language_model.dtype == torch.float16:  # fp16 (T4): the ViT's activations can overflow: keep it fp32
            self.visual.float()
        cfg = model.config
        self.image_token_id = cfg.image_token_id
        self.hidden_size = cfg.text_config.hidden_size
        self.num_layers = cfg.text_config.num_hidden_layers
        self.family = cfg.model_type
        eos = model.generation_config.eos_token_id
        self.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
        self.decoder = Decoder(model)
        self.chat = self.chat_layout(tokenizer, self.image_token_id, self.eos_token_ids, model.get_input_embeddings(),
                                     lambda: self.device)
        self.chat_template = self.chat.chat_template  # the folder's own, else the family's
        self.vision = self.vision_class(self.visual, image_processor, self.decoder.pool, lambda: self.decoder.use_graphs)
        self.check = None  # called before each block and layer when set (set_block_check)
        self.prior_readout: PriorReadout = DEFAULT  # which attention the prior pass reads (load_vlm sets a model's
        # calibrated one, arr_coc.vlm.readout)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def cell(self) -> int:
        """px per candidate cell: one merged token (patch_size x merge_size)."""
        return self.image_processor.patch_size * self.image_processor.merge_size

    @property
    def min_pixels(self) -> int:
        """The image processor's lower bound on a view's area (Qwen2-VL: 56 x 56 px; Qwen3-VL: 256 x 256 px)."""
        return int(self.image_processor.size["shortest_edge"])

    @property
    def dtype(self) -> torch.dtype:
        return self.language_model.dtype  # the ViT may run in fp32 beside an fp16 LLM

    @property
    def visual(self):
        return self.model.model.visual

    @property
    def language_model(self):
        return self.model.model.language_model

    @property
    def vision_tower(self) -> torch.nn.Module:
        return self.visual

    def set_block_check(self, check) -> None:
        """check() before every vision block (here and in stock generate()) and LLM layer (the decoder's loop)."""
        self.check = self.decoder.check = self.vision.check = check

    def set_compile(self, on: bool) -> None:
        self.decoder.compile_step = self.vision.graphed.compile = on

    def compile_seconds(self) -> CompileSeconds:
        return CompileSeconds(self.decoder.compile_seconds, self.vision.graphed.compile_seconds)

    @contextmanager
    def stock_checks(self):
        """While stock generate() runs its own blocks and layers: the block check before each (pre-hooks)."""
        check = self.check
        modules = [] if check is None else [*self.visual.blocks, *self.language_model.layers]
        hooks = [m.register_forward_pre_hook(lambda *_: check()) for m in modules]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    # --- vision (vision.py) ---

    def encode_cells(self, view: Image.Image | torch.Tensor, positions: torch.Tensor) -> VisualTokens:
        return self.vision.encode_cells(view, positions)

    def encode_view(self, view: Image.Image | torch.Tensor) -> VisualTokens:
        return self.vision.encode_view(view)

    def encode_view_attention(self, view: Image.Image | torch.Tensor) -> tuple[VisualTokens, VisionAttention]:
        return self.vision.encode_view_attention(view)

    # --- prompts (chat.py) ---

    def question_ids(self, question: str) -> list[int]:
        return self.chat.question_ids(question)

    def question_embeds(self, question: str) -> torch.Tensor:
        return self.chat.question_embeds(question)

    def prompt(self, question: str, images: list[VisualTokens], answer: str | None = None,
               history: History | None = None) -> Prompt:
        return self.chat.prompt(question, images, answer, history)

    def stock_inputs(self, question: str, view: Image.Image | torch.Tensor) -> StockInputs:
        """transformers' own inputs for one view and a question (the stock baselines under the hf engine)."""
        pixels, grid_thw = self.vision.image_inputs(view)
        ids = self.chat.prompt_ids(question, [int(grid_thw.prod()) // MERGE**2])
        return StockInputs(ids, pixels, grid_thw, (ids == self.image_token_id).int())

    # --- teacher forcing: the one scorer of training and faithfulness ---

    def answer_logprobs(self, prompts: list[Prompt], batch_size: int = 8) -> torch.Tensor:
        """
        Score each prompt's teacher-forced answer: the mean log-probability of its tokens -> [len(prompts)].
        Differentiable (training's loss is its negative); faithfulness calls it under no_grad. Prompts run in
        batches, right-padded: attention is causal, so no real token ever sees the padding.
        """
        scores = []
        for first in range(0, len(prompts), batch_size):
            batch = prompts[first:first + batch_size]
            lengths = [p.length for p in batch]
            answers = [p.ids[0, p.answer_start:] for p in batch]  # each [n_i], the tokens to score
            L, n = max(lengths), max(len(a) for a in answers)
            embeds = torch.cat([F.pad(p.embeds, (0, 0, 0, L - l)) for p, l in zip(batch, lengths)])  # [B, L, D]
            position_ids = torch.cat([F.pad(p.position_ids, (0, L - l)) for p, l in zip(batch, lengths)], dim=1)  # [3, B, L]
            deepstack = None if batch[0].deepstack is None else torch.cat(
                [F.pad(p.deepstack, (0, 0, 0, L - l)) for p, l in zip(batch, lengths)], dim=1)  # [k, B, L, D]
            # logits at answer_start - 1 .. L_i - 2 predict the answer's tokens answer_start .. L_i - 1
            at = torch.stack([F.pad(torch.arange(p.answer_start - 1, l - 1, device=self.device), (0, n - len(a)))
                              for p, l, a in zip(batch, lengths, answers)])  # [B, n]
            targets = torch.stack([F.pad(a, (0, n - len(a)), value=-1) for a in answers])  # [B, n], -1 past each answer
            logits = self.decoder.forward(embeds, position_ids, deepstack, at=at)  # [B, n, V] fp32
            logp = logits.log_softmax(-1).gather(-1, targets.clamp(min=0).unsqueeze(-1))[..., 0]  # [B, n]
            real = targets >= 0
            scores.append((logp * real).sum(1) / real.sum(1))
        return torch.cat(scores)

    @torch.no_grad()
    def answer_attention(self, prompt: Prompt, layers: list[int]) -> AnswerAttention:
        """
        The teacher's reading (distill/teacher.py): the attention of the rows that predict the prompt's teacher-forced
        answer tokens (answer_start - 1 .. L - 2: the last prompt token, then each answer token but the last) to
        every image token of the prompt, per head, at each of `layers`, and those tokens' hidden-state norms entering
        each layer -> AnswerAttention ([len(layers), H, A, n_image] and [len(layers), n_image], fp32).
        """
        if prompt.answer_start >= prompt.length:
            raise ValueError("answer_attention needs a prompt with a teacher-forced answer (VLM.prompt(..., answer=))")
        rows = torch.arange(prompt.answer_start - 1, prompt.length - 1, device=self.device)  # [A]
        keys = (prompt.ids[0] == self.image_token_id).nonzero()[:, 0]  # [n_image]
        weights, norms = self.decoder.answer_attention(prompt.embeds, prompt.position_ids, rows, keys, layers,
                                                       prompt.deepstack)
        return AnswerAttention(weights, norms, tuple(layers))

    # --- the participatory prior ---

    @torch.no_grad()
    def prior_attention(self, question: str, gestalt: VisualTokens, layer_fraction: float = 0.5,
                        context: list[VisualTokens] = ()) -> torch.Tensor:
        """prior_pass's attention alone -> [Ng]."""
        return self.prior_pass(question, gestalt, layer_fraction, context).attention

    @torch.no_grad()
    def prior_pass(self, question: str, gestalt: VisualTokens, layer_fraction: float = 0.5,
                   context: list[VisualTokens] = ()) -> PriorPass:
        """
        "Gestalt guides gaze": run the LLM up to the prior's layer over [prompt + gestalt [Ng, D] + question] and
        read the attention of the query rows to the gestalt tokens there; the layers above never run. Which layer,
        heads and rows is self.prior_readout's (arr_coc.vlm.readout; the default: every head over the question's
        rows, from the one after the last <|vision_end|> to the end, at layer_fraction of the depth); a relative
        readout divides by GENERIC_QUESTION's map (a second pass). -> PriorPass: that attention mass [Ng], and the
        hidden states entering the layer of the gestalt [Ng, D] and question rows [Lq, D]. `context`: image blocks
        read after the gestalt (a second fixation: the first one's saccades).
        """
        readout = self.prior_readout
        index = prior_index(readout, layer_fraction, self.num_layers)
        attention, states, start, end, query = self._prior_read(question, gestalt, context, readout, index)
        if readout.relative:
            generic = self._prior_read(GENERIC_QUESTION, gestalt, context, readout, index)[0]
            attention = relative_attention(attention[start:end], generic[start:end])
        else:
            attention = attention[start:end]
        return PriorPass(attention, states[start:end], states[query:])

    def _prior_read(self, question: str, gestalt: VisualTokens, context: list[VisualTokens], readout: PriorReadout,
                    index: int) -> tuple:
        """One prior pass at layer `index` with the readout's rows and heads -> (attention [L], states [L, D], the
        gestalt's [start, end), the first query row)."""
        prompt = self.prompt(question, [gestalt, *context])
        at = (prompt.ids[0] == self.image_token_id).nonzero()[:, 0]
        start, end, query = int(at[0]), int(at[len(gestalt) - 1]) + 1, int(at[-1]) + 2
        rows = row_weights(readout.rows, query, len(self.chat.question_ids(question)), prompt.length)  # [L]
        heads = head_weights(readout.heads, self.model.config.text_config.num_attention_heads)  # [H]
        attention, states = self.decoder.prior_attention(prompt.embeds, prompt.position_ids, rows, heads, index,
                                                         prompt.deepstack)  # [L], [L, D]
        return attention, states, start, end, query

    @torch.no_grad()
    def prior_rows(self, question: str, gestalt: VisualTokens, layers: list[int]) -> tuple[torch.Tensor, int]:
        """Every query row's attention (from the one after <|vision_end|> to the end) to the gestalt tokens, per head,
        at each of `layers` (the prior's calibration reads them all) -> ([len(layers), H, R, Ng] fp32, the
        question's own tokens among the R rows: the first ones)."""
        prompt = self.prompt(question, [gestalt])
        at = (prompt.ids[0] == self.image_token_id).nonzero()[:, 0]  # [Ng]
        rows = torch.arange(int(at[-1]) + 2, prompt.length, device=self.device)  # [R]
        weights, _ = self.decoder.answer_attention(prompt.embeds, prompt.position_ids, rows, at, layers,
                                                   prompt.deepstack)
        return weights, len(self.chat.question_ids(question))

    # --- generation ---

    @torch.no_grad()
    def generate_tokens(self, inputs: Prompt | StockInputs, max_new_tokens: int, min_new_tokens: int | None = None,
                        prune: tuple[int, int] | None = None, keep: bool = False, watch: Stopwatch | None = None):
        """
        Greedy decoding, a generator: each new token id as the engine makes it, then Generation(new ids [1, T],
        safe_mode, kept, probs [T], history) as its value. A Prompt runs on self.engine: "fast" is the Decoder
        (static cache, CUDA graphs; after an fp16 overflow it redoes the request with an fp32 residual stream and says
        so in safe_mode), "hf" stock generate() on the embeddings. StockInputs always run stock generate() from
        pixels, whose tokens come when it ends (it hands them to a callback). min_new_tokens (default:
        generation_config's) suppresses EOS until then. prune = (K, N): FastV (a Prompt on the fast engine only),
        Generation.kept the image tokens layers >= K read. keep, or a Prompt that continues a conversation
        (Prompt.history): Generation.history is the conversation after this turn (the fast engine only: it keeps
        the static cache's keys and values). watch: the engine's own time, "prefill" to the first token, "decode"
        after it (timing.timed_tokens; stock generate(): its callback, timing.TimingStreamer).
        """
        if min_new_tokens is None:
            min_new_tokens = self.model.generation_config.min_new_tokens or 0
        pruning = None if prune is None else self.pruning(inputs, *prune)
        earlier = getattr(inputs, "history", None)
        keep = keep or earlier is not None
        watch = watch or Stopwatch(self.device)
        if not (isinstance(inputs, Prompt) and self.engine == "fast"):
            generation = self.stock_generate(inputs, max_new_tokens, min_new_tokens, keep, pruning, watch)
            yield from generation.ids[0].tolist()
            return generation
        tokens = self.decoder.generate(inputs.embeds, inputs.position_ids, max_new_tokens, self.eos_token_ids,
                                       min_new_tokens, inputs.deepstack, pruning,
                                       None if earlier is None else earlier.cache, keep)
        ids, probs, safe_mode, cache = yield from timed_tokens(tokens, watch)
        history = None if cache is None else History(SavedCache(*cache), torch.cat(
            [inputs.ids.new_zeros(1, 0) if earlier is None else earlier.ids, inputs.ids, ids[:, :-1]], dim=1),
            int(ids[0, -1]))
        return Generation(ids, safe_mode, None if pruning is None else pruning.kept_candidates(), probs, history)

    def stock_generate(self, inputs: Prompt | StockInputs, max_new_tokens: int, min_new_tokens: int, keep: bool,
                       pruning: Pruning | None, watch: Stopwatch) -> Generation:
        """transformers' own generate() (the hf engine, the stock baselines from pixels), run to its end, timed by
        its callback into watch."""
        if keep:
            raise ValueError("conversations run on the fast engine: it keeps the earlier turns' keys and values")
        if pruning is not None:
            raise ValueError("FastV pruning runs on the fast engine only: its layers read two sequence lengths")
        if isinstance(inputs, Prompt):
            if inputs.deepstack is not None:
                raise ValueError("the hf engine cannot run Qwen3-VL image embeddings: stock generate() drops their "
                                 "DeepStack features; use the fast engine (the stock baselines run on both)")
            kwargs = dict(inputs_embeds=inputs.embeds, position_ids=inputs.position_ids)
        else:
            kwargs = dict(input_ids=inputs.input_ids, pixel_values=inputs.pixel_values,
                          image_grid_thw=inputs.image_grid_thw, mm_token_type_ids=inputs.mm_token_type_ids)
        length = inputs.length
        with self.stock_checks():
            out = self.model.generate(**kwargs, attention_mask=torch.ones(1, length, dtype=torch.long, device=self.device),
                                      max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=False,
                                      streamer=TimingStreamer(watch), eos_token_id=self.eos_token_ids,
                                      pad_token_id=self.tokenizer.pad_token_id, output_logits=True,
                                      return_dict_in_generate=True)
        ids = out.sequences[:, length:] if isinstance(inputs, StockInputs) else out.sequences  # [1, T]
        logits = torch.cat(out.logits).float()  # [T, V] the raw logits of each step
        return Generation(ids, probs=logits.softmax(-1).gather(1, ids[0, :, None].to(logits.device))[:, 0])

    def pruning(self, inputs: Prompt | StockInputs, layer: int, keep: int) -> Pruning:
        """FastV's Pruning of a prompt: K = layer, the image tokens the candidates, keep N of them (checked)."""
        layers, ids = self.num_layers, getattr(inputs, "ids", None)
        if not 1 <= layer < layers:
            raise ValueError(f"FastV's layer K must be between 1 and {layers - 1} (this LLM has {layers}), got {layer}")
        candidates = (inputs.input_ids if ids is None else ids)[0].eq(self.image_token_id).nonzero()[:, 0]  # [M]
        if not 1 <= keep <= len(candidates):
            raise ValueError(f"FastV keeps between 1 and {len(candidates)} image tokens here, got {keep}")
        return Pruning(layer, candidates, keep)

    def decode(self, ids: torch.Tensor) -> str:
        return self.tokenizer.decode(ids[0], skip_special_tokens=True).strip()

    # --- compute ---

    def gflops(self, vision_cells: list[int], prefill_tokens: int, prior_tokens: int = 0,
               prior_layer_fraction: float = 0.5, pruned: tuple[int, int] | None = None) -> dict:
        """
        Estimated compute (arr_coc.vlm.flops) of one vision pass per entry of vision_cells (cells = merged tokens),
        the prior pass over prior_tokens up to its layer (no logits; the calibrated readout's layer where it has
        one, twice for a relative readout), and the prefill of prefill_tokens.
        pruned = (K, full tokens): FastV's prefill, its first K layers over the full prompt, the rest over prefill_tokens.
        """
        config, text = self.model.config, self.model.config.text_config
        if prior_layer_fraction >= 1.0:  # a pass through every layer (a second look's guide), never the readout's
            layers, passes = text.num_hidden_layers, 1
        else:  # the prior's layers below the one it reads; a relative readout's generic pass counted as long
            layers = prior_index(self.prior_readout, prior_layer_fraction, text.num_hidden_layers)
            passes = 2 if self.prior_readout.relative else 1
        prior = passes * prefill_gflops(text, prior_tokens, layers, False) if prior_tokens else 0.0
        if pruned is None:
            prefill = prefill_gflops(text, prefill_tokens)
        else:
            K, full = pruned
            prefill = prefill_gflops(text, full, K, False) + prefill_gflops(text, prefill_tokens, text.num_hidden_layers - K)
        return dict(vision=sum(vision_gflops(config.vision_config, MERGE**2 * n) for n in vision_cells),
                    prefill=prior + prefill)
