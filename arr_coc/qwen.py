"""
Adapter over transformers' Qwen2VLForConditionalGeneration: views, gestalt and sparse saccade encoding,
the "gestalt guides gaze" attention prior, M-RoPE position ids for two image blocks, and generation.

Everything runs the frozen model's own modules. Three small pieces are re-implemented, each pinned to the
stock code by a test: the pixel patch layout (the image processor's, but on the device), the position-id
layout (`get_rope_index`'s, for any subset of cells), and one layer's attention readout for the prior.

    vlm = QwenVL.from_pretrained("tiny")                   # or "Qwen/Qwen2-VL-2B-Instruct", or a folder
    views = make_views(pil_image, device=vlm.device)
    gestalt = vlm.encode_view(views.tensor("gestalt"))       # [Ng, D]
"""

import importlib
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageSequence

from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision

from arr_coc.config import DEFAULT_MODEL, ENGINES
from arr_coc.decoder import Decoder
from arr_coc.graphs import CUDAGraphed
from arr_coc.texture import minmax
from arr_coc.tiny import CHAT_TEMPLATE, TINY_MODELS, tiny_model_path

PATCH = 14  # ViT patch side in px
MERGE = 2  # 2x2 patches merge into one LLM token
CELL = PATCH * MERGE  # 28 px: one merged token = one candidate cell
MAX_ASPECT = 32.0  # wider or taller images are squeezed to this aspect ratio (Qwen refuses > 200)
MIN_PIXELS = 56 * 56  # the image processor's default lower bound (4 cells)
GRAPHED_CELLS = 1024  # vision calls of at most this many cells replay as CUDA graphs (gestalt, saccades, budget)
QUESTION_SLOT = "\x00question\x00"  # stands in for the question while the chat template is rendered


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


def native_grid(width: int, height: int, max_cells: int, cell: int = CELL) -> tuple[int, int]:
    """
    The (rows, cols) grid of cells (one merged token each: 28 px for Qwen2-VL) that stock Qwen reads this image
    at: the image processor's own smart_resize with max_pixels = max_cells cells (aspect kept; beyond
    MAX_ASPECT squeezed to it).
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    width, height = min(width, round(height * MAX_ASPECT)), min(height, round(width * MAX_ASPECT))
    min_pixels = MIN_PIXELS * (cell // CELL) ** 2
    h, w = smart_resize(max(height, 1), max(width, 1), factor=cell, min_pixels=min_pixels, max_pixels=max_cells * cell**2)
    return h // cell, w // cell


@dataclass(eq=False)
class Views:
    """
    Every pipeline's view of one image. The original is uploaded once (uint8) and each view is resized on
    the model's device when first asked for: `tensor(name)` -> [1, 3, h, w] in [0, 1]; the PIL attributes
    (`gestalt`, `native`, `highres`, `budget`) are for drawing only.
    """
    image: Image.Image  # the original image, RGB
    pixels: torch.Tensor  # [1, 3, H, W] uint8, the original on the device
    gestalt_grid: tuple[int, int]  # (gh, gw) gestalt tokens: the low-res view
    native_grid: tuple[int, int]  # (nh, nw) tokens of the native view: what stock Qwen2-VL reads (`full`)
    candidate_grid: tuple[int, int]  # (GH, GW) candidate cells of the high-res view: native, >= 2x the gestalt per side
    budget_grid: tuple[int, int]  # (bh, bw) tokens of the same-budget baseline view (~529 tokens)
    cell: int = CELL  # px per cell side: one merged token (28 for Qwen2-VL's 14 px patches merged 2x2)
    _cache: dict = field(default_factory=dict, repr=False)

    def grid(self, name: str) -> tuple[int, int]:
        return {"gestalt": self.gestalt_grid, "native": self.native_grid, "highres": self.candidate_grid,
                "budget": self.budget_grid}[name]

    def tensor(self, name: str) -> torch.Tensor:
        """The view `name` as [1, 3, grid * 28 px] in [0, 1] on the device, resized once (views of one size are one)."""
        rows, cols = self.grid(name)
        key = (rows * self.cell, cols * self.cell)
        if key not in self._cache:
            self._cache[key] = resize(self.pixels, (rows, cols), self.cell)
        return self._cache[key]

    def pil(self, name: str) -> Image.Image:
        key = ("pil", name)
        if key not in self._cache:
            rgb = self.tensor(name)[0].permute(1, 2, 0).mul(255).round().to(torch.uint8).cpu().numpy()
            self._cache[key] = Image.fromarray(rgb)
        return self._cache[key]

    gestalt = property(lambda self: self.pil("gestalt"))
    native = property(lambda self: self.pil("native"))
    highres = property(lambda self: self.pil("highres"))
    budget = property(lambda self: self.pil("budget"))

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


def resize(pixels: torch.Tensor, grid: tuple[int, int], cell: int = CELL) -> torch.Tensor:
    """
    The one resize path of every pipeline: [1, 3, H, W] (uint8 or [0, 1]) -> [1, 3, grid * cell px] in [0, 1],
    bicubic with antialiasing (as the image processors do), on the tensor's device; no resampling at the same size.
    """
    x = pixels.float() / 255.0 if pixels.dtype == torch.uint8 else pixels.float()
    size = (grid[0] * cell, grid[1] * cell)
    if tuple(x.shape[-2:]) == size:
        return x
    return F.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False).clamp(0, 1)


def make_views(image, gestalt_tokens: int = 256, budget_tokens: int = 529, max_cells: int = 4096,
               device: torch.device | str = "cpu", cell: int = CELL) -> Views:
    """
    All views of one image. The candidate grid is the native grid (at most max_cells cells), bounded below
    by twice the gestalt grid per side, so even a tiny image offers well over 273 candidates.
    """
    rgb = to_rgb(image)
    gh, gw = fit_grid(rgb.width, rgb.height, gestalt_tokens)
    bh, bw = fit_grid(rgb.width, rgb.height, budget_tokens)
    nh, nw = native_grid(rgb.width, rgb.height, max_cells, cell)
    ch, cw = max(nh, 2 * gh), max(nw, 2 * gw)
    if ch * cw > max_cells:  # the two grids round the aspect differently: keep the cap strict
        ch, cw = 2 * gh, 2 * gw
    pixels = torch.from_numpy(np.array(rgb, dtype=np.uint8)).to(device).permute(2, 0, 1).unsqueeze(0)  # [1, 3, H, W]
    return Views(rgb, pixels, (gh, gw), (nh, nw), (ch, cw), (bh, bw), cell)


def view_tensor(view: Image.Image, device: torch.device | str = "cpu") -> torch.Tensor:
    """PIL RGB -> [1, 3, H, W] float in [0, 1] on `device` (uploaded as uint8, converted there)."""
    return torch.from_numpy(np.array(view, dtype=np.uint8)).to(device).permute(2, 0, 1).unsqueeze(0).float() / 255.0


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


@dataclass
class Prompt:
    """A chat prompt with image blocks, as the LLM reads it."""
    ids: torch.Tensor  # [1, L] token ids, each image block's pads expanded
    embeds: torch.Tensor  # [1, L, D] token embeddings, image features in place of the pads
    position_ids: torch.Tensor  # [3, 1, L] M-RoPE (t, h, w) ids
    answer_start: int  # where a teacher-forced answer begins (L when there is none)


# ----------------------------------------------------------------------------- the adapter


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on Ampere or newer, fp16 on older GPUs (T4), fp32 on CPU."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16


FAMILIES = {  # model_type -> "module:Adapter" (imported when first loaded); each adapter names its transformers class
    "qwen2_vl": "arr_coc.qwen:QwenVL",
    "qwen2_5_vl": "arr_coc.qwen2_5_vl:Qwen25VL",
    "qwen3_vl": "arr_coc.qwen3_vl:Qwen3VL",
}


def adapter_class(model_type: str) -> type:
    """The adapter for a config's model_type; an unsupported one is a clear error naming the supported families."""
    if model_type not in FAMILIES:
        raise InputError(f"unsupported model_type {model_type!r}: ARR-COC supports {', '.join(sorted(FAMILIES))}")
    module, name = FAMILIES[model_type].split(":")
    return getattr(importlib.import_module(module), name)


class QwenVL:
    """The adapter over one Qwen-VL family (this class: Qwen2-VL); a family overrides what differs."""
    hf_class = "Qwen2VLForConditionalGeneration"  # the transformers class this adapter wraps
    stock_generate_takes_embeds = True  # whether stock generate() runs our embeddings as they are (the hf engine's ARR)

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
        self.chat_template = getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE  # the folder's own, if any
        self.decoder = Decoder(model)
        self.safe_mode = False  # whether the last generate() was redone in safe mode (fp16 overflow)
        # launch-bound at batch 1: fixed shapes (the gestalt, the 273 saccades) replay as CUDA graphs
        self.graphed_vision = CUDAGraphed(self._vision_forward, pool=self.decoder.pool)

    @classmethod
    def from_pretrained(cls, name: str = DEFAULT_MODEL, device: str | None = None,
                        dtype: torch.dtype | None = None, engine: str = "fast") -> "QwenVL":
        """
        Load a Qwen-VL from a hub id (downloaded or cached; HF_HUB_OFFLINE=1 for cache only), a folder, or a tiny
        offline model's name ("tiny": tiny.TINY_MODELS),
        with the adapter of its family (the config's model_type): see FAMILIES.
        """
        import transformers

        path = str(tiny_model_path(name)) if name in TINY_MODELS else name
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or default_dtype(device)
        adapter = adapter_class(transformers.AutoConfig.from_pretrained(path).model_type)
        model = getattr(transformers, adapter.hf_class).from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        model = model.to(device).eval().requires_grad_(False)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        image_processor = transformers.AutoImageProcessor.from_pretrained(path)
        return adapter(model, tokenizer, image_processor, name, engine)

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
    def _vision_block(block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One ViT block over one attention sequence x [N, E] (the stock block without cu_seqlens) -> [N, E]."""
        attn, N = block.attn, x.shape[0]
        q, k, v = attn.qkv(block.norm1(x)).reshape(N, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)  # [N, heads, hd] each
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], scale=attn.scaling)  # [1, heads, N, hd]
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
            target = self.tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
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
