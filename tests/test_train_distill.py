"""
python -m arr_coc.train --distill: the ARR layer trained toward the teacher's cached maps on a VQA set without boxes
(a local parquet in DocVQA's schema), on the tiny model; its flags refused where they cannot work.

    .venv/bin/python -m pytest -q tests/test_train_distill.py
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from arr_coc.distill.cache import Target, TargetWriter
from arr_coc.train import main, parse_args
from conftest import write_parquet_set


def teacher_cache(folder, ids: list[str]):
    """Hand-made teacher maps on a 4 x 4 grid, all mass in one cell per item, cached as the teacher writes them."""
    with TargetWriter(folder, "tiny", [(0, 0)]) as writer:
        for i, item in enumerate(ids):
            grid_map = torch.zeros(4, 4)
            grid_map[i % 4, 3 - i % 4] = 1.0
            writer.add(Target(item, (4, 4), grid_map, "tiny", ((0, 0),), answer=f"answer {i}"))
    return folder


def test_train_distill_runs_on_the_tiny_model_with_a_local_parquet_set_and_no_boxes(tmp_path, tiny_loaded_once):
    data = write_parquet_set(tmp_path / "docvqa", "docvqa", 5)  # ids q0..q4, no boxes
    cache = teacher_cache(tmp_path / "teacher", ["q0", "q1", "q2", "q3"])  # q4 has no map: left out
    out = tmp_path / "distilled"
    code = main(["--model", "tiny", "--device", str(tiny_loaded_once.vlm.device), "--data", str(data), "--distill",
                 str(cache), "--lm-weight", "0.1", "--steps", "2", "--batch-size", "3", "--eval-every", "1",
                 "--out", str(out)])
    assert code == 0
    log = json.loads((out / "train_log.json").read_text())
    assert [entry["step"] for entry in log] == [0, 1, 2]
    for entry in log:  # 4 items with a map: 3 trained, 1 held out; no box anywhere, so no box loss or hits
        assert {"distill", "teacher_top64", "teacher_top64/docvqa"} <= entry.keys()
        assert "loss" not in entry and not any(key.startswith("hits/") for key in entry)
        assert 0.0 <= entry["teacher_top64"] <= 1.0 and entry["distill"] > 0
    card = (out / "README.md").read_text()
    assert '"box_weight": 0.0' in card and '"distill_weight": 1.0' in card and '"lm_weight": 0.1' in card
    weights = load_file(out / "model.safetensors")
    assert weights["participatory.states.guide.4.weight"].abs().sum() > 0  # the state scorer was trained


def test_the_box_weight_defaults_to_zero_with_distill_and_distill_needs_data_and_maps(tmp_path, capsys):
    cache = teacher_cache(tmp_path / "teacher", ["0"])
    assert parse_args(["--out", str(tmp_path / "a")]).box_weight == 1.0
    cfg = parse_args(["--data", "some/set", "--distill", str(cache), "--out", str(tmp_path / "b")])
    assert cfg.box_weight == 0.0 and cfg.distill_weight == 1.0
    assert parse_args(["--data", "s", "--distill", str(cache), "--box-weight", "0.5",
                       "--out", str(tmp_path / "c")]).box_weight == 0.5
    for argv, message in ((["--distill", str(cache)], "needs --data"),
                          (["--data", "s", "--distill", str(tmp_path)], "holds no teacher's maps"),
                          (["--data", "s", "--distill", str(cache), "--distill-weight", "0"], "nothing would be trained")):
        with pytest.raises(SystemExit) as e:
            parse_args([*argv, "--out", str(tmp_path / "d")])
        assert e.value.code == 2 and message in capsys.readouterr().err
