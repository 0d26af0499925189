"""
The teacher of issue #52 (arr_coc/distill/teacher.py): its map pooled to cells on a hand-made attention tensor (the
expected map worked out by hand below), the head choice pinned on a fixed hand-made calibration set, the map's peak
inside the asked box on a pocket page (models/pocket-qwen2-vl, fp32, CPU), its structure on every family's tiny model,
and the command's parse-time checks and one run on the tiny model.

    .venv/bin/python -m pytest -q tests/distill/test_teacher.py
"""

import json
import random

import pytest
import torch

from arr_coc.distill import teacher
from arr_coc.distill.cache import TargetCache
from arr_coc.distill.teacher import Reading, TeacherHeads
from arr_coc.vlm.base import AnswerAttention

POCKET_HEADS = [(3, 3), (3, 1), (3, 2), (3, 0)]  # what `python -m arr_coc.commands.teacher --pages 48` chose (pocket)


def hand_made_attention() -> AnswerAttention:
    """Layers (1, 3), 2 heads, 2 answer rows, 6 image tokens on a 2 x 3 grid; layer 1's token 2 is a sink (norm 50
    against a median of 1)."""
    w = torch.zeros(2, 2, 2, 6)  # [layers, H, A, n]
    w[1, 0, 0, 0], w[1, 0, 1, 5] = 0.4, 0.2  # layer 3 head 0: mean over rows [0.2, 0, 0, 0, 0, 0.1]
    w[0, 1, 0, 4], w[0, 1, 1, 4] = 0.6, 0.2  # layer 1 head 1: mean [0, 0, 0, 0, 0.4, 0] ...
    w[0, 1, :, 2] = 0.9  # ... and 0.9 on the sink, which is dropped
    w[0, 0, :, 3] = w[1, 1, :, 3] = 0.5  # the heads not chosen
    norms = torch.ones(2, 6)
    norms[0, 2] = 50.0
    return AnswerAttention(w, norms, (1, 3))


def test_the_map_is_pooled_to_cells_as_worked_out_by_hand():
    """Heads (3, 0) and (1, 1) averaged: [[0.1, 0, 0], [0, 0.2, 0.05]]; [1, 2, 1] / 4 down the columns:
    [[0.05, 0.05, 0.0125], [0.025, 0.1, 0.025]]; then along the rows: [[0.0375, 0.040625, 0.01875], [0.0375, 0.0625,
    0.0375]], sum 0.234375; normalised: [[12, 13, 6], [12, 20, 12]] / 75."""
    grid_map = teacher.teacher_map(hand_made_attention(), [(3, 0), (1, 1)], (2, 3))
    expected = torch.tensor([[12.0, 13.0, 6.0], [12.0, 20.0, 12.0]]) / 75
    torch.testing.assert_close(grid_map, expected, atol=1e-6, rtol=0)


def test_a_map_with_no_mass_left_is_uniform():
    attention = AnswerAttention(torch.zeros(1, 1, 1, 4), torch.ones(1, 4), (0,))
    assert teacher.teacher_map(attention, [(0, 0)], (2, 2)).tolist() == [[0.25, 0.25], [0.25, 0.25]]


def calibration_set() -> list[Reading]:
    """Three pages of a 2-layer, 3-head model on a 2 x 2 grid; the asked box touches cell 0, cell 3, cells 1 and 2."""
    maps = {  # (layer, head): its map [4] on each page
        (0, 0): [[0.6, 0.1, 0.2, 0.1]] * 3,  # peak on cell 0: 1 hit; mass (0.6 + 0.1 + 0.3) / 3 = 0.333
        (0, 1): [[0.4, 0.2, 0.2, 0.2], [0.1, 0.2, 0.2, 0.5], [0.1, 0.5, 0.2, 0.2]],  # 3 hits
        (0, 2): [[0.28, 0.24, 0.24, 0.24], [0.4, 0.2, 0.2, 0.2], [0.4, 0.2, 0.2, 0.2]],  # 1 hit, mass 0.293
        (1, 0): [[0.5, 0.2, 0.2, 0.1], [0.2, 0.2, 0.1, 0.5], [0.6, 0.05, 0.05, 0.3]],  # 2 hits, mass 0.367
        (1, 1): [[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7], [0.1, 0.1, 0.1, 0.7]],  # 2 hits, mass 0.533
        (1, 2): [[0.45, 0.55, 0.0, 0.0], [0.3, 0.4, 0.0, 0.3], [0.5, 0.25, 0.25, 0.0]],  # 0 hits, mass 0.417
    }
    insides = [[True, False, False, False], [False, False, False, True], [False, True, True, False]]
    readings = []
    for page, inside in enumerate(insides):
        page_maps = torch.zeros(2, 3, 4)  # [L, H, n]
        for (layer, head), by_page in maps.items():
            page_maps[layer, head] = torch.tensor(by_page[page])
        readings.append(Reading(page_maps, (0, 1), (2, 2), "a", torch.tensor(inside)))
    return readings


def test_the_head_choice_is_pinned_on_a_fixed_calibration_set():
    """Most peaks inside the box first; equal counts by mean mass inside it; a head that never peaks there comes
    last whatever its mass."""
    heads = teacher.chosen_heads(calibration_set(), "hand-made", k=5)
    assert heads.heads == [(0, 1), (1, 1), (1, 0), (0, 0), (0, 2)]
    assert heads.hits == [3, 2, 2, 1, 1] and heads.pages == 3 and heads.model == "hand-made"


def test_the_heads_are_saved_and_read_back(tmp_path):
    heads = TeacherHeads("pocket", [(3, 2), (1, 0)], [40, 31], 48)
    heads.save(tmp_path)
    assert json.loads((tmp_path / teacher.HEADS_FILE).read_text())["heads"] == [[3, 2], [1, 0]]
    assert TeacherHeads.load(tmp_path) == heads and heads.layers == [1, 3]


@pytest.fixture(scope="module")
def pocket():
    from arr_coc.vlm.families import load_vlm

    return load_vlm("pocket", device="cpu", dtype=torch.float32)


def test_on_a_pocket_page_the_teachers_peak_is_inside_the_asked_box(pocket):
    from arr_coc.synth.families import family_size, make_family_page

    page = make_family_page("scattered", "fine_print", 896000, *family_size("scattered", 896000, 896))
    q = random.Random(0).choice(page.questions)
    heads = TeacherHeads("pocket", POCKET_HEADS, [0] * 4, 0)
    reading = teacher.read(pocket, page.image, q.question, heads.layers, box=q.box)
    target = teacher.target_of(reading, heads, "page", pocket.name)
    assert reading.answer == q.answer  # the model reads it: its own answer is the one forced
    gh, gw = target.grid
    assert target.map.shape == (gh, gw) and abs(float(target.map.sum()) - 1) < 1e-5
    assert reading.inside.sum() < 0.02 * gh * gw  # a small box: a peak there is no accident
    assert reading.inside[int(target.map.argmax())]


def test_every_family_gives_a_target_on_its_native_grid(family, tmp_path):
    from PIL import Image

    vlm = family.vlm
    page = Image.new("RGB", (300, 200), "white")
    heads = TeacherHeads(vlm.name, [(1, 0), (3, 1)], [0, 0], 0)
    target = teacher.teach(vlm, heads, page, "What is here?", item="blank", answer="nothing")
    assert target.grid == family.views(page).native_grid and target.map.shape == target.grid
    assert target.heads == ((1, 0), (3, 1)) and target.answer == "nothing" and target.map.dtype == torch.float32
    assert abs(float(target.map.sum()) - 1) < 1e-5


def test_the_command_refuses_bad_flags_at_parse_time(tmp_path, capsys):
    from arr_coc.commands import teacher as command

    (tmp_path / "file").write_text("x")
    for argv, says in ((["--out", str(tmp_path), "--pages", "0"], "--pages"),
                       (["--out", str(tmp_path / "file")], "is a file"),
                       (["--pages", "4"], "--out"),
                       (["--out", str(tmp_path), "--heads", "x"], "--heads")):
        with pytest.raises(SystemExit) as e:
            command.main(argv)
        assert e.value.code == 2 and says in capsys.readouterr().err


def test_the_command_picks_heads_caches_targets_and_measures_on_the_tiny_model(tmp_path, capsys):
    from arr_coc.commands import teacher as command

    out = tmp_path / "teacher"
    assert command.main(["--model", "tiny", "--out", str(out), "--pages", "2", "--heads", "2", "--size", "224",
                         "--heldout", "2", "--device", "cpu"]) == 0
    heads = TeacherHeads.load(out)
    cache = TargetCache(out)
    assert len(heads.heads) == 2 and heads.pages == 2 and cache.heads == tuple(heads.heads) and len(cache) == 2
    assert cache.items == ["scattered:fine_print:224000", "form:fine_print:224001"]
    assert json.loads((out / "heldout.json").read_text())["n"] == 2
    assert "teacher peak inside the asked box" in capsys.readouterr().out


def test_run_draws_the_teacher_beside_arrs_relevance(tiny_loaded_once, tmp_path, capsys):
    from PIL import Image

    from arr_coc import run

    Image.new("RGB", (1000, 800), "white").save(tmp_path / "page.png")  # more cells than ARR reads: it chooses
    TeacherHeads("tiny", [(1, 0)], [0], 0).save(tmp_path / "heads")
    argv = ["--model", "tiny", "--image", str(tmp_path / "page.png"), "--question", "What is it?", "--pipelines", "arr",
            "--max-new-tokens", "2", "--save-dir", str(tmp_path / "out"), "--device", str(tiny_loaded_once.vlm.device)]
    assert run.main(argv + ["--teacher", str(tmp_path / "heads")]) == 0
    assert f"wrote {tmp_path / 'out' / 'teacher.png'}" in capsys.readouterr().out
    assert Image.open(tmp_path / "out" / "teacher.png").width > 3 * 768  # three panels
    with pytest.raises(SystemExit):
        run.parse_args(argv + ["--teacher", str(tmp_path)])
    assert "holds no teacher_heads.json" in capsys.readouterr().err
    no_save_dir = argv[:argv.index("--save-dir")] + argv[argv.index("--device"):]
    with pytest.raises(SystemExit):
        run.parse_args(no_save_dir + ["--teacher", str(tmp_path / "heads")])
    assert "only used with --save-dir" in capsys.readouterr().err
