"""
Qwen2.5-VL behind the QwenVL adapter. Views, prompts, the M-RoPE layout and the LLM (the Qwen2 architecture,
so the Decoder runs it unchanged) are Qwen2-VL's; only the vision tower differs: RMSNorm blocks with a gated
MLP, and window attention. Windows are 112 px = 8 patches = 4 cells per side; the blocks listed in
`fullatt_block_indexes` attend over the whole sequence, the others only within their window.

For any set of cells (a sparse saccade set, in any order) the windows are the full grid's: cell (r, c) sits in
window (r // 4, c // 4), so a selected cell sees exactly the selected cells of its own stock window. The cells
are ordered as the stock `get_window_index` orders the full grid (windows in raster order, cells inside a
window in raster order), encoded, and returned in the caller's order. Up to GRAPHED_CELLS cells the windows
are a block-diagonal mask built on the device (one sdpa call per block, nothing read back to the host, so it
can be captured as a CUDA graph); larger views run eagerly, one attention call per window as the stock does.

    vlm = load_vlm("tiny-qwen2.5-vl")   # or "Qwen/Qwen2.5-VL-3B-Instruct": FAMILIES picks this class
    tokens = vlm.vision.encode_patches(pixels, grid, positions)  # [K, D], windows of the full grid
"""

import torch
import torch.nn.functional as F

from arr_coc.vlm.attention import VisionAttentionProbe
from arr_coc.vlm.qwen2_vl import QwenVL
from arr_coc.vlm.vision import GRAPHED_CELLS, QwenVision
from arr_coc.vlm.views import MERGE

MASKED_PATCHES = 4 * GRAPHED_CELLS  # up to here windows are an [N, N] mask; beyond it a loop over windows
WINDOW_ID_STRIDE = 2**20  # window id = window row * this + window column (grids are far narrower)


class Qwen25Vision(QwenVision):
    """Qwen2.5-VL's tower: QwenVision with window attention over the full grid's windows."""

    @property
    def window_cells(self) -> int:
        """Cells per window side: window_size px / (patch x merge) px, 112 / 28 = 4."""
        c = self.visual.config
        return c.window_size // (c.patch_size * c.spatial_merge_size)

    def window_order(self, cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Cells [K, 2] (row, col), unique -> the stock window order [K] (indices into cells) and the window id of
        each cell in that order [K]. On the device: no host read-back.
        """
        w = self.window_cells
        window = (cells[:, 0] // w) * WINDOW_ID_STRIDE + cells[:, 1] // w  # [K]
        key = window * (w * w) + (cells[:, 0] % w) * w + cells[:, 1] % w  # [K] unique: raster within the window
        order = torch.argsort(key)  # [K]
        return order, window[order]

    def forward(self, patches: torch.Tensor, patch_positions: torch.Tensor,
                        probe: VisionAttentionProbe | None = None) -> torch.Tensor:
        """
        The vision tower over patches [N, 1176] at rotary (h, w) positions [N, 2], 4 per cell in 2x2 order
        (as encode_cells lays them out) -> merged tokens [N/4, D] in the same cell order, with window attention
        over the full grid's windows. Tests pin it to the stock tower. A probe, when given, computes the last
        block's attention, which must be a full-attention block (it is in every released config).
        """
        visual = self.visual
        cells = patch_positions[::4] // MERGE  # [K, 2]: each cell's first patch sits at (2r, 2c)
        order, window = self.window_order(cells)  # [K], [K]
        inner = torch.arange(4, device=order.device)
        patch_order = (order.unsqueeze(1) * 4 + inner).flatten()  # [N]: each cell's 4 patches stay together
        x = visual.patch_embed(patches[patch_order])  # [N, E] in window order
        cos, sin = visual.rotary_pos_emb(x, patch_positions[patch_order])  # [N, hd] each
        window = window.unsqueeze(1).expand(-1, 4).flatten()  # [N] window id per patch
        N = x.shape[0]
        scale = visual.blocks[0].attn.scaling
        if N <= MASKED_PATCHES:
            same_window = (window.unsqueeze(0) == window.unsqueeze(1))[None, None]  # [1, 1, N, N] block-diagonal

            def attend_windows(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=same_window, scale=scale)
        else:  # big views are compute-bound and run eagerly: the window lengths may be read back to the host
            lengths = torch.unique_consecutive(window, return_counts=True)[1].tolist()

            def attend_windows(q, k, v):
                segments = zip(*(t.split(lengths, dim=2) for t in (q, k, v)))  # one window each
                return torch.cat([F.scaled_dot_product_attention(*qkv, scale=scale) for qkv in segments], dim=2)
        full, last = set(visual.fullatt_block_indexes), len(visual.blocks) - 1
        if probe is not None and last not in full:
            raise ValueError(f"the last vision block ({last}) attends within windows: no whole-view attention to read")
        for i, block in enumerate(visual.blocks):
            attend = (probe if i == last else None) if i in full else attend_windows
            x = self.block(block, x, cos, sin, attend)
        if probe is not None:
            probe.reorder(patch_order)  # window order -> the caller's cell order
        merged = visual.merger(x)  # [K, D] in window order
        return torch.empty_like(merged).index_copy_(0, order, merged)  # [K, D] back in the caller's order


class Qwen25VL(QwenVL):
    """The Qwen2.5-VL adapter: QwenVL with the window-attention vision tower."""
    hf_class = "Qwen2_5_VLForConditionalGeneration"
    vision_class = Qwen25Vision
