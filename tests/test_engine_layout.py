"""
The vLLM plugin's prompt layout (arr_coc/pipelines/arr_layout.py's arr_slot, arr_positions) against the pipelines'
own (arr_prompt, beside them), on the pocket model's fine-print page: the ids (a one-pad chat prompt, the pad
replaced by arr_slot) and the M-RoPE positions (arr_positions) equal arr_prompt's, so neither can change alone. Seen failing with arr_slot's gestalt block one pad
short and with the saccade block shifted one cell right.

    .venv/bin/python -m pytest -q tests/test_engine_layout.py
"""

from pathlib import Path

import pytest
import torch

from arr_coc.commands import cli
from arr_coc.pipelines.arr_layout import arr_positions, arr_prompt, arr_slot, encode_saccades
from arr_coc.vlm.images import open_image

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the value of PAGE?"


@pytest.fixture(scope="module")
def sample():
    model, _ = cli.load_model("pocket", None, "cpu", quiet=True)
    a = model.answer(open_image(ROOT / "assets" / "pocket_fine_print.png"), QUESTION, "arr")
    saccades = encode_saccades(model.vlm, a.observation, a.arr.positions[0])
    return model.vlm.chat, a, arr_prompt(model.vlm, a.observation, saccades)


def plugin_layout(chat, a, cells):
    """The plugin's ids and positions for the answer's look (vllm_model: ArrProcessor, get_mrope_input_positions)."""
    one_pad = chat.prompt_ids(QUESTION, [1])[0].tolist()
    at = one_pad.index(chat.image_token_id)
    views = a.observation.views
    slot = arr_slot(chat, views.gestalt_grid[0] * views.gestalt_grid[1], len(cells))
    ids = torch.tensor([one_pad[:at] + slot + one_pad[at + 1:]])
    return ids, arr_positions(chat, ids, views.gestalt_grid, views.candidate_grid, cells)


def test_the_plugin_lays_out_arr_prompt(sample):
    chat, a, prompt = sample
    ids, positions = plugin_layout(chat, a, a.arr.positions[0])
    assert ids.shape[1] == 256 + 273 + 30 and int((ids == chat.image_token_id).sum()) == 256 + 273
    assert ids.tolist() == prompt.ids.tolist()
    assert positions.tolist() == prompt.position_ids[:, 0].tolist()


def test_a_shifted_saccade_block_is_told(sample):
    chat, a, prompt = sample
    shifted = a.arr.positions[0] + torch.tensor([0, 1])
    _, positions = plugin_layout(chat, a, shifted)
    assert positions.tolist() != prompt.position_ids[:, 0].tolist()


def test_a_text_only_prompt_is_all_text(sample):
    chat = sample[0]
    ids = torch.tensor([[5, chat.image_token_id, chat.image_token_id, 7]])  # pads a user typed, no image
    assert arr_positions(None, ids, None, None, None).tolist() == [[0, 1, 2, 3]] * 3
