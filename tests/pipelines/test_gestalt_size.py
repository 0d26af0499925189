"""
The gestalt's size as a request's setting (Request.gestalt_tokens, --gestalt-tokens of run, evaluate and bench):
the views' gestalt grid, what ARR, its no-gestalt ablation, the gestalt baseline and the reducers at ARR's count
read (tiny Qwen2-VL, random weights: the counts are real), and its refusals (one line at parse time, InputError in
a request).

    .venv/bin/python -m pytest -q tests/pipelines/test_gestalt_size.py
"""

from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from arr_coc import bench, evaluate, run
from arr_coc.errors import InputError
from arr_coc.pipelines.steps import views_of
from arr_coc.settings import PipelineConfig

PAGE = Image.new("RGB", (1792, 1792), (200, 190, 180))  # 64 x 64 cells of 28 px
QUESTION = "What is written here?"
RUN = ["--image", "assets/chelsea.png", "--question", "hi"]  # the flags run requires
BENCH = ["--model", "tiny", "--device", "cpu"]


def test_a_576_token_gestalt_of_a_1792_page_is_24_by_24():
    """Q-Zoom's coarse pass: 576 = 24 x 24 merged tokens, a 672 px view; the candidate grid stays the native 64 x 64."""
    parts = SimpleNamespace(vlm=SimpleNamespace(device=torch.device("cpu"), cell=28, min_pixels=None),
                            pipeline=PipelineConfig())
    views = views_of(parts, PAGE, gestalt_tokens=576)
    assert (views.gestalt_grid, views.candidate_grid) == ((24, 24), (64, 64))
    assert tuple(views.tensor("gestalt").shape) == (1, 3, 672, 672)
    assert views_of(parts, PAGE).gestalt_grid == (16, 16)  # the default, 256
    assert PipelineConfig(gestalt_max_tokens=576).gestalt_max_tokens == 576  # the settings' bound is max_cells // 4


@pytest.mark.parametrize("pipeline, settings, gestalt, total", [
    ("arr", {}, 576, 640),  # the gestalt's 576 + 64 saccades
    ("arr", {"ablation": "no-gestalt"}, 0, 640),  # no gestalt: its 576 tokens read as saccades instead
    ("gestalt", {}, 576, 576),  # the gestalt baseline reads the same 24 x 24 view
    ("divprune", {}, 0, 640),  # a reducer at ARR's count: 576 + 64 of the 4096 native tokens
    ("budget", {}, 0, 625),  # the budget view sized to ARR's 640: 25 x 25 (26 x 26 = 676 is over)
])
def test_every_pipeline_reads_the_gestalt_the_request_names(arr_model, pipeline, settings, gestalt, total):
    a = arr_model.answer(PAGE, QUESTION, pipeline, max_new_tokens=1, budget=64, gestalt_tokens=576, **settings)
    assert (a.tokens.gestalt, a.tokens.total_visual) == (gestalt, total)
    assert a.views.gestalt_grid == (24, 24)


def test_a_gestalt_over_a_quarter_of_the_cells_is_refused_in_a_request(arr_model):
    with pytest.raises(InputError, match=r"gestalt_tokens must be between 1 and max_cells // 4 = 1024, got 1025"):
        arr_model.answer(PAGE, QUESTION, "arr", max_new_tokens=1, gestalt_tokens=1025)
    with pytest.raises(InputError, match=r"between 1 and max_cells // 4 = 256, got 576"):
        arr_model.answer(PAGE, QUESTION, "full", max_new_tokens=1, gestalt_tokens=576, max_cells=1024)
    with pytest.raises(InputError, match=r"between 1 and max_cells // 4 = 1024, got 0"):
        arr_model.views(PAGE, gestalt_tokens=0)


@pytest.mark.parametrize("parse, argv", [(run.parse_args, RUN), (evaluate.parse_args, []),
                                         (bench.parse_args, BENCH)])
def test_run_evaluate_and_bench_refuse_a_gestalt_out_of_range_at_parse_time(parse, argv, capsys):
    assert parse([*argv, "--gestalt-tokens", "576"]).gestalt_tokens == 576
    assert parse(argv).gestalt_tokens == 256
    for flags, message in ((["--gestalt-tokens", "1025"], "1025 exceeds --max-cells / 4 = 1024"),
                           (["--gestalt-tokens", "300", "--max-cells", "1024"], "300 exceeds --max-cells / 4 = 256"),
                           (["--gestalt-tokens", "0"], "must be between 1 and 4096, got 0")):
        with pytest.raises(SystemExit) as exit:
            parse([*argv, *flags])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit.value.code == 2 and len(err) == 1, err
        assert f"argument --gestalt-tokens: {message}" in err[0], err[0]


def test_a_request_of_the_flags_carries_the_gestalt():
    from arr_coc.commands import cli

    assert cli.request(evaluate.parse_args(["--gestalt-tokens", "576"])).gestalt_tokens == 576
