"""
The ARR relevance layer, the science of ARR-COC: the 13-channel texture array (texture), the three scorers
(knowing), the query-aware balancer (balancing), the allocator of exactly `budget` saccades (attending) and
the trainable layer that chains them, with its safetensors checkpoints (layer, config). It knows nothing of
any VLM: arr_coc.vlm and arr_coc.model feed it tensors.
"""
