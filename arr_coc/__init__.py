"""ARR-COC: query-aware visual token selection (Adaptive Relevance Realization) for Qwen2-VL."""
