"""
Adapter over transformers' Qwen2VLForConditionalGeneration: views, gestalt and sparse saccade encoding,
the "gestalt guides gaze" attention prior, M-RoPE position ids for two image blocks, and generation.

Everything runs the frozen model's own modules. Three small pieces are re-implemented, each pinned to the
stock code by a test: the pixel patch layout (the image processor's, but on the device), the position-id
layout (`get_rope_index`'s, for any subset of cells), and one layer's attention readout for the prior.

    vlm = QwenVL.from_pretrained("tiny")                   # or "Qwen/Qwen2-VL-2B-Instruct", or a folder
    views = make_views(pil_image)
    pixels, thw = vlm.image_inputs(views.gestalt)
    gestalt = vlm.encode_image(pixels, thw)                  # [Ng, D]
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageSequence

from arr_coc.config import DEFAULT_MODEL
from arr_coc.texture import minmax
from arr_coc.tiny import CHAT_TEMPLATE, tiny_model_path

PATCH = 14  # ViT patch side in px
MERGE = 2  # 2x2 patches merge into one LLM token
CELL = PATCH * MERGE  # 28 px: one merged token = one candidate cell
MAX_ASPECT = 32.0  # wider or taller images are squeezed to this aspect ratio (Qwen refuses > 200)


class InputError(ValueError):
    """Bad user input (image, question, checkpoint): the message is shown to the user as it is."""


# ----------------------------------------------------------------------------- images and views


def to_rgb(image) -> Image.Image:
    """Any PIL image (grayscale, RGBA, palette, 16-bit, float, CMYK, animated) -> 8-bit RGB, first frame."""
    if image is None:
        raise InputError("no image: upload an image first")
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise InputError(f"expected a PIL image, got {type(image).__name__}")
    if getattr(image, "is_animated", False):
        image = next(ImageSequence.Iterator(image)).copy()  # animated: the first frame
    if image.width < 1 or image.height < 1:
        raise InputError(f"the image is empty ({image.width}x{image.height})")
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16-bit or float: rescale its range to 8 bits
        a = np.asarray(image, dtype=np.float64)
        lo, hi = float(np.nanmin(a)), float(np.nanmax(a))
        a = np.nan_to_num((a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)) * 255
        image = Image.fromarray(a.round().astype(np.uint8), mode="L")
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):  # transparency: composite on white, as a viewer shows it
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert("RGB")


def fit_grid(width: int, height: int, max_tokens: int) -> tuple[int, int]:
    """The (rows, cols) token grid with at most max_tokens tokens closest to the image's aspect ratio."""
    aspect = min(max(width / height, 1 / MAX_ASPECT), MAX_ASPECT)
    rows = max(1, round(math.sqrt(max_tokens / aspect)))
    cols = max(1, min(max_tokens // rows, round(rows * aspect)))
    return rows, cols


@dataclass
class Views:
    image: Image.Image  # the original image, RGB
    gestalt: Image.Image  # low-res view, one 28 px cell per gestalt token
    highres: Image.Image  # 2x the gestalt grid per side: the candidate grid the saccades come from
    budget: Image.Image  # same-budget baseline view (~529 tokens)
    gestalt_grid: tuple[int, int]  # (gh, gw) gestalt tokens
    candidate_grid: tuple[int, int]  # (2gh, 2gw) candidate cells
    budget_grid: tuple[int, int]  # (bh, bw) tokens of the budget view

    def cell_box(self, row: int, col: int) -> list[int]:
        """Pixel box [x0, y0, x1, y1] of a candidate cell in the original image."""
        gh, gw = self.candidate_grid
        sx, sy = self.image.width / gw, self.image.height / gh
        return [round(col * sx), round(row * sy), round((col + 1) * sx), round((row + 1) * sy)]

    def box_coverage(self, box) -> torch.Tensor:
        """Fraction of each candidate cell inside a pixel box [x0, y0, x1, y1] of the original image -> [GH, GW]."""
        gh, gw = self.candidate_grid
        sx, sy = self.image.width / gw, self.image.height / gh
        x0, y0, x1, y1 = (float(v) for v in box)
        cols, rows = torch.arange(gw, dtype=torch.float), torch.arange(gh, dtype=torch.float)
        cover_x = ((cols + 1) * sx).clamp(max=x1).sub((cols * sx).clamp(min=x0)).clamp(min=0) / sx  # [GW]
        cover_y = ((rows + 1) * sy).clamp(max=y1).sub((rows * sy).clamp(min=y0)).clamp(min=0) / sy  # [GH]
        return cover_y[:, None] * cover_x[None, :]


def resize(image: Image.Image, grid: tuple[int, int]) -> Image.Image:
    """The one resize path of every pipeline: bicubic to grid * 28 px."""
    return image.resize((grid[1] * CELL, grid[0] * CELL), Image.Resampling.BICUBIC)


def make_views(image, gestalt_tokens: int = 256, budget_tokens: int = 529) -> Views:
    rgb = to_rgb(image)
    gh, gw = fit_grid(rgb.width, rgb.height, gestalt_tokens)
    bh, bw = fit_grid(rgb.width, rgb.height, budget_tokens)
    return Views(rgb, resize(rgb, (gh, gw)), resize(rgb, (2 * gh, 2 * gw)), resize(rgb, (bh, bw)),
                 (gh, gw), (2 * gh, 2 * gw), (bh, bw))


def view_tensor(view: Image.Image) -> torch.Tensor:
    """PIL RGB -> [1, 3, H, W] float in [0, 1] (the texture array's input)."""
    return torch.from_numpy(np.asarray(view, dtype=np.float32) / 255.0).permute(2, 0, 1).unsqueeze(0)


# ----------------------------------------------------------------------------- position ids


@dataclass
class ImageBlock:
    """One image block of the LLM sequence, as M-RoPE sees it."""
    grid: tuple[int, int]  # (rows, cols) of the token grid the block's positions live on
    positions: torch.Tensor  # [n, 2] (row, col) of each token on that grid, in sequence order


def raster_block(grid: tuple[int, int]) -> ImageBlock:
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    return ImageBlock(grid, torch.stack([rows.flatten(), cols.flatten()], dim=-1))


def mrope_position_ids(input_ids: torch.Tensor, image_token_id: int, blocks: list[ImageBlock]) -> torch.Tensor:
    """
    [1, L] ids -> [3, 1, L] (t, h, w) positions, laid out as get_rope_index lays out each block:
    text counts up by one; an image block starting at s puts token (r, c) at (s, s + r, s + c); the text
    after it continues at s + max(rows, cols). Blocks may hold any subset of their grid, in any order.
    """
    ids = input_ids[0]
    is_image = (ids == image_token_id).tolist()
    out = torch.zeros(3, ids.numel(), dtype=torch.long)
    block_iter = iter(blocks)
    pos, i, L = 0, 0, ids.numel()
    while i < L:
        if not is_image[i]:
            out[:, i] = pos
            pos, i = pos + 1, i + 1
            continue
        block = next(block_iter)
        n = block.positions.shape[0]
        out[0, i:i + n] = pos
        out[1, i:i + n] = pos + block.positions[:, 0]
        out[2, i:i + n] = pos + block.positions[:, 1]
        pos, i = pos + max(block.grid), i + n
    return out.unsqueeze(1).to(input_ids.device)


# ----------------------------------------------------------------------------- the adapter


class _StopForward(Exception):
    """Raised by the prior hook once the attention it needs is read: the layers above are never run."""


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on Ampere or newer, fp16 on older GPUs (T4), fp32 on CPU."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16


class QwenVL:
    def __init__(self, model, tokenizer, image_processor, name: str):
        self.model, self.tokenizer, self.image_processor, self.name = model, tokenizer, image_processor, name
        cfg = model.config
        self.image_token_id = cfg.image_token_id
        self.hidden_size = cfg.text_config.hidden_size
        self.family = cfg.model_type
        self.eos_token_ids = model.generation_config.eos_token_id

    @classmethod
    def from_pretrained(cls, name: str = DEFAULT_MODEL, device: str | None = None,
                        dtype: torch.dtype | None = None) -> "QwenVL":
        """Load a Qwen2-VL from a hub id (downloaded or cached; HF_HUB_OFFLINE=1 for cache only), a folder, or "tiny"."""
        from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration

        path = str(tiny_model_path()) if name == "tiny" else name
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or default_dtype(device)
        model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        model = model.to(device).eval().requires_grad_(False)
        if dtype == torch.float16:  # fp16 (T4): the ViT's activations can overflow, so it stays in fp32
            model.model.visual.float()
        tokenizer = AutoTokenizer.from_pretrained(path)
        image_processor = AutoImageProcessor.from_pretrained(path)
        return cls(model, tokenizer, image_processor, name)

    @property
    def device(self) -> torch.device:
        return self.model.device

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
        pixels = view if isinstance(view, torch.Tensor) else view_tensor(view)
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

    @torch.no_grad()
    def encode_image(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """The stock vision tower over a whole view -> merged tokens [N/4, D]."""
        return self.visual(pixel_values.to(self.visual.dtype), grid_thw=grid_thw).pooler_output

    def encode_cells(self, pixel_values: torch.Tensor, candidate_grid: tuple[int, int],
                     positions: torch.Tensor) -> torch.Tensor:
        """
        Sparse saccade encoding: only the selected cells, each a 2x2 group of patches, at their true (h, w)
        rotary positions on the high-res patch grid, as one attention sequence -> [K, D] in `positions` order.
        pixel_values are the high-res view's stock patches, which come 4 per cell in raster cell order.
        """
        gw = candidate_grid[1]
        K = positions.shape[0]
        cells = (positions[:, 0] * gw + positions[:, 1]).to(pixel_values.device)  # [K]
        rows = (cells.unsqueeze(1) * 4 + torch.arange(4, device=cells.device)).flatten()  # [4K] patch rows
        inner = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]], device=cells.device)  # 2x2 patch offsets
        patch_pos = (positions.to(cells.device).unsqueeze(1) * MERGE + inner).reshape(-1, 2)  # [4K, 2]
        cu_seqlens = torch.tensor([0, 4 * K], dtype=torch.int32, device=cells.device)
        grid_thw = torch.tensor([[1, MERGE, MERGE * K]], device=cells.device)  # only its product is used
        out = self.visual(pixel_values[rows].to(self.visual.dtype), grid_thw=grid_thw,
                          position_ids=patch_pos, cu_seqlens=cu_seqlens)
        return out.pooler_output  # [K, D]

    # --- text ---

    def prompt_ids(self, question: str, block_sizes: list[int]) -> torch.Tensor:
        """Chat-template ids for len(block_sizes) images then the question, each image pad expanded -> [1, L]."""
        content = [{"type": "image"} for _ in block_sizes] + [{"type": "text", "text": question}]
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": content}], chat_template=CHAT_TEMPLATE,
                                                  tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        out, sizes = [], iter(block_sizes)
        for t in ids:
            out.extend([t] * next(sizes) if t == self.image_token_id else [t])
        return torch.tensor([out], device=self.device)

    def question_embeds(self, question: str) -> torch.Tensor:
        """The question's own token embeddings [1, Lq, D] (the participatory scorer's query)."""
        ids = self.tokenizer(question, add_special_tokens=False, return_tensors="pt")["input_ids"].to(self.device)
        return self.model.get_input_embeddings()(ids)

    def embed(self, input_ids: torch.Tensor, image_features: list[torch.Tensor]) -> torch.Tensor:
        """Token embeddings with each image block's pads replaced by its features, in order -> [1, L, D]."""
        embeds = self.model.get_input_embeddings()(input_ids)  # [1, L, D]
        if image_features:
            features = torch.cat(image_features, dim=0).to(embeds.dtype)  # [n_image_tokens, D]
            mask = (input_ids == self.image_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(mask, features)
        return embeds

    # --- the participatory prior ---

    @torch.no_grad()
    def gestalt_attention(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor,
                          gestalt_span: tuple[int, int], query_start: int, layer_fraction: float = 0.5) -> torch.Tensor:
        """
        "Gestalt guides gaze": run the LLM up to one middle layer over [prompt + gestalt + question] and read
        the attention of the question's tokens to the gestalt tokens there, averaged over heads and tokens.
        Only this one layer's attention is recomputed by hand (in fp32); every layer runs its fast sdpa path,
        and the layers above it never run. Returns [Ng] attention mass per gestalt token, summing to <= 1.
        """
        layers = self.language_model.layers
        index = min(len(layers) - 1, int(layer_fraction * len(layers)))
        attn = layers[index].self_attn
        captured = {}

        def hook(module, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]  # [1, L, D]
            cos, sin = kwargs["position_embeddings"]  # [1, L, hd] each, M-RoPE already composed
            hd = module.head_dim
            q = module.q_proj(hidden[:, query_start:]).view(1, -1, module.config.num_attention_heads, hd).transpose(1, 2)
            k = module.k_proj(hidden).view(1, hidden.shape[1], -1, hd).transpose(1, 2)  # [1, Hkv, L, hd]
            q = q.float() * cos[:, None, query_start:].float() + _rotate_half(q.float()) * sin[:, None, query_start:].float()
            k = k.float() * cos[:, None].float() + _rotate_half(k.float()) * sin[:, None].float()
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # GQA: [1, H, L, hd]
            scores = (q @ k.transpose(-1, -2)) * module.scaling  # [1, H, Lq, L]
            rows = torch.arange(query_start, hidden.shape[1], device=q.device).view(-1, 1)
            scores = scores.masked_fill(torch.arange(hidden.shape[1], device=q.device) > rows, float("-inf"))
            probs = scores.softmax(-1)  # causal attention of each question token
            captured["attention"] = probs[..., gestalt_span[0]:gestalt_span[1]].mean(dim=(0, 1, 2))  # [Ng]
            raise _StopForward

        handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            self.language_model(inputs_embeds=inputs_embeds, position_ids=position_ids,
                                attention_mask=torch.ones(inputs_embeds.shape[:2], dtype=torch.long, device=self.device),
                                use_cache=False)
        except _StopForward:
            pass
        finally:
            handle.remove()
        return captured["attention"]

    # --- generation ---

    @torch.no_grad()
    def generate(self, max_new_tokens: int, streamer=None, **inputs) -> torch.Tensor:
        """Greedy generate() from input_ids or inputs_embeds (+ position_ids); returns only the new ids [1, T]."""
        ref = inputs.get("input_ids", inputs.get("inputs_embeds"))
        inputs.setdefault("attention_mask", torch.ones(ref.shape[:2], dtype=torch.long, device=self.device))
        out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, streamer=streamer,
                                  eos_token_id=self.eos_token_ids, pad_token_id=self.tokenizer.pad_token_id)
        return out[:, ref.shape[1]:] if "input_ids" in inputs else out

    def decode(self, ids: torch.Tensor) -> str:
        return self.tokenizer.decode(ids[0], skip_special_tokens=True).strip()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def upsample_map(values: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """[N] values on a (rows, cols) grid -> [1, *size] bilinear map, min-max scaled to [0, 1]."""
    m = values.float().view(1, 1, *grid)
    m = F.interpolate(m, size=size, mode="bilinear", align_corners=False)[:, 0]
    return minmax(m, floor=0)
