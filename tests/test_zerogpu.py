"""
ZeroGPU with a stand-in `spaces` module (put in sys.modules, SPACES_ZERO_GPU set): the app's GPU handlers are
wrapped in spaces.GPU(duration=...), the CPU ones are not, importing the app touches no CUDA, start-up
captures no CUDA graphs, and CUDAGraphed runs eagerly; on a GPU, an answer compiles, captures and fuses
nothing. Without SPACES_ZERO_GPU nothing is wrapped.

    .venv/bin/python -m pytest tests/test_zerogpu.py -q
"""

import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import scene_image

from arr_coc.runtime import graphs, zerogpu

ROOT = Path(__file__).resolve().parents[1]

STAND_IN = '''
import inspect, sys, types

def GPU(duration=60):
    """spaces.GPU(duration=...) as ZeroGPU's decorator is called; marks what it wraps."""
    def wrap(fn):
        if inspect.isgeneratorfunction(fn):
            def wrapped(*args, **kwargs):
                yield from fn(*args, **kwargs)
        else:
            def wrapped(*args, **kwargs):
                return fn(*args, **kwargs)
        wrapped.__name__, wrapped.__wrapped__, wrapped.zerogpu_duration = fn.__name__, fn, duration
        return wrapped
    return wrap

spaces = types.ModuleType("spaces")
spaces.GPU = GPU
sys.modules["spaces"] = spaces
'''


@pytest.fixture
def on_zerogpu(monkeypatch):
    namespace = {}
    exec(STAND_IN, namespace)
    monkeypatch.setitem(sys.modules, "spaces", namespace["spaces"])
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")


def event_functions(demo) -> dict:
    """The public events by api_name (a private one repeats a public one on other triggers)."""
    return {fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name and fn.api_visibility == "public"}


def test_gpu_handlers_are_wrapped_and_cpu_ones_are_not(on_zerogpu, arr_model):
    import app

    demo = app.make_app(arr_model, app.ui.PRIOR, [])
    events = event_functions(demo)
    wrapped = {name: fn.zerogpu_duration for name, fn in events.items() if hasattr(fn, "zerogpu_duration")}
    assert wrapped == app.GPU_SECONDS == dict(compare=120, microscope=60, kept_cells=60, faithfulness=120,
                                              converse=120, ab=120, where_it_looks=120)
    cpu_only = {"reselect", "redraw", "new_conversation"}
    assert cpu_only <= set(events) - set(wrapped)  # CPU work: no GPU lent
    assert inspect.isgeneratorfunction(events["compare"]) and inspect.isgeneratorfunction(events["ab"])  # still stream


def test_nothing_is_wrapped_off_zerogpu(monkeypatch, arr_model):
    import app

    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert not zerogpu.on_zerogpu()
    events = event_functions(app.make_app(arr_model, app.ui.PRIOR, []))
    assert not any(hasattr(fn, "zerogpu_duration") for fn in events.values())


def test_importing_the_app_touches_no_cuda():
    """ZeroGPU reports CUDA as available at start-up; importing app.py must still not initialise it."""
    code = STAND_IN + '''
import os, torch
os.environ["SPACES_ZERO_GPU"] = "true"
touched = []
torch.cuda.is_available = lambda: True
torch.cuda._lazy_init = lambda: touched.append("cuda initialised")
import app
from arr_coc.runtime import zerogpu
assert zerogpu.on_zerogpu()
print("touched:", touched, torch.cuda.is_initialized())
'''
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "touched: [] False"


def test_start_up_captures_no_cuda_graphs_on_zerogpu(on_zerogpu, caplog):
    import app

    model = types.SimpleNamespace(vlm=types.SimpleNamespace(device=torch.device("cuda")),
                                  warmup=lambda: pytest.fail("CUDA graphs captured at start-up on ZeroGPU"))
    with caplog.at_level("INFO", logger="arr_coc.app"):
        app.warm_up(model)
    assert "no CUDA graphs are captured" in caplog.text
    assert not graphs.cuda_graphs_allowed()


class LooksLikeCUDA(torch.Tensor):
    """A CPU tensor that says it is on CUDA, so CUDAGraphed would capture it (and fail on a machine without CUDA)."""
    is_cuda = property(lambda self: True)


def test_cuda_graphed_work_runs_eagerly_on_zerogpu(on_zerogpu):
    doubled = graphs.CUDAGraphed(lambda x: x * 2)
    with torch.no_grad():
        out = doubled(torch.ones(3).as_subclass(LooksLikeCUDA))
    assert out.tolist() == [2.0, 2.0, 2.0] and not doubled.graphs  # nothing captured


@pytest.mark.gpu
def test_nothing_is_compiled_captured_or_fused_on_zerogpu(on_zerogpu, monkeypatch):
    """On a real GPU with ZeroGPU's stand-in: an ARR answer runs eagerly, nothing compiled (Inductor's compile would
    be paid in every forked worker), captured or re-laid (Decoder.fuse)."""
    from arr_coc.model import ARRCOCQwen

    monkeypatch.setattr(torch, "compile", lambda *args, **kwargs: pytest.fail("torch.compile called on ZeroGPU"))
    model = ARRCOCQwen.from_pretrained("tiny", device="cuda", dtype=torch.bfloat16)
    answer = model.answer(scene_image(896, 896), "What does the gray text say?", "arr", max_new_tokens=4)
    vlm = model.vlm
    assert answer.tokens.saccade == 273
    assert vlm.decoder.fused is None and vlm.decoder.compiled_step is None and not vlm.decoder.decode_graphs
    assert not vlm.vision.graphed.graphs and vlm.vision.graphed.compiled is None
