"""
QwenVL, the adapter interface over one Qwen-VL family, and its Qwen2-VL implementation (transformers'
Qwen2VLForConditionalGeneration): patches, gestalt and sparse saccade encoding, prompts, the "gestalt guides
gaze" attention prior, and generation. Other families (qwen2_5_vl.py, qwen3_vl.py) override what differs;
families.py loads the right one.

Everything runs the frozen model's own modules. Three small pieces are re-implemented, each pinned to the
stock code by a test: the pixel patch layout (the image processor's, but on the device), the position-id
layout (`get_rope_index`'s, for any subset of cells), and one layer's attention readout for the prior.

    vlm = load_vlm("tiny")                   # arr_coc.vlm.families; or "Qwen/Qwen2-VL-2B-Instruct", or a folder
    views = make_views(pil_image, device=vlm.device, cell=vlm.cell)   # arr_coc.vlm.views
    gestalt = vlm.encode_view(views.tensor("gestalt"))       # [Ng, D]
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from PIL import Image
from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision

from arr_coc.config import ENGINES
from arr_coc.graphs import CUDAGraphed
from arr_coc.relevance.texture import minmax
from arr_coc.vlm.decoder import Decoder
from arr_coc.vlm.positions import ImageBlock, mrope_position_ids, raster_block
from arr_coc.vlm.tiny import CHAT_TEMPLATE
from arr_coc.vlm.views import MERGE, view_tensor

GRAPHED_CELLS = 1024  # vision calls of at most this many cells replay as CUDA graphs (gestalt, saccades, budget)
QUESTION_SLOT = "\x00question\x00"  # stands in for the question while the chat template is rendered


@dataclass
class Prompt:
    """A chat prompt with image blocks, as the LLM reads it."""
    ids: torch.Tensor  # [1, L] token ids, each image block's pads expanded
    embeds: torch.Tensor  # [1, L, D] token embeddings, image features in place of the pads
    position_ids: torch.Tensor  # [3, 1, L] M-RoPE (t, h, w) ids
    answer_start: int  # where a teacher-forced answer begins (L when there is none)


# ----------------------------------------------------------------------------- the adapter


class QwenVL:
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
        self.family = cfg.model_type
        eos = model.generation_config.eos_token_id
        self.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
        self.chat_template = getattr(tokenizer, "chat_template", None) or self.default_chat_template  # the folder's own
        self.decoder = Decoder(model)
        self.safe_mode = False  # whether the last generate() was redone in safe mode (fp16 overflow)
        # launch-bound at batch 1: fixed shapes (the gestalt, the 273 saccades) replay as CUDA graphs
        self.graphed_vision = CUDAGraphed(self._vision_forward, pool=self.decoder.pool)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def cell(self) -> int:
        """px per candidate cell: one merged token (patch_size x merge_size)."""
        return self.image_processor.patch_size * self.image_processor.merge_size

    @property
    def dtype(self) -> torch.dtype:
        return self.language_model.dtype  # the ViT may run in fp32 beside an fp16 LLM

    @property
    def visual(self):
        return self.model.model.visual

    @property
    def language_model(self):
        return self.model.model.language_model

    # --- vision ---

    def image_inputs(self, view: Image.Image | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """
        A view (PIL, or [1, 3, H, W] in [0, 1]; a multiple of 28 px) -> pixel patches [N, 1176] and grid_thw [1, 3],
        exactly as the model's image processor lays them out, but computed on the device (tests pin the two).
        """
        pixels = view if isinstance(view, torch.Tensor) else view_tensor(view, self.device)
        pixels = pixels.to(self.device, torch.float32)[0]  # [3, H, W]
        ip = self.image_processor
        mean = torch.tensor(ip.image_mean, device=self.device).view(3, 1, 1)
        std = torch.tensor(ip.image_std, device=self.device).view(3, 1, 1)
        x = (pixels - mean) / std
        p, m, t = ip.patch_size, ip.merge_size, ip.temporal_patch_size
        gh, gw = x.shape[1] // p, x.shape[2] // p
        x = x.reshape(3, gh // m, m, p, gw // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, p, p]
        x = x.unsqueeze(5).expand(*x.shape[:5], t, p, p)  # the still image fills both temporal frames
        grid_thw = torch.tensor([[1, gh, gw]], device=self.device)
        return x.reshape(gh * gw, 3 * t * p * p), grid_thw

    def _vision_forward(self, patches: torch.Tensor, patch_positions: torch.Tensor) -> torch.Tensor:
        """
        The vision tower's own blocks over one attention sequence of patches [N, 1176] at rotary (h, w)
        positions [N, 2] -> merged tokens [N/4, D]. Unlike the stock forward it reads nothing back to the host,
        so it can be captured as a CUDA graph. Tests pin it to the stock tower.
        """
        visual = self.visual
        x = visual.patch_embed(patches)  # [N, E]
        cos, sin = visual.rotary_pos_emb(x, patch_positions)
        for block in visual.blocks:
            x = self._vision_block(block, x, cos, sin)
        return visual.merger(x)  # [N/4, D]

    @staticmethod
    def _vision_block(block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend=None) -> torch.Tensor:
        """
        One ViT block over one attention sequence x [N, E] (the stock block without cu_seqlens) -> [N, E].
        attend(q, k, v) [1, heads, N, hd] -> [1, heads, N, hd] replaces full attention (Qwen2.5-VL's windows).
        """
        attn, N = block.attn, x.shape[0]
        q, k, v = attn.qkv(block.norm1(x)).reshape(N, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)  # [N, heads, hd] each
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, heads, N, hd]
        o = attend(q, k, v) if attend else F.scaled_dot_product_attention(q, k, v, scale=attn.scaling)
        x = x + attn.proj(o[0].transpose(0, 1).reshape(N, -1))
        return x + block.mlp(block.norm2(x))

    @torch.no_grad()
    def encode_cells(self, pixel_values: torch.Tensor, grid: tuple[int, int], positions: torch.Tensor) -> torch.Tensor:
        """
        Encode the cells at `positions` [K, 2] (row, col) of a view's (rows, cols) cell grid, each a 2x2 group
        of patches, at their true (h, w) rotary positions, as one attention sequence -> [K, D] in that order.
        pixel_values are the view's stock patches, 4 per cell in raster cell order. All cells in raster order
        is the stock encoding of the view; a subset is the sparse saccade encoding.
        """
        small = len(positions) <= GRAPHED_CELLS  # big views are compute-bound: graphs would only cost memory
        vision = self.graphed_vision if small and self.decoder.use_graphs else self._vision_forward
        return vision(*self._vision_inputs(pixel_values, grid, positions))

    def _vision_inputs(self, pixel_values: torch.Tensor, grid: tuple[int, int], positions: torch.Tensor) -> tuple:
        """_vision_forward's arguments for the cells at `positions` [K, 2]: their patches and rotary positions."""
        cells = (positions[:, 0] * grid[1] + positions[:, 1]).to(pixel_values.device)  # [K]
        rows = (cells.unsqueeze(1) * 4 + torch.arange(4, device=cells.device)).flatten()  # [4K] patch rows
        inner = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]], device=cells.device)  # 2x2 patch offsets
        patch_positions = (positions.to(cells.device).unsqueeze(1) * MERGE + inner).reshape(-1, 2)  # [4K, 2]
        return pixel_values[rows].to(self.visual.dtype), patch_positions

    def encode_view(self, view: Image.Image | torch.Tensor) -> torch.Tensor:
        """A whole view through the vision tower -> merged tokens [rows * cols, D] in raster order."""
        pixels, grid_thw = self.image_inputs(view)
        grid = (int(grid_thw[0, 1]) // MERGE, int(grid_thw[0, 2]) // MERGE)
        return self.encode_cells(pixels, grid, raster_block(grid).positions)

    # --- text ---

    def prompt_ids(self, question: str, block_sizes: list[int]) -> torch.Tensor:
        """
        Chat-template ids for len(block_sizes) images then the question, each image pad expanded -> [1, L].
        The question is user text: special tokens typed in it stay plain characters (no injected turns or pads).
        """
        content = [{"type": "image"} for _ in block_sizes] + [{"type": "text", "text": QUESTION_SLOT}]
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": content}], chat_template=self.chat_template,
                                                  tokenize=False, add_generation_prompt=True)
        before, after = text.split(QUESTION_SLOT)
        ids = self.tokenizer(before, add_special_tokens=False)["input_ids"]
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

    def prompt(self, question: str, images: list[tuple[torch.Tensor, ImageBlock]], answer: str | None = None) -> Prompt:
        """
        The chat prompt for image blocks (features [n, D] and where their n tokens sit) then the question, and
        optionally an answer to teacher-force (training): ids, embeddings and M-RoPE ids. Every pipeline builds
        its LLM input here, so no caller lays out a family's internals itself.
        """
        ids = self.prompt_ids(question, [len(features) for features, _ in images])
        answer_start = ids.shape[1]
        if answer is not None:
            # the answer is user text, as the question is: a special token typed in it stays plain characters
            target = self.question_ids(answer) + self.tokenizer("<|im_end|>", add_special_tokens=False)["input_ids"]
            ids = torch.cat([ids, torch.tensor([target], device=ids.device)], dim=1)
        return Prompt(ids, self.embed(ids, [features for features, _ in images]),
                      self.position_ids(ids, [block for _, block in images]), answer_start)

    def embed(self, input_ids: torch.Tensor, image_features: list[torch.Tensor]) -> torch.Tensor:
        """Token embeddings with each image block's pads replaced by its features, in order -> [1, L, D]."""
        embeds = self.model.get_input_embeddings()(input_ids)  # [1, L, D]
        if image_features:
            features = torch.cat(image_features, dim=0).to(embeds.dtype)  # [n_image_tokens, D]
            mask = (input_ids == self.image_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(mask, features)
        return embeds

    def take(self, features: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Some rows [n, D] of encoded features [K, D], with what the family carries beside them (Qwen3-VL: DeepStack)."""
        return features[index]

    @torch.no_grad()
    def answer_logprobs(self, prompts: list[Prompt], batch_size: int = 8) -> torch.Tensor:
        """
        Score each prompt's teacher-forced answer: the mean log-probability of its tokens -> [len(prompts)].
        Prompts run in batches, right-padded: attention is causal, so no real token ever sees the padding.
        """
        scores = []
        for first in range(0, len(prompts), batch_size):
            batch = prompts[first:first + batch_size]
            lengths = [p.ids.shape[1] for p in batch]
            answers = [p.ids[0, p.answer_start:] for p in batch]  # each [n_i], the tokens to score
            L, n = max(lengths), max(len(a) for a in answers)
            embeds = torch.cat([F.pad(p.embeds, (0, 0, 0, L - l)) for p, l in zip(batch, lengths)])  # [B, L, D]
            position_ids = torch.cat([F.pad(p.position_ids, (0, L - l)) for p, l in zip(batch, lengths)], dim=1)  # [3, B, L]
            deepstack = [self.deepstack(p.embeds) for p in batch]  # each None or [k, 1, L_i, D]
            deepstack = None if deepstack[0] is None else torch.cat(
                [F.pad(d, (0, 0, 0, L - l)) for d, l in zip(deepstack, lengths)], dim=1)  # [k, B, L, D]
            # logits at answer_start - 1 .. L_i - 2 predict the answer's tokens answer_start .. L_i - 1
            at = torch.stack([F.pad(torch.arange(p.answer_start - 1, l - 1, device=self.device), (0, n - len(a)))
                              for p, l, a in zip(batch, lengths, answers)])  # [B, n]
            targets = torch.stack([F.pad(a, (0, n - len(a)), value=-1) for a in answers])  # [B, n], -1 past each answer
            logits = self.decoder.forward(embeds, position_ids, deepstack, at=at)  # [B, n, V] fp32
            logp = logits.log_softmax(-1).gather(-1, targets.clamp(min=0).unsqueeze(-1))[..., 0]  # [B, n]
            real = targets >= 0
            scores.append((logp * real).sum(1) / real.sum(1))
        return torch.cat(scores)

    def deepstack(self, inputs_embeds: torch.Tensor) -> torch.Tensor | None:
        """Per-layer additions [k, 1, L, D] to the LLM's first k layers' outputs (Qwen3-VL's DeepStack); None here."""
        return None

    # --- the participatory prior ---

    @torch.no_grad()
    def gestalt_attention(self, question: str, gestalt: torch.Tensor, grid: tuple[int, int],
                          layer_fraction: float = 0.5) -> torch.Tensor:
        """
        "Gestalt guides gaze": run the LLM up to one middle layer over [prompt + gestalt [Ng, D] + question] and
        read the attention of the question's tokens (from the one after <|vision_end|> to the end) to the
        gestalt tokens there, averaged over heads and tokens; the layers above never run -> [Ng] attention mass.
        """
        prompt = self.prompt(question, [(gestalt, raster_block(grid))])
        at = (prompt.ids[0] == self.image_token_id).nonzero()[:, 0]
        start, end, L = int(at[0]), int(at[-1]) + 1, prompt.ids.shape[1]
        attention = self.decoder.prior_attention(prompt.embeds, prompt.position_ids, (end + 1, L), layer_fraction,
                                                 self.deepstack(prompt.embeds))
        return attention[start:end]

    # --- generation ---

    @torch.no_grad()
    def generate(self, max_new_tokens: int, streamer=None, **inputs) -> torch.Tensor:
        """
        Greedy decoding from input_ids (+ pixel inputs) or inputs_embeds + position_ids -> only the new ids [1, T].
        engine "fast" runs the Decoder (static cache, CUDA graphs) on inputs_embeds; "hf" runs stock generate().
        Both honour generation_config.min_new_tokens (the bench suppresses EOS with it). After an fp16 overflow
        the fast engine redoes the request with an fp32 residual stream and sets self.safe_mode.
        """
        min_new_tokens = self.model.generation_config.min_new_tokens or 0
        self.safe_mode = False
        if self.engine == "fast" and "inputs_embeds" in inputs:
            embeds = inputs["inputs_embeds"]
            ids, self.safe_mode = self.decoder.generate(embeds, inputs["position_ids"], max_new_tokens, self.eos_token_ids,
                                                        streamer, min_new_tokens, self.deepstack(embeds))
            return ids
        ref = inputs.get("input_ids", inputs.get("inputs_embeds"))
        inputs.setdefault("attention_mask", torch.ones(ref.shape[:2], dtype=torch.long, device=self.device))
        out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, streamer=streamer,
                                  eos_token_id=self.eos_token_ids, pad_token_id=self.tokenizer.pad_token_id)
        return out[:, ref.shape[1]:] if "input_ids" in inputs else out

    def decode(self, ids: torch.Tensor) -> str:
        return self.tokenizer.decode(ids[0], skip_special_tokens=True).strip()


def upsample_map(values: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """[N] values on a (rows, cols) grid -> [1, *size] bilinear map, min-max scaled to [0, 1]."""
    m = values.float().view(1, 1, *grid)
    m = F.interpolate(m, size=size, mode="bilinear", align_corners=False)[:, 0]
    return minmax(m, floor=0)
