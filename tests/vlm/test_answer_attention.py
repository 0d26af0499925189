"""
VLM.answer_attention (the teacher's reading, arr_coc/distill/teacher.py) on every family's tiny model, fp32 CPU: the
attention of the rows that predict a teacher-forced answer to the image tokens, per layer and head, equals the
weights transformers' own eager attention returns (output_attentions=True) from pixels, at those rows and columns,
and the image tokens' hidden-state norms are those of its hidden states entering each layer (output_hidden_states);
the layers come back in the order asked; a prompt without an answer, or a layer the model lacks, is refused.

    .venv/bin/python -m pytest -q tests/vlm/test_answer_attention.py
"""

import numpy as np
import pytest
import torch
from PIL import Image

QUESTION = "What is written on the sign?"
ANSWER = "STOP here, then left"


def photo(w=400, h=300, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def stock_forward(vlm, view, ids: torch.Tensor):
    """transformers' forward from pixels over the prompt ids [1, L] (answer included), eager, with its attentions
    (per layer [1, H, L, L]) and hidden states (the input of layer i: hidden_states[i])."""
    s = vlm.stock_inputs(QUESTION, view)
    assert torch.equal(ids[:, :s.length], s.input_ids)  # the same prompt, then the answer
    before = vlm.model.config._attn_implementation
    try:
        vlm.model.set_attn_implementation("eager")
        with torch.no_grad():
            out = vlm.model(input_ids=ids, pixel_values=s.pixel_values, image_grid_thw=s.image_grid_thw,
                            mm_token_type_ids=(ids == vlm.image_token_id).int(), output_attentions=True,
                            output_hidden_states=True)
    finally:
        vlm.model.set_attn_implementation(before)
    return out


def test_answer_attention_is_transformers_eager_attention_at_the_answer_rows(family):
    vlm = family.vlm
    view = family.views(photo()).tensor("native")
    prompt = vlm.prompt(QUESTION, [vlm.encode_view(view)], answer=ANSWER)
    layers = [2, 0]  # out of order: they come back as asked
    ours = vlm.answer_attention(prompt, layers)  # weights [2, H, A, n], norms [2, n]
    stock = stock_forward(vlm, view, prompt.ids)
    image = (prompt.ids[0] == vlm.image_token_id).nonzero()[:, 0]  # [n]
    rows = torch.arange(prompt.answer_start - 1, prompt.length - 1)  # [A]: the rows predicting the answer's tokens
    H = vlm.model.config.text_config.num_attention_heads
    assert ours.weights.shape == (2, H, len(rows), len(image)) and ours.weights.dtype == torch.float32
    assert ours.norms.shape == (2, len(image)) and ours.layers == (2, 0)
    for j, layer in enumerate(layers):
        expected = stock.attentions[layer][0][:, rows][:, :, image].float()  # [H, A, n]
        assert expected.std() > 1e-5  # not a flat map a wrong reading could also match
        torch.testing.assert_close(ours.weights[j], expected, atol=1e-6, rtol=1e-4)
        entering = stock.hidden_states[layer][0].float()  # [L, D]: layer - 1's output (the embeddings for 0)
        if prompt.deepstack is not None and 0 < layer <= len(prompt.deepstack):  # Qwen3-VL adds DeepStack after it
            entering = entering + prompt.deepstack[layer - 1][0].float()
        norms = entering[image].norm(dim=-1)  # [n]: what enters the layer
        torch.testing.assert_close(ours.norms[j], norms, atol=1e-4, rtol=1e-5)


def test_answer_attention_refuses_a_prompt_without_an_answer_and_unknown_layers(arr_model):
    vlm = arr_model.vlm
    tokens = vlm.encode_view(arr_model.views(photo()).tensor("native"))
    with pytest.raises(ValueError, match="teacher-forced answer"):
        vlm.answer_attention(vlm.prompt(QUESTION, [tokens]), [0])
    with pytest.raises(ValueError, match=r"layers must be in 0\.\.3"):
        vlm.answer_attention(vlm.prompt(QUESTION, [tokens], answer="a"), [4])
