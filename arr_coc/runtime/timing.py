"""
A CUDA-synchronised stopwatch and a peak-memory probe, so the latency split (vision, selection, prefill,
decode) measures the device's work, not the time to queue it.

    watch = Stopwatch(device)
    with watch.section("vision"):
        ...
    watch.ms  # {"vision": 12.3}
    generation = yield from timed_tokens(tokens, watch)     # + "prefill" and "decode", for a token generator
"""

import math
import re
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers.generation.streamers import BaseStreamer

TIMING_KEYS = ("vision", "selection", "prefill", "decode", "total")  # an Answer's latency split, in table order


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    def __init__(self, device: torch.device):
        self.device = device
        self.ms: dict[str, float] = {}

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    @contextmanager
    def section(self, name: str):
        """Time a block; repeated sections of one name add up."""
        start = self.now()
        try:
            yield
        finally:
            self.add(name, (self.now() - start) * 1000)

    def add(self, name: str, ms: float) -> None:
        self.ms[name] = self.ms.get(name, 0.0) + ms


@contextmanager
def timed_module(module: torch.nn.Module, watch: Stopwatch, name: str):
    """Time every forward of `module` (e.g. the vision tower inside the stock generate) into watch[name]."""
    starts = []
    pre = module.register_forward_pre_hook(lambda *_: starts.append(watch.now()))
    post = module.register_forward_hook(lambda *_: watch.add(name, (watch.now() - starts.pop()) * 1000))
    try:
        yield
    finally:
        pre.remove()
        post.remove()


class TimingStreamer(BaseStreamer):
    """Stamps the first generated token (end of prefill) and the end of decoding; forwards to another streamer."""

    def __init__(self, watch: Stopwatch, inner: BaseStreamer | None = None):
        self.watch, self.inner = watch, inner
        self.start = watch.now()
        self.first_token_at: float | None = None
        self.puts = 0
        self.new_tokens = 0

    def put(self, value):
        self.puts += 1
        if self.puts > 1:  # generate() first puts the prompt
            self.new_tokens += value.numel()
            if self.first_token_at is None:
                self.first_token_at = self.watch.now()
        if self.inner is not None:
            self.inner.put(value)

    def end(self):
        end = self.watch.now()
        first = self.first_token_at or end
        self.watch.add("prefill", (first - self.start) * 1000)
        self.watch.add("decode", (end - first) * 1000)
        if self.inner is not None:
            self.inner.end()


def timed_tokens(tokens, watch: Stopwatch):
    """
    An engine's token generator, passed through, its own time added to watch: "prefill" up to its first token,
    "decode" from there to its end (TimingStreamer's split, for an engine that yields its tokens). The time its
    caller holds a token (the same thread: the app's stream) counts in neither -> the engine's value. Closed early,
    it closes the engine.
    """
    start, first, held = watch.now(), None, 0.0
    try:
        while True:
            try:
                token = next(tokens)
            except StopIteration as end:
                stop = watch.now()
                first = stop if first is None else first
                watch.add("prefill", (first - start) * 1000)
                watch.add("decode", (stop - first - held) * 1000)
                return end.value
            if first is None:
                first = watch.now()
            given = time.perf_counter()  # the engine has synchronised already: it read the token
            yield token
            held += time.perf_counter() - given
    finally:
        tokens.close()


PROC_STATUS, PROC_CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def reset_peak_memory(device: torch.device) -> None:
    """
    Start a request's peak: CUDA's peak-allocated counter, or on CPU the process's peak resident memory
    (Linux resets it when "5" is written to /proc/self/clear_refs; elsewhere there is no request's own CPU peak).
    """
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        PROC_CLEAR_REFS.write_text("5")
    except OSError:
        pass  # not Linux, or not allowed: peak_memory_mb says so with NaN


def peak_memory_mb(device: torch.device) -> float:
    """
    Peak memory since reset_peak_memory: GPU memory allocated, or on CPU the process's peak resident memory
    (Linux's VmHWM, the weights included, as the GPU's count includes them). NaN where the CPU peak cannot be
    reset: a lifetime maximum would be a number that means something else.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        PROC_CLEAR_REFS.stat()
        match = re.search(r"^VmHWM:\s+(\d+) kB", PROC_STATUS.read_text(), re.MULTILINE)
    except OSError:
        return math.nan
    return int(match.group(1)) / 2**10 if match else math.nan
