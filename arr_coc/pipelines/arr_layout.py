"""
ARR's prompt: the one place its two image blocks (the gestalt in raster order, then the saccades at their true
M-RoPE places) are laid out, for answering, training, faithfulness and the vLLM plugin alike (arr_prompt over the
project's VLM; arr_slot and arr_positions over vLLM's ids, tests/test_engine_layout.py compares them), and what the
blocks cost (block_tokens, round_gflops, crop_compute).

    prompt = arr_prompt(vlm, observation, encode_saccades(vlm, observation, out.positions))
    slot = arr_slot(chat, 16 * 16, 273)        # [pads] <|vision_end|><|vision_start|> [pads]: the ids one pad becomes
    positions = arr_positions(chat, ids, (16, 16), (64, 64), cells)   # [3, L]
"""

import torch

from arr_coc.pipelines.arr_scene import Observation
from arr_coc.pipelines.request import Parts
from arr_coc.pipelines.two_scale import crop_gflops
from arr_coc.vlm.base import VLM, Prompt, VisualTokens
from arr_coc.vlm.chat import ChatLayout
from arr_coc.vlm.positions import ImageBlock, raster_block


def crop_compute(parts: Parts, observation: Observation, prompt: Prompt, read_gestalt: int, K: int) -> dict:
    """The crop's GFLOPs (two_scale.crop_gflops), its prior pass over the answer's template and question (`prompt`'s
    tokens but its image blocks) and the crop's block; nothing for one look."""
    crop = observation.crop
    if crop is None:
        return dict(vision=0.0, prefill=0.0)
    text = prompt.length - block_tokens(read_gestalt) - block_tokens(K)  # the question and the template
    return crop_gflops(parts.vlm, crop, text + block_tokens(len(crop.tokens)), parts.pipeline.prior_layer_fraction)


def arr_prompt(vlm: VLM, observation: Observation, saccades: VisualTokens | None, answer: str | None = None,
               gestalt: bool = True) -> Prompt:
    """The gestalt block (unless ablated), the saccades as a second block (none when there are none), the
    question, and optionally an answer to teacher-force."""
    images = ([observation.gestalt] if gestalt else []) + ([saccades] if saccades is not None and len(saccades) else [])
    return vlm.prompt(observation.question, images, answer=answer)


def encode_saccades(vlm: VLM, observation: Observation, positions: torch.Tensor) -> VisualTokens | None:
    """The high-res view's cells at positions [K, 2], at their true places (None for K = 0)."""
    return vlm.encode_cells(observation.highres, positions) if len(positions) else None


def block_tokens(n: int) -> int:
    """An image block's tokens in the prompt: its n tokens with its start and end (none for n = 0)."""
    return n + 2 if n else 0


def round_gflops(vlm: VLM, parts: Parts, vision_cells: list[int], prompt: Prompt, read_gestalt: int,
                 n_gestalt: int, seen: int, saccades: int, guide_tokens: int | None = None) -> dict:
    """One round's compute: its vision passes, its prior pass over [gestalt + the `seen` saccades of rounds before
    + question] (or, for a second look the first answer's attention points, guide_tokens through every layer),
    and its prefill of `prompt` (read_gestalt gestalt tokens, seen + this round's saccades)."""
    if guide_tokens is not None:
        return vlm.gflops(vision_cells, prompt.length, guide_tokens, 1.0)
    text = prompt.length - block_tokens(read_gestalt) - block_tokens(seen + saccades)  # the question and the template
    return vlm.gflops(vision_cells, prompt.length, text + block_tokens(n_gestalt) + block_tokens(seen),
                      parts.pipeline.prior_layer_fraction)


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
