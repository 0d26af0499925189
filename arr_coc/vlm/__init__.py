"""
The frozen VLM side of ARR-COC: the interface the pipelines use (base: VLM, VisualTokens, Prompt, StockInputs,
Generation), one adapter per Qwen-VL family behind it (qwen2_vl, qwen2_5_vl, qwen3_vl, each with its chat
template), picked by the config's model_type (families), the views and M-RoPE layout they share (views,
positions), the generation engine (decoder) and the offline tiny models (tiny).
"""
