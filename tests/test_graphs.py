"""CUDAGraphed off CUDA: what its capture path does when Inductor cannot compile the function (tests/test_gpu.py
runs the real captures)."""

import pytest
import torch

from arr_coc.runtime import graphs


def double(x):
    return x * 2


def test_a_function_inductor_cannot_compile_is_captured_as_it_is_with_a_warning(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("InductorError: no working C++ compiler\nsecond line")

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: failing)
    monkeypatch.setattr(graphs, "capture", lambda fn, args, pool: (None, args, fn(*args)))  # one call stands in
    graphed = graphs.CUDAGraphed(double, compile=True)
    with pytest.warns(UserWarning, match=r"^double not compiled \(RuntimeError: InductorError: no working C\+\+ "
                                         r"compiler\); capturing it as it is$"):
        _, _, out = graphed._capture((torch.tensor([1.0, 2.0]),))
    assert graphed.compile is False and graphed.compile_seconds > 0
    assert torch.equal(out, torch.tensor([2.0, 4.0]))
