"""
VLM.prior_pass (the prior pass with its hidden states, which the participatory scorer's StateScorer reads) on every
family's tiny model, fp32 CPU: its gestalt and question states are transformers' own hidden states entering the
prior's layer (output_hidden_states, from pixels), at the gestalt tokens and at the rows after the image block, and
its attention is prior_attention's.

    .venv/bin/python -m pytest -q tests/vlm/test_prior_states.py
"""

import numpy as np
import torch
from PIL import Image

QUESTION = "Where is the red disc?"


def photo(w=400, h=300, seed=1):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def stock_hidden_states(vlm, view, ids: torch.Tensor) -> tuple:
    """transformers' forward from pixels over the prompt ids [1, L]: its hidden states (hidden_states[i] enters
    layer i)."""
    s = vlm.stock_inputs(QUESTION, view)
    assert torch.equal(ids, s.input_ids)  # the prior's prompt is the stock prompt of the gestalt view
    with torch.no_grad():
        out = vlm.model(input_ids=ids, pixel_values=s.pixel_values, image_grid_thw=s.image_grid_thw,
                        mm_token_type_ids=(ids == vlm.image_token_id).int(), output_hidden_states=True)
    return out.hidden_states


def test_the_prior_pass_states_are_transformers_hidden_states_entering_its_layer(family):
    vlm = family.vlm
    view = family.views(photo()).tensor("gestalt")
    gestalt = vlm.encode_view(view)
    prior = vlm.prior_pass(QUESTION, gestalt, 0.5)
    prompt = vlm.prompt(QUESTION, [gestalt])
    index = int(0.5 * vlm.num_layers)  # the prior's layer: 2 of the tiny models' 4
    entering = stock_hidden_states(vlm, view, prompt.ids)[index][0].float()  # [L, D]
    if prompt.deepstack is not None and 0 < index <= len(prompt.deepstack):  # Qwen3-VL adds DeepStack before it
        entering = entering + prompt.deepstack[index - 1][0].float()
    image = (prompt.ids[0] == vlm.image_token_id).nonzero()[:, 0]  # [Ng]
    question = torch.arange(int(image[-1]) + 2, prompt.length)  # after <|vision_end|>: the question to the end
    assert prior.gestalt_states.shape == (len(gestalt), vlm.hidden_size)
    assert prior.question_states.shape == (len(question), vlm.hidden_size) and len(question) > 5
    assert entering[image].std() > 1e-3  # not a flat tensor a wrong reading could also match
    torch.testing.assert_close(prior.gestalt_states.float(), entering[image], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(prior.question_states.float(), entering[question], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(prior.attention, vlm.prior_attention(QUESTION, gestalt, 0.5), atol=0, rtol=0)
