"""The stopwatch, the prefill/decode split of a streamed generation, and the memory probe."""

import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from arr_coc.runtime import timing
from arr_coc.runtime.timing import Stopwatch, TimingStreamer, peak_memory_mb, timed_module, timed_tokens


@pytest.fixture
def clock(monkeypatch):
    """A fake perf_counter that moves only when a test advances it: exact, and blind to machine load."""
    now = [100.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def advance(ms: float) -> None:
        now[0] += ms / 1000
    return advance


def test_sections_of_one_name_add_up(clock):
    watch = Stopwatch(torch.device("cpu"))
    for _ in range(2):
        with watch.section("vision"):
            clock(20)
    with watch.section("selection"):
        pass
    clock(500)  # outside any section: counted nowhere
    assert watch.ms == pytest.approx({"vision": 40.0, "selection": 0.0})


def test_streamer_splits_prefill_from_decode_and_counts_tokens(clock):
    class Inner:
        def __init__(self):
            self.seen, self.ended = [], False

        def put(self, value):
            self.seen.append(value)

        def end(self):
            self.ended = True

    watch, inner = Stopwatch(torch.device("cpu")), Inner()
    timer = TimingStreamer(watch, inner)
    timer.put(torch.tensor([[1, 2, 3]]))  # generate() first puts the prompt
    clock(50)  # "prefill"
    timer.put(torch.tensor([7]))
    for _ in range(3):
        clock(10)  # "decode"
        timer.put(torch.tensor([8]))
    timer.end()
    assert timer.new_tokens == 4 and inner.ended and len(inner.seen) == 5
    assert watch.ms == pytest.approx({"prefill": 50.0, "decode": 30.0})


def test_an_engine_that_yields_its_tokens_is_split_without_the_time_its_caller_holds_them(clock):
    """timed_tokens: 50 ms to the first token is the prefill, the engine's 3 steps of 10 ms the decode; the 1000 ms
    the caller spends on each token (the app's stream, in the same thread) counts in neither; closed early, the
    engine is closed."""
    closed = []

    def engine():
        try:
            clock(50)
            yield 7
            for token in (8, 9, 10):
                clock(10)
                yield token
        finally:
            closed.append(True)
        return "its Generation"

    watch = Stopwatch(torch.device("cpu"))
    tokens, seen = timed_tokens(engine(), watch), []
    while True:
        try:
            seen.append(next(tokens))
        except StopIteration as end:
            assert end.value == "its Generation"
            break
        clock(1000)  # the caller holds the token
    assert seen == [7, 8, 9, 10] and watch.ms == pytest.approx({"prefill": 50.0, "decode": 30.0}) and closed
    early = timed_tokens(engine(), Stopwatch(torch.device("cpu")))
    next(early)
    closed.clear()
    early.close()
    assert closed == [True]


def test_timed_module_times_every_forward(clock):
    watch = Stopwatch(torch.device("cpu"))
    layer = torch.nn.Linear(4, 4)
    layer.register_forward_hook(lambda *_: clock(10))  # each forward "takes" 10 ms
    with timed_module(layer, watch, "vision"):
        layer(torch.ones(1, 4))
        layer(torch.ones(1, 4))
    layer(torch.ones(1, 4))  # outside the block: not timed
    assert watch.ms == pytest.approx({"vision": 20.0})
    assert not layer._forward_pre_hooks and len(layer._forward_hooks) == 1  # only the test's own hook is left


PEAK_PROBE = """
import os, sys
from pathlib import Path
import numpy as np, torch
from arr_coc.runtime.timing import peak_memory_mb
cpu = torch.device("cpu")
before = peak_memory_mb(cpu)
current = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
big = np.ones(int((before - current + 200) * 2**20), dtype=np.uint8)  # now + (old peak - now) + 200 MB, touched
print(peak_memory_mb(cpu) - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_peak_memory_sees_a_large_allocation_on_cpu():
    """The probe is the process's peak RSS: touching 200 MB more than the process ever held raises it ~200 MB. In a
    fresh interpreter: in the suite's own process, hundreds of tests' memory history (GBs of peak, pages the kernel
    may have reclaimed) decides what 'more than ever held' costs, and the run saw no growth at all."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", PEAK_PROBE], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout
    grew = float(out.strip().splitlines()[-1])
    assert 150 <= grew <= 400, grew


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resets the peak through /proc/self/clear_refs")
def test_cpu_peak_is_the_requests_own_not_the_processes_lifetime_peak():
    """After an earlier 300 MB peak, a reset makes a small request's peak the memory in use now plus its own 20 MB."""
    cpu = torch.device("cpu")
    touched_mapping(300).close()  # an earlier request's peak
    timing.reset_peak_memory(cpu)
    current = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    small = touched_mapping(20)  # this request: 20 MB of fresh pages (not memory the allocator kept)
    peak = peak_memory_mb(cpu)
    small.close()
    assert current + 15 <= peak <= current + 60, (current, peak)


def touched_mapping(mb: int) -> mmap.mmap:
    """An anonymous mapping of `mb` MB with every page written: resident memory that no allocator had before."""
    mapping = mmap.mmap(-1, mb * 2**20)
    np.frombuffer(mapping, dtype=np.uint8)[:] = 1
    return mapping


def test_cpu_peak_is_nan_where_it_cannot_be_reset(monkeypatch, tmp_path):
    """No /proc/self/clear_refs (macOS, Windows): NaN ("n/a" in the app), never the lifetime maximum."""
    monkeypatch.setattr(timing, "PROC_CLEAR_REFS", tmp_path / "missing" / "clear_refs")
    timing.reset_peak_memory(torch.device("cpu"))
    assert np.isnan(peak_memory_mb(torch.device("cpu")))
