"""
ARR's second fixation (arr_coc/pipelines/arr.py, ARR's Options.refixate): it fires only below tau, never revisits a
cell, adds exactly K2 saccades read with the first round's at their true M-RoPE places, re-runs the prior pass
with the first round's saccades in its context (or, guided by attention, reads where the first answer looked), and
with tau off leaves the answer and visual tokens as they were.

    python -m pytest -x -q tests/pipelines/test_refixation.py
"""

import math
from types import SimpleNamespace

import pytest
import torch

from arr_coc.errors import InputError
from arr_coc.synth.fineprint import make_page
from arr_coc.pipelines import arr_layout, arr_scene, refixation
from arr_coc.pipelines.answer import answer_confidence
from arr_coc.pipelines.refixation import REFIXATE_SHARE
from arr_coc.relevance.config import TensionSettings
from arr_coc.relevance.tensions import COVERAGE
from arr_coc.vlm.base import AnswerAttention
from conftest import QUESTION, scene_image


@pytest.fixture(scope="module")
def pocket():
    from arr_coc.model import ARRCOCQwen

    return ARRCOCQwen.from_pretrained("pocket", device="cpu", dtype=torch.float32)


def cells(saccades) -> set[tuple[int, int]]:
    return {(s.row, s.col) for s in saccades}


@pytest.mark.parametrize("strategy, k2", [("topk", 50), ("grid", None), ("random", 7)])
def test_refixation_never_revisits_a_cell_and_adds_exactly_k2(arr_model, strategy, k2):
    a = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=2, strategy=strategy, refixate=1.0,
                         refixate_budget=k2)
    K2 = k2 or round(REFIXATE_SHARE * 273)
    first = [s for s in a.saccades if s.round == 1]
    second = [s for s in a.saccades if s.round == 2]
    assert a.refixated and len(first) == 273 and len(second) == K2
    assert not cells(first) & cells(second) and len(cells(second)) == K2
    assert a.tokens.saccade == 273 + K2 and a.tokens.total_visual == 256 + 273 + K2
    assert [f.saccades for f in a.fixations] == [273, K2]
    assert a.fixations[1].arr.positions.shape == (1, K2, 2)


def test_it_fires_below_tau_and_not_at_or_above(arr_model):
    first = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=3, refixate=0.0)
    c = first.fixations[0].confidence
    assert not first.refixated and len(first.fixations) == 1 and first.tokens.saccade == 273
    at = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=3, refixate=c)  # not below: no second look
    above = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=3, refixate=math.nextafter(c, 1.0))
    assert not at.refixated and above.refixated
    assert above.fixations[0].confidence == c and above.tokens.saccade == 273 + round(REFIXATE_SHARE * 273)
    j = above.to_json()["refixation"]
    assert j["fired"] is True and j["confidences"][0] == round(c, 6) and len(j["answers"]) == 2
    assert j["saccades"] == [273, 136] and all(t["total"] > 0 for t in j["timings_ms"])
    looks = above.fixations  # the request's split is the sum of the two looks'; its TTFT waits for the first answer
    assert all(getattr(above.timings, k) == pytest.approx(sum(getattr(f.timings, k) for f in looks), rel=1e-6)
               for k in ("vision", "selection", "prefill", "decode"))
    before_first_token = sum(getattr(above.timings, k) for k in ("vision", "selection", "prefill"))
    assert before_first_token + looks[0].timings.decode <= above.ttft_ms + 1e-6 < above.timings.total
    assert above.decode_ms_per_token == looks[1].timings.decode / max(above.new_tokens - 1, 1)


def test_with_tau_off_the_answer_and_visual_tokens_are_the_single_walks(pocket):
    """refixate None: the pipeline is the documented single walk, step by step (non-trivial pocket answers)."""
    page = make_page("fine_print", 10**9 + 11, 896)
    question = page.questions[0].question
    a = pocket.answer(page.image, question, "arr", max_new_tokens=8)
    with torch.no_grad():
        observation = arr_scene.observe(pocket.parts, pocket.views(page.image), question)
        out = arr_scene.select(pocket.layer, arr_scene.score(observation, pocket.layer.graphed_score),
                               observation.views.candidate_grid, len(observation.gestalt))
        saccades = arr_layout.encode_saccades(pocket.vlm, observation, out.positions[0])
        generation = pocket.vlm.generate(arr_layout.arr_prompt(pocket.vlm, observation, saccades), 8)
    assert a.text == pocket.vlm.decode(generation.ids) and a.text.strip()
    assert torch.equal(a.arr.positions, out.positions) and a.tokens.saccade == 273
    assert a.confidence == answer_confidence(pocket.vlm, generation)
    assert a.fixations == [] and "refixation" not in a.to_json() and {s.round for s in a.saccades} == {1}
    never = pocket.answer(page.image, question, "arr", max_new_tokens=8, refixate=0.0)  # on, but it cannot fire
    assert (never.text, never.tokens) == (a.text, a.tokens) and torch.equal(never.arr.positions, a.arr.positions)


def test_the_final_answer_reads_both_rounds_at_their_true_places(family, monkeypatch):
    """The last prompt: the gestalt block, then one saccade block (round 1's cells, then round 2's), each token at
    its cell's M-RoPE place and with the features (and Qwen3-VL's DeepStack features) encode_cells gives its
    round; on every family."""
    arr_model = family
    vlm, prompts, priors = arr_model.vlm, [], []
    generate, prior_pass = vlm.generate_tokens, vlm.prior_pass
    monkeypatch.setattr(vlm, "generate_tokens",
                        lambda prompt, *a, **k: prompts.append(prompt) or generate(prompt, *a, **k))
    monkeypatch.setattr(vlm, "prior_pass", lambda q, g, f, context=(): priors.append(context)
                        or prior_pass(q, g, f, context))
    a = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=2, refixate=1.0, refixate_budget=40)
    first, second = a.arr.positions[0].cpu(), a.fixations[1].arr.positions[0].cpu()
    assert len(prompts) == 2 and len(priors) == 2 and list(priors[0]) == []
    assert torch.equal(priors[1][0].positions, first)  # the second prior pass reads the first round's saccades
    highres = a.observation.views.tensor("highres")
    with torch.no_grad():
        rounds = [vlm.encode_cells(highres, first), vlm.encode_cells(highres, second)]
    final = prompts[-1]
    image = final.ids[0] == vlm.image_token_id
    n_gestalt = len(a.observation.gestalt)
    assert int(image.sum()) == n_gestalt + 273 + 40
    saccade = image.nonzero()[n_gestalt:, 0]  # [313] where both rounds' saccades sit in the sequence
    t, h, w = final.position_ids[:, 0, saccade]  # [313] each
    start = int(final.position_ids[0, 0, saccade[0] - 1]) + 1  # one after the <|vision_start|> before the block
    cells = torch.cat([first, second])  # [313, 2] (row, col) on the candidate grid
    assert (t == start).all() and torch.equal(h - start, cells[:, 0]) and torch.equal(w - start, cells[:, 1])
    torch.testing.assert_close(final.embeds[0, image][n_gestalt:], torch.cat([r.features for r in rounds]))
    if rounds[0].deepstack is not None:  # Qwen3-VL: each level's features at the same tokens
        torch.testing.assert_close(final.deepstack[:, 0, image][:, n_gestalt:],
                                   torch.cat([r.deepstack for r in rounds], dim=1))


def test_a_second_look_that_cannot_fit_or_a_bad_tau_is_a_clear_error(arr_model):
    for tau in (-0.1, 1.5, float("nan")):
        with pytest.raises(InputError, match="between 0 and 1"):
            arr_model.answer(scene_image(896, 896), QUESTION, "arr", refixate=tau)
    with pytest.raises(InputError, match="at least 1"):
        arr_model.answer(scene_image(896, 896), QUESTION, "arr", refixate=0.5, refixate_budget=0)
    with pytest.raises(InputError, match="arr pipeline"):
        arr_model.answer(scene_image(896, 896), QUESTION, "full", refixate=0.5)
    with pytest.raises(ValueError, match="not yet read"):  # 32 x 32 cells, 273 read: 751 left
        arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=1, refixate=1.0, refixate_budget=752)


def test_after_an_adaptive_first_look_k2_is_a_share_of_its_k_capped_by_the_cells_left(arr_model):
    """--budget auto: the second look reads REFIXATE_SHARE of the first look's own K, under the same tensions (here
    e = 0.25: a quarter of K2 on coverage), never more than the cells not yet read (32 x 32 = 1024); with none
    left the first answer stands. upsample: 256 + 800 tokens would read the 896 px scene's 1024 native cells whole
    (test_reads_native); here ARR chooses, as under ARR's Options.upsample, to reach the grid's edge."""
    def ask(lo, hi):
        settings = TensionSettings(explore=0.25, min_budget=lo, max_budget=hi)
        return arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=1, budget="auto", refixate=1.0,
                                tensions=settings, upsample=True)

    a = ask(100, 300)
    K, K2 = (f.saccades for f in a.fixations)
    assert a.arr.auto_budget and 100 <= K <= 300 and K2 == round(REFIXATE_SHARE * K)
    assert int((a.fixations[1].arr.kinds == COVERAGE).sum()) == round(0.25 * K2)
    assert not cells(s for s in a.saccades if s.round == 1) & cells(s for s in a.saccades if s.round == 2)
    capped = ask(800, 800)
    assert [f.saccades for f in capped.fixations] == [800, 224] and capped.tokens.saccade == 1024
    none_left = ask(1024, 1024)
    assert not none_left.refixated and len(none_left.fixations) == 1 and none_left.tokens.saccade == 1024


def test_the_user_streamer_gets_the_final_answer_once(pocket):
    page = make_page("box_word", 10**9 + 11, 896)
    for tau in (0.0, 1.0):  # not fired: the first answer replayed; fired: the second one streamed
        parts = list(pocket.stream(page.image, page.questions[0].question, "arr", max_new_tokens=6, refixate=tau))
        final, texts = parts[-1], parts[:-1]
        assert final.refixated == (tau == 1.0) and final.text
        assert all(isinstance(t, str) for t in texts) and texts[-1].strip() == final.text


class LookingVLM:
    """A VLM whose answer looks where it is told: every head of every asked layer puts `mass` on the image tokens
    (the gestalt's, then the saccades'), with their hidden-state `norms`."""
    num_layers = 4

    def __init__(self, mass: list[float], norms: list[float]):
        self.mass, self.norms, self.prompts, self.layers = mass, norms, [], None

    def prompt(self, question, images, answer=None):
        self.prompts.append(([len(i) for i in images], answer))
        return SimpleNamespace(length=40)

    def answer_attention(self, prompt, layers):
        self.layers = layers
        n = len(self.mass)
        weights = torch.tensor(self.mass).view(1, 1, 1, n).repeat(len(layers), 3, 2, 1)  # 3 heads, 2 answer rows
        return AnswerAttention(weights, torch.tensor([self.norms] * len(layers)), tuple(layers))


@pytest.mark.parametrize("norms, far_corner", [([1.0] * 6, 0.2), ([1.0] * 5 + [50.0], 0.0)], ids=["plain", "sink"])
def test_the_attention_guide_puts_an_attended_saccades_neighbours_first(norms, far_corner):
    """A 4 x 4 candidate grid under a 2 x 2 gestalt, saccades read at cells 0 and 15: the answer gives 0.1 to the
    first gestalt token, 0.6 to saccade (0, 0) and 0.2 to saccade (3, 3). Each cell gets the most of its 3x3
    neighbourhood's saccade mass, plus a quarter of its gestalt token's 0.1 (4 of the 16 cells share it); a sink
    (saccade (3, 3)'s norm 50x the median) gives nothing."""
    vlm = LookingVLM([0.1, 0.0, 0.0, 0.0, 0.6, 0.2], norms)
    observation = SimpleNamespace(views=SimpleNamespace(candidate_grid=(4, 4), gestalt_grid=(2, 2)),
                                  gestalt=[None] * 4, question="Which word?")
    first = SimpleNamespace(indices=torch.tensor([[0, 15]]))
    guide, tokens = refixation.attention_guide(vlm, observation, first, [None] * 2, "JADE")
    c = far_corner
    assert guide.shape == (1, 4, 4) and tokens == 40
    torch.testing.assert_close(guide[0], torch.tensor([[0.625, 0.625, 0.0, 0.0],
                                                       [0.625, 0.625, 0.0, 0.0],
                                                       [0.0, 0.0, c, c],
                                                       [0.0, 0.0, c, c]]))
    assert vlm.layers == [3] and vlm.prompts == [([4, 2], "JADE")]  # the last layer, the first answer forced


def test_after_a_look_at_the_gestalt_alone_the_guide_is_the_answers_gestalt_attention_spread():
    """budget 0 (the first answer read the gestalt only): each cell gets its gestalt token's mass over the 4 cells
    the token covers; there are no saccades to look beside."""
    vlm = LookingVLM([0.1, 0.0, 0.3, 0.0], [1.0] * 4)
    observation = SimpleNamespace(views=SimpleNamespace(candidate_grid=(4, 4), gestalt_grid=(2, 2)),
                                  gestalt=[None] * 4, question="Which word?")
    first = SimpleNamespace(indices=torch.zeros(1, 0, dtype=torch.long))
    guide, _ = refixation.attention_guide(vlm, observation, first, None, "JADE")
    torch.testing.assert_close(guide[0], torch.tensor([[0.025, 0.025, 0.0, 0.0], [0.025, 0.025, 0.0, 0.0],
                                                       [0.075, 0.075, 0.0, 0.0], [0.075, 0.075, 0.0, 0.0]]))
    assert vlm.prompts == [([4], "JADE")]


def test_an_attention_guided_second_look_reads_where_the_first_answer_looked(arr_model, monkeypatch):
    """refixate_guide="attention": no second prior pass; the first answer teacher-forced over the first look's
    prompt (its gestalt and 273 saccades) at the LLM's last layer; K2 new cells, the highest of that guide among
    the cells not yet read; its compute counts the guide's whole pass."""
    vlm, priors, read = arr_model.vlm, [], []
    prior_pass, answer_attention = vlm.prior_pass, vlm.answer_attention
    monkeypatch.setattr(vlm, "prior_pass", lambda *a, **k: priors.append(1) or prior_pass(*a, **k))
    monkeypatch.setattr(vlm, "answer_attention", lambda prompt, layers: read.append((prompt, layers))
                        or answer_attention(prompt, layers))
    a = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=2, refixate=1.0, refixate_budget=30,
                         refixate_guide="attention")
    first, second = a.arr, a.fixations[1].arr
    assert a.refixated and len(priors) == 1 and len(read) == 1
    assert a.fixations[1].guide == "attention" and a.to_json()["refixation"]["guide"] == "attention"
    (prompt, layers), = read
    assert layers == [vlm.num_layers - 1]
    n_image = int((prompt.ids[0] == vlm.image_token_id).sum())
    assert n_image == len(a.observation.gestalt) + 273 and vlm.decode(prompt.ids[:, prompt.answer_start:]) == \
        a.fixations[0].text
    chosen = second.indices[0].tolist()
    assert len(set(chosen)) == 30 and not set(chosen) & set(first.indices[0].tolist())
    guide = second.relevance.flatten().float()
    unread = torch.ones_like(guide, dtype=torch.bool).index_fill_(0, first.indices[0], False)
    assert guide[chosen].min() >= guide[unread].sort(descending=True).values[29]
    prior_guided = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=2, refixate=1.0,
                                    refixate_budget=30)
    assert a.compute.prefill > prior_guided.compute.prefill


def test_an_empty_first_answer_has_no_attention_to_read_so_the_prior_guides(arr_model, monkeypatch):
    vlm = arr_model.vlm
    monkeypatch.setattr(vlm, "decode", lambda ids: "")
    monkeypatch.setattr(vlm, "answer_attention", lambda *a: pytest.fail("an empty answer has no rows to read"))
    a = arr_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=2, refixate=1.0, refixate_budget=30,
                         refixate_guide="attention")
    assert a.refixated and a.fixations[1].guide == "prior" and a.fixations[1].saccades == 30


def test_a_guide_that_is_not_one_is_refused(arr_model):
    with pytest.raises(InputError, match="refixate_guide must be one of prior, attention, got 'gaze'"):
        arr_model.answer(scene_image(896, 896), QUESTION, "arr", refixate=0.5, refixate_guide="gaze")
