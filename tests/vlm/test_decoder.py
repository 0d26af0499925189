"""The Decoder (static cache + graphed decode) against transformers: prefill logits, greedy tokens, EOS, streaming."""

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import answers_by_engine

from arr_coc.model import PIPELINES
from arr_coc.vlm.positions import raster_block

QUESTION = "What is written on the sign?"


def image(w=448, h=336, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2.5-vl"])
def family_model(request, arr_model):
    """The families whose LLM the Decoder runs as it is (Qwen3-VL's DeepStack: tests/vlm/test_qwen3_vl.py)."""
    from arr_coc.model import ARRCOCQwen

    return arr_model if request.param == "tiny" else ARRCOCQwen.from_pretrained(request.param)


def stock_prompt(vlm, view, question=QUESTION):
    """Ids, embeddings and positions of [prompt + one image + question], as every pipeline builds them."""
    grid = (view.height // vlm.cell, view.width // vlm.cell)
    prompt = vlm.prompt(question, [(vlm.encode_view(view), raster_block(grid))])
    return prompt.ids, prompt.embeds, prompt.position_ids


def test_prefill_logits_equal_the_stock_forward(family_model):
    vlm = family_model.vlm
    ids, embeds, positions = stock_prompt(vlm, image())
    decoder = vlm.decoder
    with torch.no_grad():
        stock = vlm.model(inputs_embeds=embeds, position_ids=positions).logits[:, -1].float()  # [1, V]
        cap = 1024
        decoder._state(cap, embeds.dtype)
        ours = decoder._prefill(embeds, positions, torch.tensor([ids.shape[1] - 1]), cap)
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("min_new_tokens", [0, 12])
def test_greedy_tokens_equal_generate(family_model, min_new_tokens):
    vlm = family_model.vlm
    ids, embeds, positions = stock_prompt(vlm, image(seed=1))
    config = vlm.model.generation_config
    try:
        config.min_new_tokens = min_new_tokens
        vlm.engine = "hf"
        stock = vlm.generate(12, inputs_embeds=embeds, position_ids=positions)
        vlm.engine = "fast"
        ours = vlm.generate(12, inputs_embeds=embeds, position_ids=positions)
    finally:
        config.min_new_tokens, vlm.engine = None, "fast"
    assert ours.tolist() == stock.tolist() and ours.shape[1] == (12 if min_new_tokens else ours.shape[1])


def test_eos_stops_and_is_kept(arr_model):
    vlm = arr_model.vlm
    ids, embeds, positions = stock_prompt(vlm, image(seed=2))
    first = int(vlm.generate(1, inputs_embeds=embeds, position_ids=positions)[0, 0])
    eos = vlm.eos_token_ids
    try:
        vlm.eos_token_ids = [first]  # the first token is EOS: one token, then stop
        out = vlm.generate(20, inputs_embeds=embeds, position_ids=positions)
    finally:
        vlm.eos_token_ids = eos
    assert out.tolist() == [[first]]


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_pipeline_answers_the_same_with_both_engines(family_model, pipeline):
    answers = answers_by_engine(family_model, image(700, 500), QUESTION, pipeline)
    assert answers["fast"].text == answers["hf"].text
    assert answers["fast"].new_tokens == answers["hf"].new_tokens
    assert answers["fast"].tokens == answers["hf"].tokens


def test_streaming_yields_the_answer_token_by_token(arr_model):
    chunks = list(arr_model.stream(image(), QUESTION, "arr", max_new_tokens=6))
    answer = chunks[-1]
    texts = chunks[:-1]
    assert texts and texts[-1].strip() == answer.text
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # the text only grows
    assert answer.timings_ms["prefill"] > 0 and answer.timings_ms["decode"] >= 0


def test_back_to_back_requests_of_different_lengths(arr_model):
    """The cache is reused across prompts of different lengths: each answer equals a fresh stock generate."""
    vlm = arr_model.vlm
    for w, question in [(448, "Why?"), (900, QUESTION + " Answer in detail, please, with every word."), (448, "Why?")]:
        ids, embeds, positions = stock_prompt(vlm, image(w, 448).resize(((w // 28) * 28, 448)), question)
        ours = vlm.generate(6, inputs_embeds=embeds, position_ids=positions)
        vlm.engine = "hf"
        stock = vlm.generate(6, inputs_embeds=embeds, position_ids=positions)
        vlm.engine = "fast"
        assert ours.tolist() == stock.tolist()


def test_fp16_overflow_is_redone_in_safe_mode_on_this_device():
    from conftest import overflowing_fp16_model

    model = overflowing_fp16_model("cuda" if torch.cuda.is_available() else "cpu")
    vlm = model.vlm
    prompt = vlm.prompt(QUESTION, [])
    with torch.no_grad():  # the stock forward overflows: its logits are not finite
        assert not torch.isfinite(vlm.model(inputs_embeds=prompt.embeds, position_ids=prompt.position_ids).logits).all()
    answer = model.answer(image(), QUESTION, "gestalt", max_new_tokens=6)
    assert answer.safe_mode and answer.new_tokens >= 1 and answer.to_json()["safe_mode"] is True
    plain = model.answer(image(), QUESTION, "gestalt", max_new_tokens=6)
    assert plain.text == answer.text  # the redo is deterministic
    assert all(torch.isfinite(t).all() for s in vlm.decoder.states.values() for t in s.keys + s.values)


def test_the_training_forward_equals_the_stock_logits_and_passes_gradients(arr_model):
    vlm = arr_model.vlm
    ids, embeds, positions = stock_prompt(vlm, image(seed=4))
    with torch.no_grad():
        stock = vlm.model(inputs_embeds=embeds, position_ids=positions).logits.float()  # [1, L, V]
    embeds = embeds.detach().requires_grad_(True)
    with torch.enable_grad():
        ours = vlm.decoder.forward(embeds, positions)
        ours[0, -1].max().backward()
    torch.testing.assert_close(ours.detach(), stock, atol=1e-5, rtol=1e-5)
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0
