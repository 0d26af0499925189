"""The Decoder (static cache + graphed decode) against transformers: greedy tokens, EOS, streaming, bounded caches,
fp16 safe mode, teacher forcing, refused configs (every decode step's logits: tests/vlm/test_families.py)."""

import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.vlm.base import Generation, VisualTokens
from arr_coc.vlm.decoder import MAX_CACHES, Decoder, greedy, probability

QUESTION = "What is written on the sign?"


def image(w=448, h=336, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def view_of(vlm, w=448, h=336, seed=0):
    """A random view whose sides are whole cells of the family."""
    return image((w // vlm.cell) * vlm.cell, (h // vlm.cell) * vlm.cell, seed)


def one_view_prompt(vlm, view, question=QUESTION, answer=None):
    """[prompt + one image + question (+ answer)], as every pipeline builds it."""
    with torch.no_grad():
        return vlm.prompt(question, [vlm.encode_view(view)], answer=answer)


@pytest.mark.parametrize("min_new_tokens", [0, 12])
def test_greedy_tokens_equal_stock_generate_from_pixels(family, min_new_tokens):
    vlm = family.vlm
    view = view_of(vlm, seed=1)
    stock = vlm.generate(vlm.stock_inputs(QUESTION, view), 12, min_new_tokens=min_new_tokens).ids[0].tolist()
    ours = vlm.generate(one_view_prompt(vlm, view), 12, min_new_tokens=min_new_tokens).ids[0].tolist()
    assert ours == stock
    eos = set(vlm.eos_token_ids)
    assert not eos & set(ours[:-1])  # decoding stops at the first EOS...
    if min_new_tokens:
        assert len(ours) == 12 and not eos & set(ours)  # ...which min_new_tokens holds off
    else:
        assert len(ours) == 12 or ours[-1] in eos


def test_greedy_picks_the_first_of_equal_maxima_across_rows_and_the_ragged_last():
    """greedy reduces 128-logit rows, then the rows: on 300 logits (the last row padded) ties across rows go to the
    first, as torch.argmax; a -inf bias moves the pick on; all -inf picks 0."""
    logits, bias = torch.full((1, 300), -1.0), torch.zeros(300)
    logits[0, [7, 130, 299]] = 2.0  # in rows 0, 1 and 2 (the ragged one)
    assert greedy(logits, bias).tolist() == [[7]]
    bias[7] = float("-inf")
    assert greedy(logits, bias).tolist() == [[130]]
    bias[130] = float("-inf")
    assert greedy(logits, bias).tolist() == [[299]]
    assert greedy(torch.full((1, 300), float("-inf")), bias).tolist() == [[0]]


def test_probability_is_the_softmax_at_the_token_across_a_row_boundary():
    """130 logits: 129 zeros and log 3 at index 129 (in the second, padded row): softmax 3/132 there, 1/132 at 0."""
    logits = torch.zeros(1, 130)
    logits[0, 129] = float(np.log(3.0))
    torch.testing.assert_close(probability(logits, torch.tensor([[129]])), torch.tensor([3 / 132]))
    torch.testing.assert_close(probability(logits, torch.tensor([[0]])), torch.tensor([1 / 132]))


def test_each_token_probability_is_the_stock_softmax_of_its_step(arr_model):
    """Generation.probs (the answer's confidence reads it): the fast engine's equal stock generate()'s own
    per-step softmax at the chosen token, and greedy picks each step's most probable token."""
    vlm = arr_model.vlm
    view = view_of(vlm, seed=3)
    ours = vlm.generate(one_view_prompt(vlm, view), 8, min_new_tokens=8)
    stock = vlm.generate(vlm.stock_inputs(QUESTION, view), 8, min_new_tokens=8)
    assert ours.ids.tolist() == stock.ids.tolist() and ours.probs.shape == (8,)
    torch.testing.assert_close(ours.probs.cpu(), stock.probs.cpu(), rtol=1e-4, atol=0)
    with torch.no_grad():  # the first token's probability, from one stock forward over the prompt
        prompt = one_view_prompt(vlm, view)
        logits = vlm.model(inputs_embeds=prompt.embeds, position_ids=prompt.position_ids).logits[0, -1].float()
    torch.testing.assert_close(float(ours.probs[0]), float(logits.softmax(-1).max()), rtol=1e-4, atol=0)


def test_eos_stops_and_is_kept(arr_model):
    vlm = arr_model.vlm
    prompt = one_view_prompt(vlm, image(seed=2))
    first = int(vlm.generate(prompt, 1).ids[0, 0])
    eos = vlm.eos_token_ids
    try:
        vlm.eos_token_ids = [first]  # the first token is EOS: one token, then stop
        out = vlm.generate(prompt, 20).ids
    finally:
        vlm.eos_token_ids = eos
    assert out.tolist() == [[first]]


def test_the_engine_yields_each_token_as_it_makes_it_and_closing_it_lets_go(arr_model, monkeypatch):
    """One token per decode step, yielded before the next step runs (nanochat's Engine.generate), in the caller's
    thread; the generator's value is the Generation of exactly those tokens; closed early, it frees the engine."""
    vlm = arr_model.vlm
    steps = []
    step = vlm.decoder._decode_step
    monkeypatch.setattr(vlm.decoder, "_decode_step", lambda cap: steps.append(cap) or step(cap))
    tokens, seen = vlm.generate_tokens(one_view_prompt(vlm, image()), 8, min_new_tokens=8), []
    while True:
        try:
            seen.append(next(tokens))
        except StopIteration as end:
            out = end.value
            break
        assert len(steps) == len(seen) - 1  # the prefill made the first token; each later one took one step
    assert seen == out.ids[0].tolist() and len(seen) == 8 and len(out.probs) == 8
    tokens = vlm.generate_tokens(one_view_prompt(vlm, image()), 8, min_new_tokens=8)
    next(tokens)
    assert vlm.decoder.lock.locked()  # held between two tokens...
    tokens.close()
    assert not vlm.decoder.lock.locked() and len(vlm.generate(one_view_prompt(vlm, image()), 2).ids[0]) >= 1


def test_stream_yields_the_answer_as_it_grows(arr_model, monkeypatch):
    """Generation scripted to a known sentence: model.stream yields it word by word, then the finished Answer."""
    vlm = arr_model.vlm
    words = vlm.tokenizer("The sign says stop here now", add_special_tokens=False)["input_ids"]

    def scripted(inputs, max_new_tokens, min_new_tokens=None, prune=None, keep=False, watch=None):  # generate_tokens'
        yield from words
        return Generation(torch.tensor([words]))

    monkeypatch.setattr(vlm, "generate_tokens", scripted)
    chunks = list(arr_model.stream(image(), QUESTION, "arr", max_new_tokens=len(words)))
    answer, texts = chunks[-1], chunks[:-1]
    assert answer.text == "The sign says stop here now" and answer.new_tokens == len(words)
    assert texts[-1] == answer.text and len(set(texts)) >= 4  # several growing texts, not one at the end
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # the text only grows


def test_back_to_back_requests_of_different_lengths(arr_model):
    """The cache is reused across prompts of different lengths: each answer equals a fresh stock generate."""
    vlm = arr_model.vlm
    for w, question in [(448, "Why?"), (900, QUESTION + " Answer in detail, please, with every word."), (448, "Why?")]:
        view = view_of(vlm, w, 448)
        ours = vlm.generate(one_view_prompt(vlm, view, question), 6, min_new_tokens=6)
        stock = vlm.generate(vlm.stock_inputs(question, view), 6, min_new_tokens=6)
        assert ours.ids.tolist() == stock.ids.tolist()


def test_the_caches_are_bounded_least_recently_used_first(arr_model):
    """Requests needing 3 cache sizes keep at most MAX_CACHES of them, dropping the oldest; answers stay right."""
    vlm = arr_model.vlm
    decoder = vlm.decoder
    prompt = one_view_prompt(vlm, image(seed=6))
    first = vlm.generate(prompt, 4, min_new_tokens=4).ids
    sizes = []
    with torch.no_grad():
        for new_tokens in (4, 1500, 2500, 1500, 4):  # room for caches of 1024, 2048, 3072, 2048, 1024 slots
            decoder.start(prompt.embeds, prompt.position_ids, new_tokens)  # what generate() prefills first
            sizes.append(list(decoder.states))
    assert MAX_CACHES == 2 and all(len(s) <= MAX_CACHES for s in sizes)
    assert sizes[2] == [2048, 3072] and sizes[3] == [3072, 2048] and sizes[4] == [2048, 1024]  # LRU order
    assert vlm.generate(prompt, 4, min_new_tokens=4).ids.tolist() == first.tolist()


def test_fp16_overflow_is_redone_in_safe_mode_on_this_device():
    from conftest import overflowing_fp16_model

    model = overflowing_fp16_model("cuda" if torch.cuda.is_available() else "cpu")
    vlm = model.vlm
    prompt = vlm.prompt(QUESTION, [])
    with torch.no_grad():  # the stock forward overflows: its logits are not finite
        assert not torch.isfinite(vlm.model(inputs_embeds=prompt.embeds, position_ids=prompt.position_ids).logits).all()
    generation = vlm.generate(prompt, 4)
    assert generation.safe_mode and not hasattr(vlm, "safe_mode")  # returned, not left on the shared adapter
    answer = model.answer(image(), QUESTION, "gestalt", max_new_tokens=6)
    assert answer.safe_mode and answer.new_tokens >= 1 and answer.to_json()["safe_mode"] is True
    plain = model.answer(image(), QUESTION, "gestalt", max_new_tokens=6)
    assert plain.text == answer.text  # the redo is deterministic
    assert all(torch.isfinite(t).all() for s in vlm.decoder.states.values() for t in s.keys + s.values)


def test_teacher_forcing_is_differentiable_to_the_image_tokens(arr_model):
    vlm = arr_model.vlm
    with torch.no_grad():
        tokens = vlm.encode_view(image(seed=4))
    features = tokens.features.clone().requires_grad_(True)
    with torch.enable_grad():
        prompt = vlm.prompt(QUESTION, [VisualTokens(features, tokens.grid, tokens.positions)], answer="a red sign")
        score = vlm.answer_logprobs([prompt])[0]
        score.backward()
    assert features.grad is not None and features.grad.abs().sum() > 0
    with torch.no_grad():  # the mean log-probability of the answer's tokens, read off every position's logits
        logp = vlm.decoder.forward(prompt.embeds, prompt.position_ids)[0].log_softmax(-1)  # [L, V]
        answer = prompt.ids[0, prompt.answer_start:]
        expected = logp[prompt.answer_start - 1:-1].gather(-1, answer[:, None]).mean()
    assert len(answer) >= 4 and float(score.detach()) == pytest.approx(float(expected), abs=1e-5)


@pytest.mark.parametrize("setting", ["use_sliding_window", "layer_types"])
def test_configs_the_decoder_does_not_implement_are_refused_by_name(arr_model, setting):
    config = arr_model.vlm.language_model.config
    saved = config.use_sliding_window, config.layer_types
    try:
        if setting == "use_sliding_window":
            config.use_sliding_window = True
        else:
            config.layer_types = ["full_attention", "sliding_attention"] * (config.num_hidden_layers // 2)
        with pytest.raises(ValueError, match=setting):
            Decoder(arr_model.vlm.model)
    finally:
        config.use_sliding_window, config.layer_types = saved
    Decoder(arr_model.vlm.model)  # the stock tiny config: every layer full attention


def test_a_step_inductor_cannot_compile_is_captured_uncompiled_with_a_warning(arr_model, monkeypatch):
    """The capture path (CUDA only) on the CPU: capture() stood in by one call of the step. A compile that fails
    leaves a warning, the uncompiled step, compile_step off and the decode state where it was."""
    import arr_coc.vlm.decoder as decoder_module

    decoder = Decoder(arr_model.vlm.model)
    prompt = one_view_prompt(arr_model.vlm, view_of(arr_model.vlm))
    with torch.no_grad():
        cap, _ = decoder.start(prompt.embeds, prompt.position_ids, 8)
        state = decoder.states[cap]
        before = [t.clone() for t in (state.token, state.slot, state.rope, state.mask)]
        expected = decoder._step(state)[1].clone()  # the uncompiled step's logits from this state
        for t, b in zip((state.token, state.slot, state.rope, state.mask), before):
            t.copy_(b)

        def failing(*args, **kwargs):
            raise RuntimeError("InductorError: no working C++ compiler\nsecond line")

        monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: failing)
        monkeypatch.setattr(decoder_module, "capture", lambda fn, args, pool: (None, args, fn(*args)))
        with pytest.warns(UserWarning, match=r"^decode step not compiled \(RuntimeError: InductorError: no working "
                                             r"C\+\+ compiler\); capturing it as it is$"):
            _, _, (token, logits, _) = decoder._capture_step(state)
    assert decoder.compile_step is False
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    for t, b in zip((state.token, state.slot, state.rope, state.mask), before):  # the warm-up step was undone
        assert torch.equal(t, b)
