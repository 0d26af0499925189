"""Shared fixtures: the offline tiny Qwen2-VL (built once per session) and small test images."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def arr_model():
    """ARRCOCQwen on the tiny model, fp32 CPU (or the GPU when there is one)."""
    from arr_coc.model import ARRCOCQwen

    return ARRCOCQwen.from_pretrained("tiny")
