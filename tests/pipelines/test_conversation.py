"""
Conversations through the pipelines (arr_coc.pipelines.conversation, ARRCOCQwen.answer(conversation=...)): what
each turn reads and counts, what is computed once, the refusals, and (on the pocket model) that a follow-up's
saccades go where its own question points.
"""

import itertools

import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.errors import InputError
from arr_coc.eval.metrics import box_recall_precision
from arr_coc.pipelines import steps as answer_module
from arr_coc.pipelines.conversation import Conversation
from arr_coc.synth.fineprint import make_page

QUESTIONS = ("What is written on the sign?", "And what colour is it?", "Where is it?")


def photo(w=1000, h=700, seed=0):
    """Noise of 25x36 = 900 native cells, more than ARR reads (13x19 gestalt + 273): ARR chooses its saccades."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def test_the_gestalt_is_encoded_once_and_each_turn_reads_its_own_question(arr_model, monkeypatch):
    vlm = arr_model.vlm
    calls = {"encode_view": 0, "prior_pass": []}
    encode_view, prior_pass = vlm.encode_view, vlm.prior_pass

    def count_encode(view):
        calls["encode_view"] += 1
        return encode_view(view)

    def count_prior(question, *args, **kwargs):
        calls["prior_pass"].append(question)
        return prior_pass(question, *args, **kwargs)

    monkeypatch.setattr(vlm, "encode_view", count_encode)
    monkeypatch.setattr(vlm, "prior_pass", count_prior)
    chat = Conversation("arr", photo())
    answers = [arr_model.answer(None, q, conversation=chat, max_new_tokens=3) for q in QUESTIONS]
    assert calls["encode_view"] == 1 and calls["prior_pass"] == list(QUESTIONS)
    assert [a.turn for a in answers] == [1, 2, 3] and chat.answers == answers
    assert [a.tokens.gestalt for a in answers] == [answers[0].tokens.gestalt, 0, 0]  # the gestalt block once
    assert answers[0].tokens.gestalt > 0 and all(a.tokens.saccade == 273 for a in answers)


def test_each_turn_prefills_only_itself_and_the_context_adds_up(arr_model):
    """Turn k's context = turn k-1's, less the answer token it had not read, plus what turn k prefilled (that
    token, the new block and the question) and generated."""
    for pipeline in ("arr", "full"):
        chat = Conversation(pipeline, photo(seed=1))
        first, second, third = (arr_model.answer(None, q, conversation=chat, max_new_tokens=4) for q in QUESTIONS)
        assert first.context == first.prefilled + first.new_tokens
        for before, after in ((first, second), (second, third)):
            assert after.context == before.context - 1 + after.prefilled + after.new_tokens
        if pipeline == "full":  # the image once: later turns are their text alone
            assert second.tokens.total_visual == 0 and second.prefilled < 40 < first.prefilled
        assert second.to_json()["conversation"] == dict(turn=2, prefilled=second.prefilled, context=second.context)


def test_fresh_cells_read_only_cells_no_earlier_turn_read(arr_model):
    chat = Conversation("arr", photo(seed=2))
    answers = [arr_model.answer(None, q, conversation=chat, max_new_tokens=2, budget=40, fresh_cells=True)
               for q in QUESTIONS]
    cells = [{(s.row, s.col) for s in a.saccades} for a in answers]
    assert [len(c) for c in cells] == [40, 40, 40]
    assert not cells[0] & cells[1] and not (cells[0] | cells[1]) & cells[2]
    moves = chat.moves()
    assert set(moves[0].new) == cells[1] and not moves[0].kept and set(moves[0].dropped) == cells[0]
    again = Conversation("arr", photo(seed=2))  # without fresh cells the same question reads the same cells
    a, b = (arr_model.answer(None, QUESTIONS[0], conversation=again, max_new_tokens=2, budget=40) for _ in range(2))
    assert [(s.row, s.col) for s in a.saccades] == [(s.row, s.col) for s in b.saccades]
    assert set(again.moves()[0].kept) == {(s.row, s.col) for s in a.saccades}


def test_what_cannot_hold_a_conversation_is_refused_in_one_line(arr_model, monkeypatch):
    with pytest.raises(InputError, match="fastv cannot hold a conversation"):
        Conversation("fastv", photo())
    chat = Conversation("arr", photo())
    arr_model.answer(None, QUESTIONS[0], conversation=chat, max_new_tokens=2)
    with pytest.raises(InputError, match="first turn only"):
        arr_model.answer(None, QUESTIONS[1], conversation=chat, max_new_tokens=2, refixate=0.5)
    monkeypatch.setattr(answer_module, "MAX_CONVERSATION_TOKENS", chat.answers[-1].context + 100)
    with pytest.raises(InputError, match="start a new one"):
        arr_model.answer(None, QUESTIONS[1], conversation=chat, max_new_tokens=2)
    assert len(chat.answers) == 1  # a refused turn leaves the conversation as it was
    arr_model.vlm.engine = "hf"
    try:
        with pytest.raises(InputError, match="fast engine"):
            arr_model.answer(None, QUESTIONS[0], conversation=Conversation("full", photo()), max_new_tokens=2)
    finally:
        arr_model.vlm.engine = "fast"


def test_a_conversation_kept_off_the_device_between_turns_goes_on_as_one_that_stayed(arr_model):
    """The app keeps a conversation on the CPU between requests (Conversation.to): the earlier turns' maps are
    dropped, and the next turns are the same as a conversation that never moved."""
    stayed, moved = Conversation("arr", photo(seed=4)), Conversation("arr", photo(seed=4))
    for question in QUESTIONS:
        a = arr_model.answer(None, question, conversation=stayed, max_new_tokens=3, budget=30, fresh_cells=True)
        b = arr_model.answer(None, question, conversation=moved.to(arr_model.vlm.device), max_new_tokens=3, budget=30,
                             fresh_cells=True)
        moved.to("cpu")
        assert (a.text, a.context, [(s.row, s.col) for s in a.saccades]) == \
               (b.text, b.context, [(s.row, s.col) for s in b.saccades])
    assert all(answer.arr is None for answer in moved.answers)
    assert [answer.observation is None for answer in moved.answers] == [True, True, False]
    assert moved.answers[-1].history.cache.keys[0].device.type == "cpu" and moved.answers[0].history is None


@pytest.fixture(scope="module")
def pocket():
    from arr_coc.model import ARRCOCQwen

    return ARRCOCQwen.from_pretrained("pocket", dtype=torch.float32)


def test_a_follow_ups_saccades_go_where_its_own_question_points(pocket):
    """
    Pocket model, box_word pages at 896 px, 32 saccades a turn: turn 1 asks about one box, turn 2 about the box
    farthest from it. Turn 2's saccades cover turn 2's box better than turn 1's did (box recall, the mean over 6
    pages; measured 0.58 against 0.28): a follow-up that re-used turn 1's question would tie.
    """
    def centre(box):
        return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2

    def far_apart(pair):
        (x0, y0), (x1, y1) = centre(pair[0].box), centre(pair[1].box)
        return (x0 - x1) ** 2 + (y0 - y1) ** 2

    before, after = [], []
    for seed in range(6):
        page = make_page("box_word", seed, 896)
        q1, q2 = max(itertools.combinations(page.questions, 2), key=far_apart)
        chat = Conversation("arr", page.image)
        first, second = (pocket.answer(None, q.question, conversation=chat, budget=32, max_new_tokens=1)
                         for q in (q1, q2))
        coverage = first.views.box_coverage(q2.box)
        before.append(box_recall_precision(coverage, first.arr.indices[0])[0])
        after.append(box_recall_precision(coverage, second.arr.indices[0])[0])
    assert np.mean(after) >= np.mean(before) + 0.15, (before, after)


@pytest.mark.parametrize("pipeline, total", [("arr", 552), ("full", 930)])  # prompt + 2 new tokens: arr's 247
# gestalt + 273 saccades + 30 others, full's 25x36 = 900 native cells + 28 others
def test_a_first_turn_past_the_conversation_cap_is_refused(arr_model, monkeypatch, pipeline, total):
    """Issue 54 item 3: the cap holds for turn 1 too (a first turn of 17,045 tokens was accepted past 16,384, and
    every later turn then refused). One token past it: refused in one line, the conversation still empty; at it:
    accepted."""
    monkeypatch.setattr(answer_module, "MAX_CONVERSATION_TOKENS", total - 1)
    chat = Conversation(pipeline, photo())
    with pytest.raises(InputError, match=f"this first turn would start the conversation at {total} tokens, past the "
                                         f"{total - 1} a conversation keeps"):
        arr_model.answer(None, QUESTIONS[0], conversation=chat, max_new_tokens=2)
    assert chat.answers == []
    monkeypatch.setattr(answer_module, "MAX_CONVERSATION_TOKENS", total)
    assert arr_model.answer(None, QUESTIONS[0], conversation=chat, max_new_tokens=2).turn == 1
