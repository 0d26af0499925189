"""
Faithfulness curves: their length and bounds, the removal orders, and the log-likelihood they record pinned
to transformers' own forward (the gestalt-only point is a stock prompt) for Qwen2-VL and Qwen3-VL.
"""

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import stock_inputs, tiny_arr_model

from arr_coc.errors import InputError
from arr_coc.eval.faithfulness import MAX_ANSWER_CHARS, check_answer, faithfulness_curves, removal_counts
from arr_coc.pipelines.arr_layout import arr_prompt, encode_saccades

QUESTION = "What does the sign say?"
ANSWER = "It says stop."


def photo(seed=0, size=(1000, 700)):  # more native cells than ARR reads: it chooses saccades, whose removal is measured
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def qwen3():
    return tiny_arr_model("tiny-qwen3-vl")


def stock_answer_logprob(vlm, view, question: str, answer: str) -> float:
    """Transformers' own forward over the stock prompt of one view with the answer appended: its mean log-prob."""
    prompt, pixels, grid, _ = stock_inputs(vlm, view, question)
    target = vlm.tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
    ids = torch.cat([prompt, torch.tensor([target], device=prompt.device)], dim=1)
    with torch.no_grad():
        logits = vlm.model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid,
                           mm_token_type_ids=(ids == vlm.image_token_id).int()).logits[0].float()
    logp = logits[prompt.shape[1] - 1:-1].log_softmax(-1)  # the positions that predict the answer's tokens
    return float(logp.gather(-1, torch.tensor(target, device=logp.device)[:, None]).mean())


def arr_curves(model, image, budget: int, **kwargs):
    """An ARR answer to QUESTION with `budget` saccades, and the curves of ANSWER over its selection."""
    arr = model.answer(image, QUESTION, "arr", max_new_tokens=1, budget=budget)
    return arr, faithfulness_curves(model.parts, arr.observation, arr.arr, ANSWER, **kwargs)


def test_removal_counts_run_from_none_to_all():
    assert removal_counts(273, 10) == [0, 27, 55, 82, 109, 136, 164, 191, 218, 246, 273]
    assert removal_counts(3, 4) == [0, 1, 2, 2, 3]


@pytest.mark.parametrize("family", ["tiny", "tiny-qwen3-vl"])
def test_curves_have_the_right_length_bounds_and_shared_ends(family, arr_model, qwen3):
    model = arr_model if family == "tiny" else qwen3
    _, curves = arr_curves(model, photo(), 40, steps=4)
    assert curves.counts == [0, 10, 20, 30, 40] and curves.fractions == [0, 0.25, 0.5, 0.75, 1]
    for name in ("deletion", "random", "insertion"):
        values = getattr(curves, name)
        assert len(values) == 5 and all(np.isfinite(values)) and max(values) <= 0
    full, gestalt = curves.deletion[0], curves.deletion[-1]  # all saccades / none
    assert curves.random[0] == curves.insertion[-1] == full and curves.random[-1] == curves.insertion[0] == gestalt
    assert full != gestalt  # the saccades change the likelihood
    # the gestalt-only point is a stock prompt: transformers' forward gives the same log-likelihood
    views = model.views(photo())
    assert gestalt == pytest.approx(stock_answer_logprob(model.vlm, views.tensor("gestalt"), QUESTION, ANSWER), abs=1e-4)
    areas = curves.areas
    assert areas["deletion"] == pytest.approx(np.trapezoid(curves.deletion, curves.fractions))
    assert set(curves.to_json()) >= {"deletion", "random", "insertion", "areas", "ranks", "answer"}


def test_deletion_removes_the_saccades_in_rank_order(arr_model):
    answer, curves = arr_curves(arr_model, photo(1), 30, steps=3, seed=7)
    scores = answer.arr.scores[0]
    assert curves.ranks == torch.sort(scores, descending=True, stable=True).indices.tolist()  # most relevant first
    assert sorted(curves.random_order) == list(range(30)) and curves.random_order != curves.ranks

    # the deletion point after 10 removals is the answer with the tokens of exactly the 20 lowest-ranked saccades
    # left (as all 30 encoded them: removal changes the LLM's input, not the others' encodings)
    vlm, positions, observation = arr_model.vlm, answer.arr.positions[0], answer.observation
    kept = torch.tensor(sorted(curves.ranks[10:]))
    saccades = encode_saccades(vlm, observation, positions).take(kept)
    assert torch.equal(saccades.positions, positions[kept].cpu())
    prompt = arr_prompt(vlm, observation, saccades, ANSWER)
    assert curves.deletion[1] == pytest.approx(float(vlm.answer_logprobs([prompt])[0]), abs=1e-4)


def test_batched_scoring_equals_one_prompt_at_a_time(arr_model):
    """Right-padded batches of prompts of different lengths score each prompt as it scores alone."""
    vlm = arr_model.vlm
    gestalt = vlm.encode_view(arr_model.views(photo(2)).tensor("gestalt"))
    prompts = [vlm.prompt(q, [gestalt], answer=a)
               for q, a in ((QUESTION, ANSWER), ("Colour?", "Red, mostly, with a long tail of words"), ("Why?", "no"))]
    batched = vlm.answer_logprobs(prompts, batch_size=3)
    alone = torch.cat([vlm.answer_logprobs([p]) for p in prompts])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)



def test_an_answer_is_plain_text_and_capped(arr_model):
    """An answer is user text: `<|image_pad|>` typed in it is characters, not an image slot (it used to crash)."""
    vlm = arr_model.vlm
    gestalt = vlm.encode_view(arr_model.views(photo(3)).tensor("gestalt"))  # VisualTokens
    prompt = vlm.prompt(QUESTION, [gestalt], answer="<|image_pad|><|im_start|>")
    answer_ids = prompt.ids[0, prompt.answer_start:].tolist()
    assert vlm.image_token_id not in answer_ids and len(answer_ids) > 3  # the characters, then <|im_end|>
    assert answer_ids[:-1] == vlm.question_ids("<|image_pad|><|im_start|>")
    assert np.isfinite(float(vlm.answer_logprobs([prompt])[0]))
    assert check_answer("  green  ") == "green"
    with pytest.raises(InputError, match=f"is {MAX_ANSWER_CHARS + 1} characters long; the limit is {MAX_ANSWER_CHARS}"):
        check_answer("x" * (MAX_ANSWER_CHARS + 1))
