"""
CUDA-graph replay for the fixed-shape parts of ARR (texture array, scorers, balancer).

At batch 1 these are a few hundred tiny kernels: launch-bound, so eager PyTorch spends most of its time
in Python and kernel launches. A CUDA graph captured once per input signature replays them as one launch.
Off CUDA, when gradients are needed (training), or on ZeroGPU, the function simply runs eagerly.
With compile=True the function is first compiled by Inductor (its kernels fused), then captured: one compile,
every tensor argument's first dimension dynamic, serves every length; where Inductor fails it is captured as it is.

    texture = CUDAGraphed(generate_texture_array)
    tex = texture(images, (32, 32))   # first call per shape captures, later calls replay

A function's output may be a tensor, None, or tuples, lists, dicts and dataclasses of them (the layer's forward
returns a ScoreMaps): a replay hands back clones of the graph's static outputs in the same structure (map_leaves).
"""

import time
import warnings
from collections import OrderedDict
from dataclasses import fields, is_dataclass, replace

import torch
from torch.utils._pytree import tree_map

from arr_coc.runtime.zerogpu import on_zerogpu


def cuda_graphs_allowed() -> bool:
    """False on ZeroGPU: each call runs in a forked worker, which a captured graph cannot outlive (eager instead)."""
    return not on_zerogpu()


def runs_eagerly(args) -> bool:
    """Whether a call with these arguments runs the function itself: off CUDA, with gradients on (training), or
    where graphs are not allowed (ZeroGPU)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return not tensors or not tensors[0].is_cuda or torch.is_grad_enabled() or not cuda_graphs_allowed()


def _signature(args) -> tuple:
    """Shapes and dtypes of tensor arguments, values of everything else: one graph per signature."""
    return tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)


def map_leaves(fn, out):
    """out with fn applied to each leaf, in the same structure: through tuples, lists and dicts (torch's pytree) and
    dataclass instances (field by field, rebuilt with dataclasses.replace), at any depth."""
    def leaf(value):
        if is_dataclass(value) and not isinstance(value, type):
            return replace(value, **{f.name: map_leaves(fn, getattr(value, f.name)) for f in fields(value) if f.init})
        return fn(value)
    return tree_map(leaf, out)


def leaves(out) -> list:
    """Every leaf of out, as map_leaves walks it."""
    found = []
    map_leaves(lambda value: found.append(value) or value, out)
    return found


def capture(fn, args, pool=None):
    """
    Capture fn(*args) as a CUDA graph -> (graph, static_args, static_out). Tensor args are cloned into static
    buffers (copy new values in, then replay); other args are passed as they are. `pool` shares memory
    between graphs that never run at the same time.
    """
    static_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the graph: caches, cuFFT/cuBLAS plans, lazy init
        for _ in range(2):
            fn(*static_args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):  # other app threads may use the GPU
        static_out = fn(*static_args)
    assert all(isinstance(t, torch.Tensor) or t is None for t in leaves(static_out))
    return graph, static_args, static_out


class CUDAGraphed:
    def __init__(self, fn, max_graphs: int = 32, pool=None, compile: bool = False):
        self.fn = fn
        self.compile = compile  # compile fn with Inductor before capturing it (turned off where Inductor fails)
        self.compiled = None  # the compiled fn, made at the first capture
        self.compile_seconds = 0.0  # time spent capturing compiled graphs (the compile is paid by the first)
        self.max_graphs = max_graphs  # oldest graphs are dropped beyond this (e.g. many question lengths)
        self.graphs: OrderedDict = OrderedDict()
        self.pool = pool  # a memory pool shared with other graphs that never run at the same time (None: private)

    def __call__(self, *args):
        if runs_eagerly(args):
            return self.fn(*args)
        key = _signature(args)
        if key not in self.graphs:
            self.graphs[key] = self._capture(args)
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        graph, static_args, static_out = self.graphs[key]
        for static, a in zip(static_args, args):
            if isinstance(a, torch.Tensor):
                static.copy_(a)
        graph.replay()
        return map_leaves(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, static_out)

    def _capture(self, args):
        if self.compile:
            start = time.perf_counter()
            try:
                return capture(self.compiled_fn(), args, self.pool)
            except Exception as e:  # no Triton or C compiler, an op Inductor cannot lower: run it uncompiled
                warnings.warn(f"{self.fn.__name__} not compiled ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200]}); capturing it as it is")
                self.compile = False
            finally:
                self.compile_seconds += time.perf_counter() - start
        return capture(self.fn, args, self.pool)

    def compiled_fn(self):
        """fn compiled by Inductor (fullgraph), each tensor argument's first dimension (a sequence: patches, cells)
        marked dynamic, so that one compile serves every length."""
        if self.compiled is None:
            compiled = torch.compile(self.fn, fullgraph=True, options={"emulate_precision_casts": True})

            def run(*args):
                for a in args:
                    if isinstance(a, torch.Tensor):
                        torch._dynamo.maybe_mark_dynamic(a, 0)
                return compiled(*args)
            self.compiled = run
        return self.compiled
