"""
The frozen Qwen-VL side of ARR-COC: one adapter per family behind QwenVL's interface (qwen2_vl, qwen2_5_vl,
qwen3_vl), picked by the config's model_type (families), the views and M-RoPE layout they share (views,
positions), the generation engine (decoder) and the offline tiny models (tiny).
"""
