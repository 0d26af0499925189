"""
Long questions (issue 54 item 2): a question is limited by its tokens, not only its characters (4000 four-byte
characters can be 16,000 tokens), and the prior pass's memory grows linearly in the prompt's length: it never holds
a tokens x tokens attention.

    .venv/bin/python -m pytest tests/vlm/test_long_questions.py -q
"""

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode

from arr_coc.errors import InputError
from arr_coc.vlm.decoder import _weighted_attention
from arr_coc.vlm.views import make_views

LONG = "\U0010FFFD" * 4000  # within the 4000-character limit, and 16,000 tokens: each is 4 byte tokens in Qwen's BPE
MIB = 2 ** 20


class LargestTensor(TorchDispatchMode):
    """The largest tensor any op makes while active (bytes); one past `limit` fails at once, before the next op
    piles more on (the old prior made three 4 GiB tensors in a row)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.largest = limit, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
                assert self.largest <= self.limit, f"{func} made a {self.largest / MIB:.0f} MiB tensor {tuple(t.shape)}"
        return out


def photo(w=400, h=300, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def test_a_16k_token_prompt_s_prior_pass_holds_no_tokens_by_tokens_attention(arr_model):
    """The prior pass over a 16,000-token question on the tiny model (4 heads): its largest tensor is under 96 MiB
    (a chunk of 256 query rows: 4 x 256 x ~16,300 fp32 is 63 MiB), where the whole [4, L, L] fp32 attention was
    4 GiB, made three times over (scores, masked, softmax): the app's 12 GB peak."""
    vlm = arr_model.vlm
    assert len(vlm.question_ids(LONG)) == 16000
    with torch.no_grad():
        gestalt = vlm.encode_view(make_views(photo()).gestalt)
        with LargestTensor(limit=96 * MIB) as probe:
            prior = vlm.prior_attention(LONG, gestalt, 0.5)
    assert prior.shape == (len(gestalt),) and torch.isfinite(prior).all() and 0 < float(prior.sum()) <= 1
    assert 32 * MIB < probe.largest <= 96 * MIB  # the chunks themselves, and nothing larger


def test_the_chunked_attention_equals_the_whole_one():
    """Chunks of 3 rows over 10 tokens (a partial last chunk) give what one [H, L, L] softmax gives."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4)
    weights = torch.zeros(10)
    weights[6:] = 0.25  # the last four rows: the question's
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    whole = weights @ ((q @ k.transpose(-1, -2)) * 0.5).masked_fill(~causal, float("-inf")).softmax(-1).mean((0, 1))
    torch.testing.assert_close(_weighted_attention(q, k, 0.5, weights, chunk=3), whole, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(_weighted_attention(q, k, 0.5, weights, chunk=3).sum(), torch.tensor(1.0))


@pytest.mark.parametrize("ask", ["answer", "stream"])  # the facade's two ways in (the Microscope checks as answer)
def test_a_question_over_the_token_limit_is_refused_before_any_vlm_work(arr_model, monkeypatch, ask):
    """4000 characters (the character limit) that are 16,000 tokens: refused in one line naming both counts, before
    the VLM encodes anything."""
    monkeypatch.setattr(arr_model.vlm, "encode_view", lambda *a, **k: pytest.fail("the VLM ran"))
    with pytest.raises(InputError, match="the question is 16000 tokens long; the limit is 2048 tokens"):
        next(iter(getattr(arr_model, ask)(photo(), LONG)))  # a stream does its work as it is iterated
    assert arr_model.check_question("x" * 100) == "x" * 100
