"""
The prior's calibration (issue 61, part 2; arr_coc/distill/prior.py, arr_coc/vlm/readout.py): on hand-made attention
tensors it picks the expected (layer, heads, rows, relative), written out below; the prior pass on the tiny model
reads exactly the chosen layer, head and rows (and the calibration's own map of a page is the pass's); a model
folder's prior.json is what load_vlm reads; a deeper or relative readout's prior pass is counted in the GFLOPs.

    .venv/bin/python -m pytest -q tests/distill/test_prior.py
"""

import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.distill.prior import PriorReading, choose_readout, read_prior, readout_map
from arr_coc.vlm.readout import DEFAULT, PRIOR_FILE, PriorReadout

QUESTION = "Where is the red disc?"


def row(peak_cell: int, peak: float) -> list[float]:
    """One query row's attention over 4 gestalt tokens: `peak` on one, the rest spread evenly."""
    return [peak if cell == peak_cell else (1 - peak) / 3 for cell in range(4)]


def page(box_cell: int, question: torch.Tensor, generic: torch.Tensor, tokens: int) -> PriorReading:
    """A 2 x 2 gestalt on a 2 x 2 candidate grid (the upsampled map is the map), the box on one cell."""
    inside = torch.zeros(4, dtype=torch.bool)
    inside[box_cell] = True
    return PriorReading(question, tokens, generic, 1, (2, 2), (2, 2), inside)


def layered_pages() -> list[PriorReading]:
    """2 layers, 2 heads, 3 rows (the question's 2 tokens, then the template's last): only layer 1's head 0 at the
    question's last token looks at the box (cell 0 on one page, cell 3 on the other); its first row looks at cell 1,
    the prompt's last row at cell 2, head 1 at cell 2 everywhere, layer 0 at cell 1 everywhere. The generic
    question's map is uniform, so relative attention ranks as plain (and loses the tie)."""
    pages = []
    for box in (0, 3):
        a = torch.tensor([row(1, 0.9)] * 3).expand(2, 2, 3, 4).clone()  # [layers, H, R, Ng]
        a[1, 0] = torch.tensor([row(1, 0.9), row(box, 0.5), row(2, 0.9)])
        a[1, 1] = torch.tensor([row(2, 0.9)] * 3)
        pages.append(page(box, a, torch.full((2, 2, 2, 4), 0.25), tokens=2))
    return pages


def test_the_calibration_picks_layer_1_head_0_the_questions_last_token():
    readout = choose_readout(layered_pages(), "hand-made", budget=1)
    assert readout.choice == (1, (0,), "question_last", False)
    assert (readout.recall, readout.default_recall, readout.pages, readout.budget) == (1.0, 0.0, 2, 1)
    assert readout.scores["layer 1, every head, all"] == 0.0 and readout.scores["layer 1, heads 1, question_last"] == 0


def test_the_calibration_picks_relative_attention_where_only_it_finds_the_box():
    """1 layer, 1 head; the question looks at cell 3 (0.5) most, at the box (0.3) next; the generic question looks
    at cell 3 (0.7): relative attention gives the box 0.3 / 0.1 = 3 against cell 3's 0.5 / 0.7."""
    pages = []
    for box in (0, 1):
        asked = [0.1] * 4
        asked[3], asked[box] = 0.5, 0.3
        pages.append(page(box, torch.tensor([[[asked, asked]]]), torch.tensor([[[[0.1, 0.1, 0.1, 0.7]]]]), 1))
    readout = choose_readout(pages, "hand-made", budget=1)
    assert readout.choice == (0, (), "all", True)
    assert (readout.recall, readout.default_recall) == (1.0, 0.0)


def test_todays_readout_stays_where_nothing_beats_it():
    pages = layered_pages()
    for p in pages:
        p.inside = torch.tensor([False, False, True, False])  # the box on cell 2: today's (layer 1, every head, all
        # rows: head 1's 0.9 there) finds it, and no candidate does better
    readout = choose_readout(pages, "hand-made", budget=1)
    assert readout.choice == DEFAULT.choice and readout.recall == readout.default_recall == 1.0


def test_the_readout_round_trips_and_a_broken_file_is_named(tmp_path):
    readout = PriorReadout(layer=2, heads=(0, 3), rows="prompt_last", relative=True, model="m", pages=9)
    assert PriorReadout.load(readout.save(tmp_path / PRIOR_FILE)) == readout
    assert PriorReadout.load(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text("{\"rows\": 1}")
    with pytest.raises(ValueError, match="bad.json is no prior readout"):
        PriorReadout.load(tmp_path / "bad.json")


def photo(seed=1):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (300, 400, 3), dtype=np.uint8))


def gestalt_of(vlm, image):
    from arr_coc.vlm.views import make_views

    return vlm.encode_view(make_views(image, device=vlm.device, cell=vlm.cell, min_pixels=vlm.min_pixels)
                           .tensor("gestalt"))


@pytest.fixture
def tiny(arr_model):
    vlm = arr_model.vlm
    yield vlm
    vlm.prior_readout = DEFAULT


def test_the_prior_pass_reads_exactly_the_chosen_layer_head_and_rows(tiny):
    """Layer 3, head 1, the question's last token: the pass's map is that row of prior_rows (row 5 of the rows after
    the image: "Where is the red disc?" is 6 tokens), not today's."""
    gestalt = gestalt_of(tiny, photo())
    rows, tokens = tiny.prior_rows(QUESTION, gestalt, [0, 1, 2, 3])  # [4, H, R, Ng]
    assert tokens == 6
    today = tiny.prior_pass(QUESTION, gestalt, 0.5).attention
    tiny.prior_readout = PriorReadout(layer=3, heads=(1,), rows="question_last")
    chosen = tiny.prior_pass(QUESTION, gestalt, 0.5).attention
    torch.testing.assert_close(chosen, rows[3, 1, 5], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(today, rows[2].mean(dim=(0, 1)), atol=1e-6, rtol=1e-5)  # today's: layer 2 of 4
    for other in (today, rows[2, 1, 5], rows[3, 0, 5], rows[3, 1, 4], rows[3, 1, 6]):  # another layer, head or row
        assert not torch.allclose(chosen, other, atol=1e-6, rtol=1e-5)  # would fail the first check
    tiny.prior_readout = PriorReadout(layer=1, heads=(0, 2), rows="prompt_last", relative=True)
    generic = tiny.prior_rows("Write a general description of the image.", gestalt, [1])[0]  # [1, H, Rg, Ng]
    asked, general = rows[1, [0, 2], -1].mean(0), generic[0, [0, 2], -1].mean(0)  # [Ng] each, all > 1e-4
    ratio = asked / general  # ViCrop's relative attention, rescaled to the question's mass
    torch.testing.assert_close(tiny.prior_pass(QUESTION, gestalt, 0.5).attention, ratio * asked.sum() / ratio.sum(),
                               atol=1e-6, rtol=1e-5)


def test_the_calibrations_map_of_a_page_is_the_prior_pass_map(tiny):
    image = photo(2)
    reading = read_prior(tiny, image, QUESTION, (0, 0, 100, 100))
    gestalt = gestalt_of(tiny, image)
    for readout in (DEFAULT, PriorReadout(layer=0, heads=(3,), rows="question_mean"),
                    PriorReadout(layer=2, rows="prompt_last", relative=True)):
        tiny.prior_readout = readout
        torch.testing.assert_close(readout_map(reading, readout), tiny.prior_pass(QUESTION, gestalt, 0.5).attention,
                                   atol=1e-6, rtol=1e-5)


def test_a_folders_prior_json_is_what_load_vlm_reads(tmp_path):
    from arr_coc.vlm.families import load_vlm
    from arr_coc.vlm.tiny import tiny_model_path

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path("tiny"), folder)
    assert load_vlm(str(folder), "cpu", torch.float32).prior_readout == DEFAULT
    readout = PriorReadout(layer=1, heads=(2,), rows="question_last", model="tiny")
    readout.save(folder / PRIOR_FILE)
    assert load_vlm(str(folder), "cpu", torch.float32).prior_readout == readout


def test_a_deeper_or_relative_readout_is_counted_in_the_gflops(tiny):
    from arr_coc.vlm.flops import prefill_gflops

    text = tiny.model.config.text_config
    today = tiny.gflops([], 100, 300, 0.5)["prefill"]
    assert today == pytest.approx(prefill_gflops(text, 100) + prefill_gflops(text, 300, 2, False))
    tiny.prior_readout = PriorReadout(layer=3)
    assert tiny.gflops([], 100, 300, 0.5)["prefill"] == pytest.approx(prefill_gflops(text, 100)
                                                                       + prefill_gflops(text, 300, 3, False))
    tiny.prior_readout = PriorReadout(layer=3, relative=True)
    assert tiny.gflops([], 100, 300, 0.5)["prefill"] == pytest.approx(prefill_gflops(text, 100)
                                                                       + 2 * prefill_gflops(text, 300, 3, False))
    assert tiny.gflops([], 100, 300, 1.0)["prefill"] == pytest.approx(prefill_gflops(text, 100)
                                                                       + prefill_gflops(text, 300, 4, False))


def test_the_command_refuses_bad_flags_before_loading(capsys):
    from arr_coc.commands import prior

    for argv in (["--pages", "0"], ["--top-cells", "0"], ["--rows", "x"]):
        with pytest.raises(SystemExit) as exit:
            prior.main(["--model", "tiny", *argv])
        assert exit.value.code == 2
    assert prior.main(["--model", "tiny", "--judge", "--out", "elsewhere.json"]) == 2
    assert "--judge reads the readout the model loads" in capsys.readouterr().err


def test_the_command_calibrates_the_tiny_model_into_out(tiny_loaded_once, tmp_path):
    from arr_coc.commands import prior

    out = tmp_path / "prior.json"
    assert prior.main(["--model", "tiny", "--pages", "2", "--size", "224", "--top-cells", "8", "--max-layer", "1",
                       "--out", str(out), "--device", str(tiny_loaded_once.vlm.device)]) == 0
    readout = PriorReadout.load(out)
    assert (readout.model, readout.pages, readout.budget) == ("tiny", 2, 8)
    assert readout.layer in (None, 0, 1) and len(readout.scores) == 2 * 4 * 2 * (4 + 1 + 2)  # layers 0-1 only
