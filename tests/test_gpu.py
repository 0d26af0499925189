"""CUDA-only behaviour: half precision, timing on the device, and a real out-of-memory that the model survives."""

import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.model import ARRCOCQwen, OutOfMemory

pytestmark = pytest.mark.gpu
QUESTION = "What does the gray text say?"


def image():
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (448, 448, 3), dtype=np.uint8))


@pytest.fixture(scope="module", params=[torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def cuda_model(request):
    return ARRCOCQwen.from_pretrained("tiny", device="cuda", dtype=request.param)


def test_arr_runs_in_half_precision_on_cuda(cuda_model):
    a = cuda_model.answer(image(), QUESTION, "arr", max_new_tokens=4)
    assert a.tokens["saccade"] == 273 and a.arr.fallback == [None]
    assert torch.isfinite(a.arr.relevance).all() and torch.isfinite(a.arr.weights).all()
    assert a.peak_memory_mb > 0 and all(a.timings_ms[k] > 0 for k in ("vision", "selection", "prefill"))


def test_zero_saccades_match_the_stock_gestalt_answer_on_cuda(cuda_model):
    arr = cuda_model.answer(image(), QUESTION, "arr", max_new_tokens=6, budget=0)
    stock = cuda_model.answer(image(), QUESTION, "gestalt", max_new_tokens=6)
    assert arr.text == stock.text


def test_a_real_cuda_oom_is_reported_freed_and_survived(cuda_model, monkeypatch):
    vlm = cuda_model.vlm
    real = vlm.encode_cells
    before = torch.cuda.memory_allocated()

    def greedy(*args, **kwargs):
        torch.empty(1 << 45, dtype=torch.uint8, device="cuda")  # 32 TiB: a real allocator failure
        return real(*args, **kwargs)

    monkeypatch.setattr(vlm, "encode_cells", greedy)
    with pytest.raises(OutOfMemory, match="memory was freed"):
        cuda_model.answer(image(), QUESTION, "arr", max_new_tokens=2)
    monkeypatch.setattr(vlm, "encode_cells", real)
    assert torch.cuda.memory_allocated() <= before + (64 << 20)
    assert cuda_model.answer(image(), QUESTION, "arr", max_new_tokens=2).tokens["saccade"] == 273


def test_graph_replay_equals_eager_and_follows_new_inputs(cuda_model):
    from arr_coc.texture import generate_texture_array

    layer = cuda_model.layer
    for seed in (0, 1):  # the second image replays the graph captured for the first
        rng = np.random.default_rng(seed)
        pil = Image.fromarray(rng.integers(0, 255, (448, 448, 3), dtype=np.uint8))
        o = cuda_model.observe(pil, QUESTION)
        eager_textures = generate_texture_array(o.highres, o.views.candidate_grid)
        torch.testing.assert_close(o.textures, eager_textures, atol=1e-5, rtol=1e-5)
        with torch.no_grad():
            replayed = cuda_model.score(o)
        with torch.enable_grad():  # gradients on: the eager path
            eager = layer.score(o.textures, o.question_embeds, None, o.gestalt.unsqueeze(0), o.prior)
        torch.testing.assert_close(replayed["relevance"], eager["relevance"].detach(), atol=1e-4, rtol=1e-4)
    assert len(layer.graphed_score.graphs) == 1 and len(cuda_model.texture.graphs) == 1
