"""The stopwatch, the prefill/decode split of a streamed generation, and the memory probe."""

import time

import torch

from arr_coc.timing import Stopwatch, TimingStreamer, peak_memory_mb, timed_module


def test_sections_of_one_name_add_up():
    watch = Stopwatch(torch.device("cpu"))
    for _ in range(2):
        with watch.section("vision"):
            time.sleep(0.02)
    with watch.section("selection"):
        pass
    assert 40 <= watch.ms["vision"] < 200 and watch.ms["selection"] < 20


def test_streamer_splits_prefill_from_decode_and_counts_tokens():
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
    time.sleep(0.05)  # "prefill"
    timer.put(torch.tensor([7]))
    for _ in range(3):
        time.sleep(0.01)  # "decode"
        timer.put(torch.tensor([8]))
    timer.end()
    assert timer.new_tokens == 4 and inner.ended and len(inner.seen) == 5
    assert 45 <= watch.ms["prefill"] < 150 and 25 <= watch.ms["decode"] < 150


def test_timed_module_times_every_forward():
    watch = Stopwatch(torch.device("cpu"))
    layer = torch.nn.Linear(4, 4)
    layer.register_forward_hook(lambda *_: time.sleep(0.01))
    with timed_module(layer, watch, "vision"):
        layer(torch.ones(1, 4))
        layer(torch.ones(1, 4))
    layer(torch.ones(1, 4))  # outside the block: not timed
    assert 20 <= watch.ms["vision"] < 100 and not layer._forward_pre_hooks


def test_peak_memory_is_the_process_peak_on_cpu():
    before = peak_memory_mb(torch.device("cpu"))
    big = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB, touched
    assert peak_memory_mb(torch.device("cpu")) >= before and big.sum() > 0 and before > 10
