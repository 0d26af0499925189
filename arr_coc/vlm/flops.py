"""
Estimated compute of the vision tower and the LLM prefill, from the model config alone.

On an H100 batch-1 inference is launch-bound, so milliseconds hide the compute ARR saves; on a T4 they
do not. Counts are multiply-adds x 2 of the matrix products (projections, MLPs, attention scores and
values, patch embedding, merger, the LM head's one row); norms, rotary and softmax are left out.

    from arr_coc.vlm.flops import vision_gflops, prefill_gflops
    vision_gflops(model.config.vision_config, patches=1024)       # the 16x16 gestalt
    prefill_gflops(model.config.text_config, tokens=560)
"""


def vision_gflops(vision_config, patches: int) -> float:
    """
    One vision-tower pass over `patches` patches in one attention sequence (merged 4 -> 1 at the end). Qwen2-VL
    names its width embed_dim (its hidden_size is the output); Qwen3-VL names it hidden_size, and adds a merger
    per DeepStack block.
    """
    c = vision_config
    windowed = hasattr(c, "fullatt_block_indexes")  # Qwen2.5-VL: window attention and a gated (3-matrix) MLP
    E = getattr(c, "embed_dim", None) or c.hidden_size  # the ViT width (Qwen2-VL's hidden_size is the LLM's)
    inner = int(E * c.mlp_ratio) if hasattr(c, "mlp_ratio") else c.intermediate_size
    out = getattr(c, "out_hidden_size", None) or c.hidden_size  # the LLM width
    mergers = 1 + len(getattr(c, "deepstack_visual_indexes", None) or ())  # Qwen3-VL: DeepStack mergers
    patch_in = c.in_channels * c.temporal_patch_size * c.patch_size**2
    merged = patches // c.spatial_merge_size**2
    window = min(patches, (c.window_size // c.patch_size) ** 2) if windowed else patches  # keys per query
    full = len(c.fullatt_block_indexes) if windowed else c.depth
    per_block = patches * (4 * E * E + (3 if windowed else 2) * E * inner)  # qkv+proj, MLP
    attention = 2 * patches * E * (full * patches + (c.depth - full) * window)  # QK^T and AV
    merger = mergers * (merged * (4 * E) * (4 * E) + merged * (4 * E) * out)
    return 2 * (patches * patch_in * E + c.depth * per_block + attention + merger) / 1e9


def prefill_gflops(text_config, tokens: int, layers: int | None = None, logits: bool = True) -> float:
    """A causal pass of `tokens` tokens through `layers` decoder layers (all by default), plus one row of logits."""
    c = text_config
    D, inner = c.hidden_size, c.intermediate_size
    hd = getattr(c, "head_dim", None) or D // c.num_attention_heads  # Qwen3 sets it: heads x head_dim may differ from D
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    per_layer = tokens * (2 * D * q + 2 * D * kv + 3 * D * inner) + tokens * tokens * q  # causal: half of 2 L^2 q
    head = D * c.vocab_size if logits else 0
    return 2 * ((c.num_hidden_layers if layers is None else layers) * per_layer + head) / 1e9
