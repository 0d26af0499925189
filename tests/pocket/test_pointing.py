"""
Where the answer must look (arr_coc.pocket.pointing): the target tokens are the asked box's interior, found here
from the page's own drawing (the question's box and border, cell centres), the query is the position just before
the answer, and the supervised head's probabilities are stock transformers' eager attention (output_attentions).
"""

import copy

import pytest
import torch
from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.pocket.binding import binding_targets
from arr_coc.pocket.pointing import POINT_HEAD, POINT_LAYER, Pointing, use_pointing_attention
from arr_coc.pocket.data import collate, model_inputs
from arr_coc.pocket.model import image_processor
from arr_coc.synth.fineprint import make_page

SIZE = 336
CELL = 28


@pytest.fixture(scope="module")
def stock():
    model = Qwen2VLForConditionalGeneration.from_pretrained(POCKET_FOLDER, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(POCKET_FOLDER)


def _batch(tokenizer):
    page = make_page("box_word", 3, SIZE)
    first, second = page.questions[:2]
    chats = [[("Read the page.", page.transcript), (first.question, first.answer), (second.question, second.answer)]]
    batch = collate(tokenizer, [page.image], chats, bindings=[binding_targets(page.marks, SIZE, SIZE)])
    return page, (first, second), batch


def _interior_cells(page, question) -> set[int]:
    """The page's cells whose centre lies inside the asked box's border, by the drawn box alone."""
    mark = next(m for m in page.marks if m.kind == "box" and tuple(m.box) == tuple(question.box))
    x0, y0, x1, y1 = mark.box
    b = mark.border
    return {r * (SIZE // CELL) + c for r in range(SIZE // CELL) for c in range(SIZE // CELL)
            if x0 + b <= c * CELL + CELL // 2 < x1 - b and y0 + b <= r * CELL + CELL // 2 < y1 - b}


def test_each_box_question_points_from_just_before_its_answer_at_its_boxs_interior(stock):
    _, tokenizer = stock
    page, questions, batch = _batch(tokenizer)
    queries, targets = batch["point_queries"], batch["point_targets"]
    assert queries.shape == (2, 2) and queries[:, 0].tolist() == [0, 0]  # the transcript points nowhere
    ids = batch["input_ids"][0]
    pads = (ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).nonzero()[:, 0].tolist()
    for (_, position), target, question in zip(queries.tolist(), targets, questions):
        answer = tokenizer(question.answer, add_special_tokens=False)["input_ids"]
        assert ids[position + 1:position + 1 + len(answer)].tolist() == answer  # the next tokens are the answer
        assert tokenizer.decode(ids[position - 2:position + 1]) == "<|im_start|>assistant\n"
        assert {pads.index(p) for p in target.nonzero()[:, 0].tolist()} == _interior_cells(page, question)


def test_the_supervised_head_is_stock_eager_attention_and_the_loss_its_mass_on_the_target(stock):
    model, tokenizer = stock
    _, _, batch = _batch(tokenizer)
    inputs = model_inputs(batch, image_processor(), model.config.image_token_id, "cpu")
    queries, targets = inputs.pop("point_queries"), inputs.pop("point_targets")
    pointed = use_pointing_attention(copy.deepcopy(model))
    with torch.no_grad(), Pointing(pointed, queries) as pointing:
        pointed(**inputs)
    eager = copy.deepcopy(model)
    eager.config.text_config._attn_implementation = "eager"
    with torch.no_grad():
        attentions = eager(**inputs, output_attentions=True).attentions[POINT_LAYER]  # [B, H, L, L]
    rows = attentions[queries[:, 0], POINT_HEAD, queries[:, 1]]  # [P, L]
    torch.testing.assert_close(pointing.log_probs.exp(), rows, atol=1e-5, rtol=1e-4)
    for wanted in (targets, targets.roll(1, dims=0)):  # each question's own box, then the other question's
        expected = -sum(float(row[t].sum().log()) for row, t in zip(rows, wanted))
        assert float(pointing.loss(wanted)) == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert expected > 1  # the head looks at the asked box (the shipped model points), far less at the other one


@pytest.mark.parametrize("weight, pointing_moves_the_vlm", [(1.0, True), (0.0, False)])
def test_pointing_weight_zero_takes_the_pointing_targets_out_of_the_vlms_gradient(stock, weight,
                                                                                    pointing_moves_the_vlm):
    """The same-run ablation of pointing (--pointing-weight 0): the LLM's gradient is the same whether each question
    points at its own box or at the other's; at weight 1 it is not."""
    model, tokenizer = stock
    _, _, batch = _batch(tokenizer)
    inputs = model_inputs(batch, image_processor(), model.config.image_token_id, "cpu")
    grads = [_pointing_layer_gradient(stock, batch, {**inputs, "point_targets": targets}, pointing_weight=weight)
             for targets in (inputs["point_targets"], inputs["point_targets"].roll(1, dims=0))]
    assert len(inputs["point_queries"]) == 2
    assert (not torch.allclose(*grads, rtol=0, atol=1e-9)) == pointing_moves_the_vlm


def _pointing_layer_gradient(stock, batch, inputs, **weights):
    """The gradient of the pointing layer's query projection after one Trainee backward (the Trainee's weights)."""
    from arr_coc.runtime import distributed
    from arr_coc.pocket.binding import BindingHead, aligned_ids
    from arr_coc.pocket.reading import ReadingHead
    from arr_coc.pocket.trainer import Trainee, backward

    model, tokenizer = stock
    reading = torch.full((inputs["image_grid_thw"].prod(-1).sum() // 4, 22), -100)  # no reading targets
    trainee = Trainee(use_pointing_attention(copy.deepcopy(model)).train(), ReadingHead(256, 256), BindingHead(256),
                      aligned_ids(tokenizer), **weights)
    backward(trainee, inputs, reading, batch["binding"], distributed.Process(0, 1, "cpu"))
    return trainee.model.model.language_model.layers[POINT_LAYER].self_attn.q_proj.weight.grad.clone()


def test_value_cells_name_the_cell_of_each_digit_left_to_right_and_skip_a_covered_field():
    """Written out: a 112 px wide page (4 cells a row), "K: 1234" on the second row; a field missing a digit
    (a shape covers it) points nowhere."""
    from arr_coc.pocket.pointing import value_cells
    from arr_coc.synth.fineprint import Glyph, Mark

    marks = [Mark("field", (0, 28, 112, 56), key="K", text="1234"),
             Mark("field", (0, 0, 112, 28), key="L", text="5678")]
    glyphs = [Glyph(5, 42, "K"), Glyph(100, 42, "4"), Glyph(60, 42, "1"), Glyph(70, 42, "2"), Glyph(90, 42, "3"),
              Glyph(60, 14, "5"), Glyph(70, 14, "6"), Glyph(90, 14, "8")]  # L's 7 is covered
    assert value_cells(marks, glyphs, 112) == {"K": [6, 6, 7, 7]}


def _fine_print_batch(tokenizer, seed=5):
    from arr_coc.pocket.pointing import value_cells

    page = make_page("fine_print", seed, SIZE)
    turns = [(q.question, q.answer) for q in page.questions[:3]]
    batch = collate(tokenizer, [page.image], [[("Read the page.", page.transcript)] + turns],
                    bindings=[binding_targets(page.marks, SIZE, SIZE)],
                    values=[value_cells(page.marks, page.glyphs, SIZE)])
    return page, turns, batch


def test_each_digit_is_written_from_the_position_that_points_at_its_own_cell(stock):
    """Each fine_print answer gets four digit queries: the token after each is that digit of the answer, and its
    target is the one page token whose cell holds the digit's ink in the page's own pixels (dark pixels there, in
    the field's row)."""
    import numpy as np

    _, tokenizer = stock
    page, turns, batch = _fine_print_batch(tokenizer)
    queries, targets = batch["point_digit_queries"], batch["point_digit_targets"]
    assert queries.shape == (12, 2) and targets.shape == (12, batch["input_ids"].shape[1])
    ids = batch["input_ids"][0]
    pads = (ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).nonzero()[:, 0].tolist()
    pixels = np.asarray(page.image.convert("L"))
    for i, ((_, position), target) in enumerate(zip(queries.tolist(), targets)):
        question, answer = turns[i // 4]
        assert tokenizer.decode(ids[position + 1]) == answer[i % 4]  # the next token is the k-th digit
        (cell,) = [pads.index(p) for p in target.nonzero()[:, 0].tolist()]
        row, col = divmod(cell, SIZE // CELL)
        field = next(m for m in page.marks if m.kind == "field" and question.endswith(f" {m.key}?"))
        assert field.box[1] < (row + 1) * CELL and row * CELL < field.box[3]  # on the field's row ...
        assert field.box[0] < (col + 1) * CELL and col * CELL < field.box[2]  # ... within its ink box
        assert pixels[row * CELL:(row + 1) * CELL, col * CELL:(col + 1) * CELL].min() < 128  # and inked
    columns = [pads.index(int(t.nonzero()[0, 0])) % (SIZE // CELL) for t in targets]
    for k in range(0, 12, 4):
        assert columns[k:k + 4] == sorted(columns[k:k + 4])  # left to right along the value


@pytest.mark.parametrize("weight, digits_move_the_vlm", [(1.0, True), (0.0, False)])
def test_point_digits_zero_takes_the_digit_targets_out_of_the_vlms_gradient(stock, weight, digits_move_the_vlm):
    """--point-digits W: at 0 the LLM's gradient is the same whether each digit points at its own cell or at
    another digit's; at 1 it is not."""
    model, tokenizer = stock
    _, _, batch = _fine_print_batch(tokenizer)
    inputs = model_inputs(batch, image_processor(), model.config.image_token_id, "cpu")
    grads = [_pointing_layer_gradient(stock, batch, {**inputs, "point_digit_targets": targets}, point_digits=weight)
             for targets in (inputs["point_digit_targets"], inputs["point_digit_targets"].roll(3, dims=0))]
    assert (inputs["point_digit_targets"] != inputs["point_digit_targets"].roll(3, dims=0)).any()
    assert (not torch.allclose(*grads, rtol=0, atol=1e-9)) == digits_move_the_vlm
