"""
M-RoPE position ids for a prompt with image blocks, laid out as transformers' get_rope_index lays out each block,
but for any subset of a grid's cells in any order: the sparse saccade block keeps every cell's true place.

    ids = ...  # [1, L] with image pads
    position_ids = mrope_position_ids(ids, image_token_id, [raster_block((16, 16)), ImageBlock((64, 64), cells)])
"""

from dataclasses import dataclass

import torch


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
