"""
ZeroGPU, the Hugging Face Spaces hardware that lends a GPU per call: a function decorated with
`@spaces.GPU(duration=seconds)` gets a GPU for at most that long, in a worker process forked for the call.
The platform sets SPACES_ZERO_GPU and ships the `spaces` package; elsewhere both helpers here do nothing.

    if on_zerogpu(): ...                           # e.g. skip the CUDA-graph warm-up
    handler = on_gpu(handler, duration=120)       # spaces.GPU(duration=120)(handler) on ZeroGPU, else handler

Captured CUDA graphs cannot outlive the forked worker they were captured in, so on ZeroGPU nothing is
captured (arr_coc.runtime.graphs.cuda_graphs_allowed): every call runs the eager path. Torch-free.
"""

import os


def on_zerogpu() -> bool:
    """True on a ZeroGPU Space: SPACES_ZERO_GPU set (to anything but 0/false) and the `spaces` package importable."""
    if os.environ.get("SPACES_ZERO_GPU", "").strip().lower() in ("", "0", "false"):
        return False
    try:
        import spaces  # noqa: F401  (ZeroGPU Spaces ship it)
    except ImportError:
        return False
    return True


def on_gpu(handler, duration: int):
    """The handler in spaces.GPU(duration=...) on ZeroGPU (a GPU for at most `duration` s a call), else as it is."""
    if not on_zerogpu():
        return handler
    import spaces

    return spaces.GPU(duration=duration)(handler)
