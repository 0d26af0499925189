"""
The vision side of a Qwen-VL family as ARR-COC runs it (this class: Qwen2-VL's tower; qwen2_5_vl.py and
qwen3_vl.py subclass it where their towers differ): pixel patches laid out as the image processor lays them out
but on the device, and the tower's own blocks over any set of cells at their true (h, w) rotary positions, as one
attention sequence (the whole view in raster order is the stock encoding; a subset, the sparse saccades). Fixed
shapes of at most GRAPHED_CELLS cells replay as CUDA graphs, compiled by Inductor first.

    vision = QwenVision(model.model.visual, image_processor, pool=None, use_graphs=lambda: False)
    tokens = vision.encode_view(view)                       # VisualTokens [rows * cols, D], raster order
    saccades = vision.encode_cells(view, positions)         # the cells [K, 2] at their true places
"""

from typing import Callable

import torch
import torch.nn.functional as F
from PIL import Image
from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision

from arr_coc.runtime.graphs import CUDAGraphed
from arr_coc.vlm.attention import VisionAttentionProbe
from arr_coc.vlm.base import VisionAttention, VisualTokens
from arr_coc.vlm.positions import raster_block
from arr_coc.vlm.views import MERGE, view_tensor

GRAPHED_CELLS = 1024  # vision calls of at most this many cells replay as CUDA graphs (gestalt, saccades, budget)


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


class QwenVision:
    """A family's vision tower over any cells of a view (this class: Qwen2-VL's)."""

    def __init__(self, visual, image_processor, pool=None, use_graphs: Callable[[], bool] = lambda: False):
        self.visual = visual  # the model's vision tower (model.model.visual)
        self.image_processor = image_processor  # its patch size, merge size and normalisation
        self.use_graphs = use_graphs  # whether CUDA graphs run now (the decoder's setting, read at each call)
        self.check = None  # called before each block when set (VLM.set_block_check); not inside a compiled tower
        # launch-bound at batch 1: fixed shapes (the gestalt, the 273 saccades) replay as CUDA graphs, compiled by
        # Inductor first (norms, rotary, GELU fused; one compile for every patch count, paid at warm-up)
        self.graphed = CUDAGraphed(self.forward, pool=pool, compile=True)

    @property
    def device(self) -> torch.device:
        return next(self.visual.parameters()).device


    def image_inputs(self, view: Image.Image | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """
        A view (PIL, or [1, 3, H, W] in [0, 1]; a multiple of 28 px) -> pixel patches [N, 1176] and grid_thw [1, 3],
        exactly as the model's image processor lays them out, but computed on the device (tests pin the two).
        """
        pixels = view if isinstance(view, torch.Tensor) else view_tensor(view, self.device)
        return image_patches(pixels.to(self.device, torch.float32), self.image_processor)

    def forward(self, patches: torch.Tensor, patch_positions: torch.Tensor,
                        probe: VisionAttentionProbe | None = None) -> torch.Tensor:
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
            x = self.block(block, x, cos, sin, probe if i == last else None)
        return visual.merger(x)  # [N/4, D]

    def block(self, block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend=None) -> torch.Tensor:
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
        vision = self.graphed if small and self.use_graphs() else self.forward
        return self.tokens(vision(*self.inputs(pixel_values, grid, positions)), grid, positions)

    @staticmethod
    def tokens(out, grid: tuple[int, int], positions: torch.Tensor) -> VisualTokens:
        """forward's output at cells [K, 2] of a grid -> VisualTokens (Qwen3-VL's: tokens and DeepStack)."""
        features, deepstack = out if isinstance(out, tuple) else (out, None)
        return VisualTokens(features, tuple(grid), positions.cpu().long(), deepstack)

    def inputs(self, pixel_values: torch.Tensor, grid: tuple[int, int], positions: torch.Tensor) -> tuple:
        """forward's arguments for the cells at `positions` [K, 2]: their patches and rotary positions."""
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
        probe = VisionAttentionProbe(self.visual.blocks[-1].attn.scaling)
        out = self.forward(*self.inputs(pixels, grid, positions), probe=probe)
        return self.tokens(out, grid, positions), VisionAttention(*probe.per_cell())
