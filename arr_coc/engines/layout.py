"""
ARR's prompt as the vLLM plugin lays it out, through the pipelines' own layout (ChatLayout, as arr.arr_prompt calls it
over the gestalt and the saccades): what one image's pad becomes (ARR's two blocks, arr_slot) and the prompt's M-RoPE
positions (arr_positions). Torch, no vLLM: tests/test_engine_layout.py compares both with arr_prompt.

    slot = arr_slot(chat, 16 * 16, 273)        # [pads] <|vision_end|><|vision_start|> [pads]: the ids one pad becomes
    positions = arr_positions(chat, ids, (16, 16), (64, 64), cells)   # [3, L]
"""

import torch

from arr_coc.vlm.chat import ChatLayout
from arr_coc.vlm.positions import ImageBlock, raster_block


def arr_slot(chat: ChatLayout, gestalt_tokens: int, saccades: int) -> list[int]:
    """The ids ARR's two blocks stand on in its prompt (ChatLayout.prompt_ids over [Ng, K], as arr_prompt lays out the
    gestalt and the saccades), from the first pad to the last: what a one-pad image slot is replaced by."""
    ids = chat.prompt_ids("?", [gestalt_tokens, saccades])[0].tolist()
    first = ids.index(chat.image_token_id)
    last = len(ids) - ids[::-1].index(chat.image_token_id)
    return ids[first:last]


def arr_positions(chat: ChatLayout, ids: torch.Tensor, gestalt_grid: tuple[int, int], candidate_grid: tuple[int, int],
                  cells: torch.Tensor) -> torch.Tensor:
    """[1, L] prompt ids -> [3, L] M-RoPE positions (ChatLayout.position_ids): the gestalt block in raster order, the
    saccades (cells [K, 2] on the candidate grid, in feed order) at their true places; no blocks where there is no
    image (a text-only prompt is all text, whatever ids a user typed)."""
    blocks = [raster_block(gestalt_grid), ImageBlock(candidate_grid, cells)] if gestalt_grid else []
    if not blocks:
        return torch.arange(ids.shape[1]).expand(3, -1).clone()  # [3, L]
    return chat.position_ids(ids, blocks)[:, 0]  # [3, L]
