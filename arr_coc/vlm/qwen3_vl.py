"""
Adapter over transformers' Qwen3VLForConditionalGeneration: what Qwen3-VL does differently from Qwen2-VL.

- 16 px patches merged 2x2: a cell is 32 px (the image processor's patch layout is Qwen2-VL's: `image_inputs`).
- The ViT adds a learned absolute `pos_embed`, bilinearly interpolated to the view's patch grid: a saccade
  gets the interpolation of its own patches on the candidate grid, so a subset of cells sees exactly what
  the whole view would.
- DeepStack: blocks `deepstack_visual_indexes` of the ViT feed their own mergers, and their outputs are added
  to the hidden states at the image tokens after the first LLM layers. Every feature block this adapter
  encodes carries them as `features.deepstack` [k, K, D]; `embed` lays them out over the sequence as
  `embeds.deepstack` [k, 1, L, D] (zeros outside image tokens), and the Decoder adds them in prefill and in
  the prior pass. Stock generate() cannot take them with inputs_embeds: the "hf" engine refuses such embeds.
- Interleaved M-RoPE: composed by the text model's own rotary_emb (the Decoder uses it); the position-id
  layout of an image block is Qwen2-VL's (a test pins it to get_rope_index).

    vlm = load_vlm("tiny-qwen3-vl")          # FAMILIES picks this adapter by model_type
    gestalt = vlm.encode_view(views.tensor("gestalt"))       # [Ng, D], gestalt.deepstack [k, Ng, D]
"""

import torch
from transformers.vision_utils import get_vision_interpolation_indices_and_weights

from arr_coc.vlm.qwen2_vl import QwenVL
from arr_coc.vlm.tiny import QWEN3_VL_CHAT_TEMPLATE
from arr_coc.vlm.views import MERGE


class Qwen3VL(QwenVL):
    hf_class = "Qwen3VLForConditionalGeneration"
    stock_generate_takes_embeds = False  # it would drop their DeepStack features
    default_chat_template = QWEN3_VL_CHAT_TEMPLATE  # no default system prompt, unlike Qwen2-VL's

    # --- vision ---

    def _vision_inputs(self, pixel_values: torch.Tensor, grid: tuple[int, int], positions: torch.Tensor) -> tuple:
        """The base inputs plus each patch's pos_embed taps [4K, 4] and weights [4K, 4] on the view's patch grid."""
        patches, patch_positions = super()._vision_inputs(pixel_values, grid, positions)
        visual = self.visual
        grid_thw = torch.tensor([[1, grid[0] * MERGE, grid[1] * MERGE]], device=patches.device)
        # the stock interpolation of the whole grid, one row per patch in merge-block order (as pixel_values)...
        taps, weights = get_vision_interpolation_indices_and_weights(
            grid_thw, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
            align_corners=visual.interpolation_align_corners, spatial_merge_size=MERGE)  # [4 GH GW, 4] each
        # ...gathered at the selected patches: row = cell * 4 + (h % 2) * 2 + w % 2
        h, w = patch_positions.unbind(-1)
        rows = ((h // MERGE) * grid[1] + w // MERGE) * MERGE**2 + (h % MERGE) * MERGE + w % MERGE  # [4K]
        return patches, patch_positions, taps[rows], weights[rows]

    def _vision_forward(self, patches: torch.Tensor, patch_positions: torch.Tensor, taps: torch.Tensor,
                        weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """
        The stock Qwen3-VL tower over one attention sequence of patches [N, 1536] at rotary (h, w) positions
        [N, 2], with their interpolated pos_embed (taps, weights [N, 4]) -> (merged tokens [N/4, D],
        DeepStack features [k, N/4, D]). No host reads: it can be captured as a CUDA graph.
        """
        visual = self.visual
        x = visual.patch_embed(patches)  # [N, E]
        x = x + (visual.pos_embed(taps) * weights[:, :, None]).sum(1).to(x.dtype)  # as the stock forward sums the taps
        cos, sin = visual.rotary_pos_emb(x, patch_positions)
        deepstack = []
        for i, block in enumerate(visual.blocks):
            x = self._vision_block(block, x, cos, sin)
            if i in visual.deepstack_visual_indexes:
                deepstack.append(visual.deepstack_merger_list[visual.deepstack_visual_indexes.index(i)](x))  # [N/4, D]
        return visual.merger(x), torch.stack(deepstack)  # [N/4, D], [k, N/4, D]

    @torch.no_grad()
    def encode_cells(self, pixel_values: torch.Tensor, grid: tuple[int, int], positions: torch.Tensor) -> torch.Tensor:
        """The base encoding [K, D]; the cells' DeepStack features ride along as `.deepstack` [k, K, D]."""
        features, deepstack = super().encode_cells(pixel_values, grid, positions)
        features.deepstack = deepstack
        return features

    def take(self, features: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Some rows of encoded features, their DeepStack features [k, n, D] with them."""
        taken = features[index]
        taken.deepstack = features.deepstack[:, index]
        return taken

    # --- text ---

    def embed(self, input_ids: torch.Tensor, image_features: list[torch.Tensor]) -> torch.Tensor:
        """
        The base embeddings [1, L, D], with `.deepstack`: each image block's DeepStack features at its tokens,
        zeros elsewhere [k, 1, L, D] (None without images). Features must come from encode_cells/encode_view.
        """
        embeds = super().embed(input_ids, image_features)
        embeds.deepstack = None
        if image_features:
            if any(getattr(f, "deepstack", None) is None for f in image_features):
                raise ValueError("Qwen3-VL image features need their DeepStack features: pass what "
                                 "encode_cells/encode_view returned (features.deepstack)")
            levels = torch.cat([f.deepstack for f in image_features], dim=1).to(embeds.dtype)  # [k, n_image, D]
            mask = (input_ids == self.image_token_id).unsqueeze(-1)  # [1, L, 1]
            embeds.deepstack = torch.stack([torch.zeros_like(embeds).masked_scatter(mask, level) for level in levels])
        return embeds

    def deepstack(self, inputs_embeds: torch.Tensor) -> torch.Tensor | None:
        if not hasattr(inputs_embeds, "deepstack"):
            raise ValueError("Qwen3-VL inputs_embeds must come from embed(), which lays out the DeepStack features")
        return inputs_embeds.deepstack

    @torch.no_grad()
    def generate(self, max_new_tokens: int, streamer=None, **inputs) -> torch.Tensor:
        """The base generate: the fast engine adds DeepStack itself; stock generate() only from pixel inputs."""
        if self.engine != "fast" and "inputs_embeds" in inputs and self.deepstack(inputs["inputs_embeds"]) is not None:
            raise ValueError("the hf engine cannot run Qwen3-VL image embeddings: stock generate() drops their "
                             "DeepStack features; use the fast engine (the stock baselines run on both)")
        return super().generate(max_new_tokens, streamer, **inputs)
