"""
QwenVL: the VLM interface (base.py) over Qwen2-VL (transformers' Qwen2VLForConditionalGeneration), and the
base the other families (qwen2_5_vl.py, qwen3_vl.py) override where they differ: patches, whole-view and
sparse cell encoding, prompts, the "gestalt guides gaze" prior pass, teacher forcing, generation, and the
family's chat template. families.py loads the right one.

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
from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision

from arr_coc.settings import ENGINES
from arr_coc.flops import prefill_gflops, vision_gflops
from arr_coc.graphs import CUDAGraphed
from arr_coc.vlm.attention import AttentionProbe
from arr_coc.vlm.base import (VLM, CompileSeconds, Generation, History, Prompt, SavedCache, StockInputs, VisionAttention,
                              VisualTokens)
from arr_coc.vlm.decoder import Decoder, Pruning
from arr_coc.vlm.positions import ImageBlock, mrope_position_ids, raster_block
from arr_coc.vlm.views import MERGE, view_tensor

GRAPHED_CELLS = 1024  # vision calls of at most this many cells replay as CUDA graphs (gestalt, saccades, budget)
QUESTION_SLOT = "\x00question\x00"  # stands in for the question while the chat template is rendered
ANSWER_SLOT = "\x00answer\x00"  # stands in for an earlier answer while a follow-up turn's template is rendered
END_OF_TURN = "<|im_end|>"  # closes a teacher-forced answer, as the model closes its own

# The Qwen2-VL chat template (as on the hub's Qwen2-VL-*-Instruct repos); Qwen2.5-VL's repos ship the same one.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def image_patches(pixels: torch.Tensor, image_processor) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Views [B, 3, H, W] in [0, 1] (one size, a multiple of patch x merge px) -> pixel patches [B*N, C*t*p*p] and
    grid_thw [B, 3], laid out as the stock image processor lays them out (normalised, merge-window order, the
    still image in both temporal frames), on the views' device. The adapters and pocket training share it.
    """
    ip, (B, C, H, W) = image_processor, pixels.shape
    mean = torch.tensor(ip.image_mean, device=pixels.device).view(1, 3, 1, 1)
    std = torch.tensor(ip.image_std, device=pixels.device).view(1, 3, 1, 1)
    x = (pixels - mean) / std  # [B, 3, H, W]
    p, m, t = ip.patch_size, ip.merge_size, ip.temporal_patch_size
    gh, gw = H // p, W // p
    x = x.reshape(B, C, gh // m, m, p, gw // m, m, p).permute(0, 2, 5, 3, 6, 1, 4, 7)  # [B, gh/m, gw/m, m, m, C, p, p]
    x = x.unsqueeze(6).expand(*x.shape[:6], t, p, p)  # [B, gh/m, gw/m, m, m, C, t, p, p]
    grid_thw = torch.tensor([[1, gh, gw]] * B, device=pixels.device)  # [B, 3]
    return x.reshape(B * gh * gw, C * t * p * p), grid_thw


class QwenVL(VLM):
    """The adapter over one Qwen-VL family (this class: Qwen2-VL); a family overrides what differs."""
    hf_class = "Qwen2VLForConditionalGeneration"  # the transformers class this adapter wraps
    stock_generate_takes_embeds = True  # whether stock generate() runs our embeddings as they are (the hf engine's ARR)
    default_chat_template = CHAT_TEMPLATE  # the family's template, for a folder that ships none

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
        self.chat_template = getattr(tokenizer, "chat_template", None) or self.default_chat_template  # the folder's own
        self.decoder = Decoder(model)
        # launch-bound at batch 1: fixed shapes (the gestalt, the 273 saccades) replay as CUDA graphs, compiled by
        # Inductor first (norms, rotary, GELU fused; one compile for every patch count, paid at warm-up)
        self.graphed_vision = CUDAGraphed(self._vision_forward, pool=self.decoder.pool, compile=True)
        self.check = None  # called before each vision block (set_block_check); the decoder holds it for its layers

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
        self.check = self.decoder.check = check

    def set_compile(self, on: bool) -> None:
        self.decoder.compile_step = self.graphed_vision.compile = on

    def compile_seconds(self) -> CompileSeconds:
        return CompileSeconds(self.decoder.compile_seconds, self.graphed_vision.compile_seconds)

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

    # --- vision ---

    def image_inputs(self, view: Image.Image | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """
        A view (PIL, or [1, 3, H, W] in [0, 1]; a multiple of 28 px) -> pixel patches [N, 1176] and grid_thw [1, 3],
        exactly as the model's image processor lays them out, but computed on the device (tests pin the two).
        """
        pixels = view if isinstance(view, torch.Tensor) else view_tensor(view, self.device)
        return image_patches(pixels.to(self.device, torch.float32), self.image_processor)

    def _vision_forward(self, patches: torch.Tensor, patch_positions: torch.Tensor,
                        probe: AttentionProbe | None = None) -> torch.Tensor:
        """
        The vision tower's own blocks over one attention sequence of patches [N, 1176] at rotary (h, w)
        positions [N, 2] -> merged tokens [N/4, D]. Unlike the stock forward it reads nothing back to the host,
        so it can be captured as a CUDA graph. Tests pin it to the stock tower. A probe, when given, computes
        the last block's attention (encode_view_attention).
        """
        visual = self.visual
        x = visual.patch_embed(patches)  # [N, E]
        cos, sin = visual.rotary_pos_emb(x, patch_positions)
        last = len(visual.blocks) - 1
        for i, block in enumerate(visual.blocks):
            x = self._vision_block(block, x, cos, sin, probe if i == last else None)
        return visual.merger(x)  # [N/4, D]

    def _vision_block(self, block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend=None) -> torch.Tensor:
        """
        One ViT block over one attention sequence x [N, E] (the stock block without cu_seqlens) -> [N, E].
        attend(q, k, v) [1, heads, N, hd] -> [1, heads, N, hd] replaces full attention (Qwen2.5-VL's windows).
        The block check runs first, when set (not inside a compiled tower).
        """
        if not torch.compiler.is_compiling() and self.check is not None:
            self.check()
        attn, N = block.attn, x.shape[0]
        q, k, v = attn.qkv(block.norm1(x)).reshape(N, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)  # [N, heads, hd] each
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, heads, N, hd]
        o = attend(q, k, v) if attend else F.scaled_dot_product_attention(q, k, v, scale=attn.scaling)
        x = x + attn.proj(o[0].transpose(0, 1).reshape(N, -1))
        return x + block.mlp(block.norm2(x))

    @torch.no_grad()
    def encode_patches(self, pixel_values: torch.Tensor, grid: tuple[int, int], positions: torch.Tensor) -> VisualTokens:
        """
        Encode the cells at `positions` [K, 2] (row, col) of a view's (rows, cols) cell grid, each a 2x2 group
        of patches, at their true (h, w) rotary positions, as one attention sequence -> [K, D] in that order.
        pixel_values are the view's stock patches, 4 per cell in raster cell order. All cells in raster order
        is the stock encoding of the view; a subset is the sparse saccade encoding.
        """
        small = len(positions) <= GRAPHED_CELLS  # big views are compute-bound: graphs would only cost memory
        vision = self.graphed_vision if small and self.decoder.use_graphs else self._vision_forward
        return self._visual_tokens(vision(*self._vision_inputs(pixel_values, grid, positions)), grid, positions)

    @staticmethod
    def _visual_tokens(out, grid: tuple[int, int], positions: torch.Tensor) -> VisualTokens:
        """_vision_forward's output at cells [K, 2] of a grid -> VisualTokens (Qwen3-VL's: tokens and DeepStack)."""
        features, deepstack = out if isinstance(out, tuple) else (out, None)
        return VisualTokens(features, tuple(grid), positions.cpu().long(), deepstack)

    def _vision_inputs(self, pixel_values: torch.Tensor, grid: tuple[int, int], positions: torch.Tensor) -> tuple:
        """_vision_forward's arguments for the cells at `positions` [K, 2]: their patches and rotary positions."""
        cells = (positions[:, 0] * grid[1] + positions[:, 1]).to(pixel_values.device)  # [K]
        rows = (cells.unsqueeze(1) * 4 + torch.arange(4, device=cells.device)).flatten()  # [4K] patch rows
        inner = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]], device=cells.device)  # 2x2 patch offsets
        patch_positions = (positions.to(cells.device).unsqueeze(1) * MERGE + inner).reshape(-1, 2)  # [4K, 2]
        return pixel_values[rows].to(self.visual.dtype), patch_positions

    def encode_cells(self, view: Image.Image | torch.Tensor, positions: torch.Tensor) -> VisualTokens:
        """The cells at `positions` [K, 2] of a view (PIL or [1, 3, H, W]), each at its true place -> [K, D]."""
        pixels, grid_thw = self.image_inputs(view)
        grid = (int(grid_thw[0, 1]) // MERGE, int(grid_thw[0, 2]) // MERGE)
        return self.encode_patches(pixels, grid, positions)

    def encode_view(self, view: Image.Image | torch.Tensor) -> VisualTokens:
        """A whole view through the vision tower -> merged tokens [rows * cols, D] in raster order."""
        pixels, grid_thw = self.image_inputs(view)
        grid = (int(grid_thw[0, 1]) // MERGE, int(grid_thw[0, 2]) // MERGE)
        return self.encode_patches(pixels, grid, raster_block(grid).positions)

    @torch.no_grad()
    def encode_view_attention(self, view: Image.Image | torch.Tensor) -> tuple[VisualTokens, VisionAttention]:
        """
        encode_view (eager), with the last block's softmax attention computed explicitly, chunked over queries
        (arr_coc.vlm.attention) -> the tokens and, per cell, the attention it receives and its key.
        """
        pixels, grid_thw = self.image_inputs(view)
        grid = (int(grid_thw[0, 1]) // MERGE, int(grid_thw[0, 2]) // MERGE)
        positions = raster_block(grid).positions
        probe = AttentionProbe(self.visual.blocks[-1].attn.scaling)
        out = self._vision_forward(*self._vision_inputs(pixels, grid, positions), probe=probe)
        return self._visual_tokens(out, grid, positions), VisionAttention(*probe.per_cell())

    # --- text ---

    def prompt_ids(self, question: str, block_sizes: list[int], follows: int | None = None) -> torch.Tensor:
        """
        Chat-template ids for len(block_sizes) images then the question, each image pad expanded -> [1, L].
        The question is user text: special tokens typed in it stay plain characters (no injected turns or pads).
        follows: the user turn after an answer whose last token this is (not yet read), as the template renders a
        conversation: that token unless it is an EOS (the template's end of turn closes the answer), the end of
        turn, then the user turn (no system prompt: it began the conversation).
        """
        content = [{"type": "image"} for _ in block_sizes] + [{"type": "text", "text": QUESTION_SLOT}]
        messages = [{"role": "user", "content": content}]
        if follows is not None:
            messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": ANSWER_SLOT}] + messages
        text = self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=True)
        if follows is not None:
            text = text.split(ANSWER_SLOT)[1]  # from the end of the answer's turn
        before, after = text.split(QUESTION_SLOT)
        ids = [] if follows is None or follows in self.eos_token_ids else [follows]
        ids += self.tokenizer(before, add_special_tokens=False)["input_ids"]
        ids += self.question_ids(question)
        ids += self.tokenizer(after, add_special_tokens=False)["input_ids"]
        out, sizes = [], iter(block_sizes)
        for t in ids:
            out.extend([t] * next(sizes) if t == self.image_token_id else [t])
        return torch.tensor([out], device=self.device)

    def question_ids(self, question: str) -> list[int]:
        return self.tokenizer(question, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def question_embeds(self, question: str) -> torch.Tensor:
        """The question's own token embeddings [1, Lq, D] (the participatory scorer's query)."""
        ids = torch.tensor([self.question_ids(question)], device=self.device)
        return self.model.get_input_embeddings()(ids)

    def position_ids(self, input_ids: torch.Tensor, blocks: list[ImageBlock]) -> torch.Tensor:
        """[1, L] ids -> [3, 1, L] M-RoPE ids, each image block at its cells' true places (get_rope_index's layout)."""
        return mrope_position_ids(input_ids, self.image_token_id, blocks)

    def prompt(self, question: str, images: list[VisualTokens], answer: str | None = None,
               history: History | None = None) -> Prompt:
        """
        The chat prompt for image blocks (each VisualTokens: its features and where they sit) then the question,
        and optionally an answer to teacher-force: ids, embeddings, M-RoPE ids and DeepStack features. Every
        pipeline builds its LLM input here, so no caller lays out a family's internals itself. With a history: a
        conversation's next turn, the new tokens only (prompt_ids' `follows`), their positions after the
        conversation's (each image block at its true places, as get_rope_index lays out a second image).
        """
        ids = self.prompt_ids(question, [len(tokens) for tokens in images], None if history is None else history.last)
        answer_start = ids.shape[1]
        if answer is not None:
            # the answer is user text, as the question is: a special token typed in it stays plain characters
            target = self.question_ids(answer) + self.tokenizer(END_OF_TURN, add_special_tokens=False)["input_ids"]
            ids = torch.cat([ids, torch.tensor([target], device=ids.device)], dim=1)
        embeds = self.embed(ids, [tokens.features for tokens in images])  # [1, L, D]
        position_ids = self.position_ids(ids, [tokens.block for tokens in images])  # [3, 1, L] from 0
        if history is not None:
            position_ids = position_ids + history.cache.position  # the turn goes on where the conversation stands
        return Prompt(ids, embeds, position_ids, answer_start, self._deepstack_layout(ids, images, embeds), history)

    def embed(self, input_ids: torch.Tensor, image_features: list[torch.Tensor]) -> torch.Tensor:
        """Token embeddings with each image block's pads replaced by its features, in order -> [1, L, D]."""
        embeds = self.model.get_input_embeddings()(input_ids)  # [1, L, D]
        if image_features:
            features = torch.cat(image_features, dim=0).to(embeds.dtype)  # [n_image_tokens, D]
            mask = (input_ids == self.image_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(mask, features)
        return embeds

    def _deepstack_layout(self, input_ids: torch.Tensor, images: list[VisualTokens], embeds: torch.Tensor):
        """
        Each image block's DeepStack features at its tokens, zeros elsewhere -> [k, 1, L, D]; None for a family
        without DeepStack or a prompt without images.
        """
        if not images or all(tokens.deepstack is None for tokens in images):
            return None
        if any(tokens.deepstack is None for tokens in images):
            raise ValueError("every image block of a DeepStack model needs its DeepStack features: pass the "
                             "VisualTokens that encode_view/encode_cells returned")
        levels = torch.cat([tokens.deepstack for tokens in images], dim=1).to(embeds.dtype)  # [k, n_image, D]
        mask = (input_ids == self.image_token_id).unsqueeze(-1)  # [1, L, 1]
        return torch.stack([torch.zeros_like(embeds).masked_scatter(mask, level) for level in levels])

    def stock_inputs(self, question: str, view: Image.Image | torch.Tensor) -> StockInputs:
        """transformers' own inputs for one view and a question (the stock baselines under the hf engine)."""
        pixels, grid_thw = self.image_inputs(view)
        ids = self.prompt_ids(question, [int(grid_thw.prod()) // MERGE**2])
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

    # --- the participatory prior ---

    @torch.no_grad()
    def prior_attention(self, question: str, gestalt: VisualTokens, layer_fraction: float = 0.5,
                        context: list[VisualTokens] = ()) -> torch.Tensor:
        """
        "Gestalt guides gaze": run the LLM up to one middle layer over [prompt + gestalt [Ng, D] + question] and
        read the attention of the question's tokens (from the one after the last <|vision_end|> to the end) to
        the gestalt tokens there, averaged over heads and tokens; the layers above never run -> [Ng] attention
        mass. `context`: image blocks read after the gestalt (a second fixation: the first one's saccades).
        """
        prompt = self.prompt(question, [gestalt, *context])
        at = (prompt.ids[0] == self.image_token_id).nonzero()[:, 0]
        start, end, L = int(at[0]), int(at[len(gestalt) - 1]) + 1, prompt.length
        attention = self.decoder.prior_attention(prompt.embeds, prompt.position_ids, (int(at[-1]) + 2, L),
                                                 layer_fraction, prompt.deepstack)
        return attention[start:end]

    # --- generation ---

    @torch.no_grad()
    def generate(self, inputs: Prompt | StockInputs, max_new_tokens: int, streamer=None,
                 min_new_tokens: int | None = None, prune: tuple[int, int] | None = None,
                 keep: bool = False) -> Generation:
        """
        Greedy decoding -> Generation(new ids [1, T], safe_mode, probs [T]). A Prompt runs on self.engine: "fast"
        is the Decoder (static cache, CUDA graphs; after an fp16 overflow it redoes the request with an fp32 residual
        stream and says so in safe_mode), "hf" stock generate() on the embeddings. StockInputs always run stock
        generate() from pixels. min_new_tokens (default: generation_config's) suppresses EOS until then.
        prune = (K, N): FastV (a Prompt on the fast engine only), Generation.kept the image tokens layers >= K read.
        keep, or a Prompt that continues a conversation (Prompt.history): Generation.history is the conversation
        after this turn (the fast engine only: it keeps the static cache's keys and values).
        """
        if min_new_tokens is None:
            min_new_tokens = self.model.generation_config.min_new_tokens or 0
        pruning = None if prune is None else self.pruning(inputs, *prune)
        earlier = getattr(inputs, "history", None)
        keep = keep or earlier is not None
        if isinstance(inputs, Prompt) and self.engine == "fast":
            ids, probs, safe_mode, cache = self.decoder.generate(
                inputs.embeds, inputs.position_ids, max_new_tokens, self.eos_token_ids, streamer, min_new_tokens,
                inputs.deepstack, pruning, None if earlier is None else earlier.cache, keep)
            history = None if cache is None else History(SavedCache(*cache), torch.cat(
                [inputs.ids.new_zeros(1, 0) if earlier is None else earlier.ids, inputs.ids, ids[:, :-1]], dim=1),
                int(ids[0, -1]))
            return Generation(ids, safe_mode, None if pruning is None else pruning.kept_candidates(), probs, history)
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
                                      streamer=streamer, eos_token_id=self.eos_token_ids,
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
        Estimated compute (arr_coc.flops) of one vision pass per entry of vision_cells (cells = merged tokens),
        the prior pass over prior_tokens up to its layer (no logits), and the prefill of prefill_tokens.
        pruned = (K, full tokens): FastV's prefill, its first K layers over the full prompt, the rest over prefill_tokens.
        """
        config, text = self.model.config, self.model.config.text_config
        layers = int(prior_layer_fraction * text.num_hidden_layers)
        prior = prefill_gflops(text, prior_tokens, layers, False) if prior_tokens else 0.0
        if pruned is None:
            prefill = prefill_gflops(text, prefill_tokens)
        else:
            K, full = pruned
            prefill = prefill_gflops(text, full, K, False) + prefill_gflops(text, prefill_tokens, text.num_hidden_layers - K)
        return dict(vision=sum(vision_gflops(config.vision_config, MERGE**2 * n) for n in vision_cells),
                    prefill=prior + prefill)
