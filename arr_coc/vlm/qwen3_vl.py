"""
Adapter over transformers' Qwen3VLForConditionalGeneration: what Qwen3-VL does differently from Qwen2-VL.

- 16 px patches merged 2x2: a cell is 32 px (the image processor's patch layout is Qwen2-VL's: `image_inputs`).
- The ViT adds a learned absolute `pos_embed`, bilinearly interpolated to the view's patch grid: a saccade
  gets the interpolation of its own patches on the candidate grid, so a subset of cells sees exactly what
  the whole view would.
- DeepStack: blocks `deepstack_visual_indexes` of the ViT feed their own mergers, and their outputs are added
  to the hidden states at the image tokens after the first LLM layers. Every VisualTokens this adapter
  encodes carries them in its `deepstack` field [k, K, D]; `prompt` lays them out over the sequence as
  `Prompt.deepstack` [k, 1, L, D] (zeros outside image tokens), and the Decoder adds them in prefill, in
  teacher forcing and in the prior pass. Stock generate() cannot take them with inputs_embeds: the "hf"
  engine refuses such a prompt.
- Its chat template (below) has no default system prompt, unlike Qwen2-VL's.
- Interleaved M-RoPE: composed by the text model's own rotary_emb (the Decoder uses it); the position-id
  layout of an image block is Qwen2-VL's (a test pins it to get_rope_index).

    vlm = load_vlm("tiny-qwen3-vl")          # FAMILIES picks this adapter by model_type
    gestalt = vlm.encode_view(views.tensor("gestalt"))       # VisualTokens: features [Ng, D], deepstack [k, Ng, D]
"""

import torch
from transformers.vision_utils import get_vision_interpolation_indices_and_weights

from arr_coc.vlm.attention import VisionAttentionProbe
from arr_coc.vlm.qwen2_vl import QwenVL
from arr_coc.vlm.vision import QwenVision
from arr_coc.vlm.views import MERGE


# The Qwen3-VL chat template (as on the hub's Qwen/Qwen3-VL-*-Instruct repos, chat_template.json): no default
# system prompt; images as <|vision_start|><|image_pad|><|vision_end|>; tool calls and tool responses.
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


class Qwen3Vision(QwenVision):
    """Qwen3-VL's tower: QwenVision with the interpolated pos_embed and DeepStack features."""

    def inputs(self, pixel_values: torch.Tensor, grid: tuple[int, int], positions: torch.Tensor) -> tuple:
        """The base inputs plus each patch's pos_embed taps [4K, 4] and weights [4K, 4] on the view's patch grid."""
        patches, patch_positions = super().inputs(pixel_values, grid, positions)
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

    def forward(self, patches: torch.Tensor, patch_positions: torch.Tensor, taps: torch.Tensor,
                        weights: torch.Tensor, probe: VisionAttentionProbe | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """
        The stock Qwen3-VL tower over one attention sequence of patches [N, 1536] at rotary (h, w) positions
        [N, 2], with their interpolated pos_embed (taps, weights [N, 4]) -> (merged tokens [N/4, D],
        DeepStack features [k, N/4, D]). No host reads: it can be captured as a CUDA graph. A probe, when given,
        computes the last block's attention (encode_view_attention).
        """
        visual = self.visual
        x = visual.patch_embed(patches)  # [N, E]
        x = x + (visual.pos_embed(taps) * weights[:, :, None]).sum(1).to(x.dtype)  # as the stock forward sums the taps
        cos, sin = visual.rotary_pos_emb(x, patch_positions)
        deepstack, last = [], len(visual.blocks) - 1
        for i, block in enumerate(visual.blocks):
            x = self.block(block, x, cos, sin, probe if i == last else None)
            if i in visual.deepstack_visual_indexes:
                deepstack.append(visual.deepstack_merger_list[visual.deepstack_visual_indexes.index(i)](x))  # [N/4, D]
        return visual.merger(x), torch.stack(deepstack)  # [N/4, D], [k, N/4, D]


class Qwen3VL(QwenVL):
    """The Qwen3-VL adapter: QwenVL with 32 px cells, the interpolated pos_embed and DeepStack features."""
    hf_class = "Qwen3VLForConditionalGeneration"
    stock_generate_takes_embeds = False  # it would drop their DeepStack features
    default_chat_template = CHAT_TEMPLATE  # no default system prompt, unlike Qwen2-VL's
    vision_class = Qwen3Vision
