"""ARR-COC: query-aware visual token selection (Adaptive Relevance Realization) for Qwen2-VL, Qwen2.5-VL and Qwen3-VL."""

__version__ = "0.1.0"
