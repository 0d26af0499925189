"""
The Gradio app end to end: `python app.py --model tiny` on a free port, driven through gradio_client.
Each tab's API, streaming, 10 concurrent requests, and every bad input answered with a clear error
while the app stays up. Also the app helpers in arr_coc/app/ui.py that need no server.

    .venv/bin/python -m pytest tests/test_app.py -q
"""

import json
import logging
import math
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image
from safetensors.torch import save_file

from arr_coc.app import ui, viz
from arr_coc.errors import OutOfMemory
from arr_coc.model import ARRCOCQwen
from arr_coc.relevance.config import ARRCOCConfig
from arr_coc.relevance.layer import ARRCOCLayer
from arr_coc.vlm.tiny import tiny_config
from arr_coc.vlm.views import make_views

ROOT = Path(__file__).resolve().parents[1]
CAT = str(ROOT / "assets" / "chelsea.png")
STREET = str(ROOT / "assets" / "synth_street_sign.png")  # 2400x900: a non-square native grid
QUESTION = "What colour are the cat's eyes?"
TOKENS = 4  # new tokens per answer: enough to see streaming, cheap on a CPU
CELLS = 4096  # the max cells control's default


# ----------------------------------------------------------------------------- the server


@pytest.fixture
def client(app_url) -> Client:
    return Client(app_url, verbose=False)


def stats(table: dict) -> dict:
    """A stats Dataframe as the client returns it -> {metric: value}."""
    assert table["headers"] == ui.STATS_HEADERS
    return dict(table["data"])


def compare(client: Client, image=CAT, question=QUESTION, baseline="gestalt", tokens=TOKENS, strategy="topk",
            max_cells=CELLS, numbered=viz.TOP_LABELS, refixate=0.0):
    return client.predict(handle_file(image), question, baseline, tokens, strategy, max_cells, numbered, refixate,
                          api_name="/compare")


def mosaic_size(k: int) -> tuple[int, int]:
    """The size of a saccade mosaic of k 28 px cells (ceil(sqrt(k)) columns)."""
    cols, tile, gap = math.ceil(math.sqrt(k)), 28 * viz.MOSAIC_SCALE, viz.MOSAIC_GAP
    rows = math.ceil(k / cols)
    return cols * tile + (cols + 1) * gap, rows * tile + (rows + 1) * gap


def save_checkpoint(folder: Path, **config) -> list[str]:
    """An ARR layer for the tiny model (or as `config` says) saved as config.json + model.safetensors."""
    config.setdefault("hidden_size", tiny_config().text_config.hidden_size)
    ARRCOCLayer(ARRCOCConfig(**config)).save_pretrained(folder)
    return [str(folder / "config.json"), str(folder / "model.safetensors")]


# ----------------------------------------------------------------------------- the tabs


@pytest.mark.parametrize("model, family, cell", [("tiny-qwen2.5-vl", "Qwen2.5-VL", 28), ("tiny-qwen3-vl", "Qwen3-VL", 32)])
def test_the_app_serves_every_family(tmp_path, model, family, cell):
    from conftest import serve_app

    with serve_app(tmp_path / "app.log", "--model", model) as url:  # the last --model wins
        config = json.load(urllib.request.urlopen(f"{url}/config", timeout=10))
        markdown = " ".join(c["props"].get("value") or "" for c in config["components"] if c["type"] == "markdown")
        assert f"Model `{model}` ({family}, {cell} px cells)" in markdown
        out = Client(url, verbose=False).predict(handle_file(CAT), QUESTION, "full", 2, "topk", CELLS, 5,
                                                 api_name="/compare")
    status, arr = out[0], stats(out[4])
    assert status.startswith("Done in")
    assert arr["visual tokens: saccade"] == 273 and arr["candidate grid"].endswith("px)")
    rows, cols = (int(v) for v in arr["candidate grid"].split(" cells")[0].split(" x "))
    width, height = (int(v) for v in arr["candidate grid"].split("(")[1].split(" px")[0].split(" x "))
    assert (width, height) == (cols * cell, rows * cell)  # the family's own cell size


def test_page_says_the_tiny_models_answers_are_meaningless(app_url):
    config = json.load(urllib.request.urlopen(f"{app_url}/config", timeout=10))
    markdown = [c["props"].get("value") or "" for c in config["components"] if c["type"] == "markdown"]
    assert any("answers are meaningless" in text and "maps" in text for text in markdown)


@pytest.mark.parametrize("stop, event", [("compare-stop", "compare"), ("ab-stop", "ab")])
def test_stop_buttons_cancel_the_running_event(app_url, stop, event):
    config = json.load(urllib.request.urlopen(f"{app_url}/config", timeout=10))
    ids = {c["props"].get("elem_id"): c["id"] for c in config["components"]}
    deps = {dep.get("id", i): dep for i, dep in enumerate(config["dependencies"])}
    (running,) = [i for i, dep in deps.items() if dep.get("api_name") == event]
    on_stop = [dep for dep in deps.values() if [ids[stop], "click"] in [list(t) for t in dep["targets"]]]
    assert on_stop and {c for dep in on_stop for c in dep["cancels"]} == {running}  # gradio may add a helper event


def test_compare_streams_baseline_then_arr_and_reports_stats(client):
    job = client.submit(handle_file(CAT), QUESTION, "full", TOKENS, "topk", CELLS, viz.TOP_LABELS,
                        api_name="/compare")
    final = job.result(timeout=120)
    updates = job.outputs()
    # streaming: the baseline's text grows while ARR's is empty, then ARR's grows
    baseline_partial = [u for u in updates if u[1] and not u[3] and u[0].startswith("Running the **full**")]
    arr_partial = [u for u in updates if u[3] and u[0].startswith("Running **ARR-COC**")]
    assert baseline_partial and arr_partial
    assert updates.index(baseline_partial[-1]) < updates.index(arr_partial[0])

    status, base_text, base_stats, arr_text, arr_stats, heatmap, gestalt, weights, mosaic, base_cells = final
    assert status.startswith("Done in") and base_text and arr_text and base_cells is None  # full keeps every cell
    views = make_views(Image.open(CAT))
    base, arr = stats(base_stats), stats(arr_stats)
    gh, gw = views.gestalt_grid
    nh, nw = views.native_grid
    assert base["visual tokens: total"] == nh * nw  # full: the native view
    assert (arr["visual tokens: gestalt"], arr["visual tokens: saccade"], arr["visual tokens: total"]) == \
        (gh * gw, 273, gh * gw + 273)
    for s in (base, arr):
        assert s["image"] == "451 x 300 px" and s["native grid (full)"] == ui.grid_text(views.native_grid, views.cell)
        assert 1 <= s["new tokens"] <= TOKENS and s["peak memory MB"] > 0
        assert s["total ms"] >= s["prefill ms"] + s["decode ms"] > 0
        rate = (s["new tokens"] - 1) / s["decode ms"] * 1000 if s["decode ms"] else 0.0  # the first comes from prefill
        assert s["tokens/s (decode)"] == pytest.approx(rate, rel=0.05, abs=0.5)
        assert s["TTFT ms"] == pytest.approx(s["vision ms"] + s["selection ms"] + s["prefill ms"], abs=0.2)
    assert arr["candidate grid"] == ui.grid_text(views.candidate_grid, views.cell) and "candidate grid" not in base
    assert arr["selection ms"] > 0 and base["selection ms"] == 0  # the baselines select nothing
    assert Image.open(heatmap).size == viz.canvas_size(*views.image.size)
    assert Image.open(gestalt).size == views.gestalt.size
    assert Image.open(weights).width > Image.open(weights).height
    assert Image.open(mosaic).size == mosaic_size(273)


def test_max_cells_caps_both_pipelines_and_numbers_redraw(client):
    status, _, base_stats, _, arr_stats, heatmap, _, _, mosaic, _ = compare(
        client, image=STREET, baseline="full", tokens=1, max_cells=2048, numbered=0)
    views = make_views(Image.open(STREET), max_cells=2048)
    base, arr = stats(base_stats), stats(arr_stats)
    nh, nw = views.native_grid
    assert nh * nw <= 2048 and nw > 2 * nh  # the wide image keeps its aspect under the smaller cap
    assert base["visual tokens: total"] == nh * nw and arr["visual tokens: saccade"] == 273
    assert arr["candidate grid"] == ui.grid_text(views.candidate_grid, views.cell) and arr["image"] == "2400 x 900 px"
    assert Image.open(heatmap).size == viz.canvas_size(2400, 900) == (2048, 768)
    # the numbered saccades redraw from the kept answer, without the VLM
    renumbered, remosaic = client.predict(30, api_name="/redraw")
    assert Image.open(renumbered).size == Image.open(heatmap).size
    assert not np.array_equal(np.asarray(Image.open(renumbered)), np.asarray(Image.open(heatmap)))
    assert not np.array_equal(np.asarray(Image.open(remosaic)), np.asarray(Image.open(mosaic)))


def test_microscope_then_reselect_without_the_vlm(client):
    channels, scorers, heatmap, summary, saccades, mosaic = client.predict(
        handle_file(CAT), QUESTION, "topk", 273, CELLS, viz.TOP_LABELS, api_name="/microscope")
    grid = make_views(Image.open(CAT)).candidate_grid
    assert summary.startswith(f"**273 saccades** · strategy `topk` · {grid[0]}×{grid[1]}")
    rows = saccades["data"]
    assert [r[0] for r in rows] == list(range(1, 274))
    scores = [r[3] for r in rows]
    assert scores == sorted(scores, reverse=True)  # most relevant first
    assert Image.open(heatmap).size == viz.canvas_size(*Image.open(CAT).size)
    assert Image.open(channels).height > 300 and Image.open(scorers).width > 3 * Image.open(scorers).height
    assert Image.open(mosaic).size == mosaic_size(273)

    heatmap, summary, fewer, mosaic = client.predict("topk", 50, 5, api_name="/reselect")  # no VLM work: the kept scene
    assert re.search(r"drawn in \d+ ms", summary)
    assert summary.startswith("**50 saccades**")
    assert fewer["data"] == rows[:50]  # top-k of 50 is the head of top-k of 273
    assert Image.open(mosaic).size == mosaic_size(50)
    _, summary, spread, _ = client.predict("grid", 50, 5, api_name="/reselect")
    assert summary.startswith("**50 saccades** · strategy `grid`")
    assert {tuple(r[1:3]) for r in spread["data"]} != {tuple(r[1:3]) for r in fewer["data"]}


def test_the_microscope_draws_a_reducers_kept_cells_over_the_relevance(client):
    _, _, heatmap, *_ = client.predict(handle_file(CAT), QUESTION, "topk", 60, CELLS, 0, api_name="/microscope")
    drawing = client.predict(handle_file(CAT), QUESTION, "visionzip", 60, CELLS, api_name="/kept_cells")
    assert Image.open(drawing).width == Image.open(heatmap).width  # the heatmap's canvas, a legend under it
    assert client.predict(handle_file(CAT), QUESTION, "none", 60, CELLS, api_name="/kept_cells") is None


def test_faithfulness_curves_of_arrs_answer_or_a_typed_one(client):
    curves, summary = client.predict(handle_file(CAT), QUESTION, "", "topk", 40, CELLS, api_name="/faithfulness")
    assert Image.open(curves).width > 300
    assert re.search(r"Answer scored: \*\*'.*'\*\* · 40 saccades, 11 points per curve", summary)
    assert all(f"| {name} | -" in summary for name in ("deletion", "random", "insertion"))  # log-likelihoods < 0
    _, typed = client.predict(handle_file(CAT), QUESTION, "  green  ", "topk", 40, CELLS, api_name="/faithfulness")
    assert "Answer scored: **'green'**" in typed


def test_microscope_states_a_fallback_in_words(client, tmp_path):
    flat = tmp_path / "flat.png"
    Image.new("RGB", (300, 300), (128, 128, 128)).save(flat)
    *_, summary, _, _ = client.predict(handle_file(str(flat)), "What is here?", "topk", 273, CELLS, 0,
                                       api_name="/microscope")
    assert "semantic void: the relevance map is flat, so the saccades fall back to an even grid" in summary


def test_ab_same_layer_agrees_and_a_different_one_does_not(client, tmp_path):
    prior_files = save_checkpoint(tmp_path / "prior")  # a fresh layer is exactly the prior
    heat_a, heat_b, diff, text_a, text_b, summary = client.predict(
        handle_file(CAT), QUESTION, ui.PRIOR, [handle_file(f) for f in prior_files], ui.PRIOR, None, "topk", TOKENS,
        CELLS, api_name="/ab")
    assert "IoU of the selected cells) | 1.000 |" in summary and "(Spearman) | 1.000 |" in summary
    assert "| answers | agree |" in summary and text_a == text_b
    assert Image.open(heat_a).size == Image.open(heat_b).size == viz.canvas_size(*Image.open(CAT).size)
    gh, gw = make_views(Image.open(CAT)).candidate_grid
    width, height = viz.canvas_size(gw, gh)
    assert Image.open(diff).width == width and Image.open(diff).height > height  # the legend strip below the grid

    other_files = save_checkpoint(tmp_path / "other", prior_weights=[0.9, 0.9, 0.05])
    *_, summary = client.predict(handle_file(CAT), QUESTION, ui.PRIOR, None, ui.PRIOR,
                                 [handle_file(f) for f in other_files], "topk", TOKENS, CELLS, api_name="/ab")
    iou = float(re.search(r"IoU of the selected cells\) \| ([\d.]+)", summary).group(1))
    rho = float(re.search(r"\(Spearman\) \| (-?[\d.]+)", summary).group(1))
    assert 0 <= iou < 1 and rho < 1


def test_ten_concurrent_compares_all_complete(app_url):
    questions = [f"Question {i}: what is in the picture?" for i in range(10)]
    with ThreadPoolExecutor(10) as pool:  # ten users at once: the queue runs them one by one
        results = list(pool.map(lambda q: compare(Client(app_url, verbose=False), question=q, tokens=2), questions))
    for status, _, _, _, arr_stats, heatmap, _, _, _, _ in results:
        assert status.startswith("Done in") and stats(arr_stats)["visual tokens: saccade"] == 273
        assert Path(heatmap).is_file()


@pytest.mark.parametrize("mode", ["L", "RGBA", "I;16", "P-animated", "1x1"])
def test_odd_images_are_answered(client, tmp_path, mode):
    path = tmp_path / ("image.gif" if mode == "P-animated" else "image.png")
    if mode == "P-animated":
        frames = [Image.new("P", (64, 48), i) for i in range(3)]
        frames[0].save(path, save_all=True, append_images=frames[1:])
    elif mode == "I;16":
        Image.fromarray((torch.rand(48, 64) * 65535).numpy().astype("uint16")).save(path)
    elif mode == "1x1":
        Image.new("RGB", (1, 1), (200, 10, 10)).save(path)
    else:
        Image.open(CAT).convert(mode).save(path)
    status, *_, arr_stats, heatmap, _, _, _, _ = compare(client, image=str(path), tokens=1)
    assert status.startswith("Done in") and stats(arr_stats)["visual tokens: saccade"] == 273


# ----------------------------------------------------------------------------- bad inputs


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> dict[str, Path]:
    """Files no request should accept: a text file, a cut-off PNG, a 72-megapixel image, bad checkpoints."""
    folder = tmp_path_factory.mktemp("bad")
    files = {name: folder / name for name in ("notes.txt", "cut.png", "huge.png", "weights.pt")}
    files["notes.txt"].write_text("not an image")
    files["cut.png"].write_bytes(Path(CAT).read_bytes()[:4000])
    Image.new("1", (9000, 8000)).save(files["huge.png"])  # 1-bit: quick to write, 72 MP to decode
    files["weights.pt"].write_bytes(b"\x80\x04")
    for name in ("pickle", "foreign", "other_model"):
        files[name] = folder / name
        save_checkpoint(files[name], **({"hidden_size": 1536} if name == "other_model" else {}))
    torch.save({"w": torch.zeros(2)}, files["pickle"] / "model.safetensors")  # a pickle under the safetensors name
    save_file({"w": torch.zeros(3)}, files["foreign"] / "model.safetensors")  # safetensors of the wrong tensors
    return files


def checkpoint_upload(folder: Path) -> list:
    return [handle_file(folder / "config.json"), handle_file(folder / "model.safetensors")]


def ab_args(files_a=None, files_b=None) -> tuple:
    return handle_file(CAT), QUESTION, ui.PRIOR, files_a, ui.PRIOR, files_b, "topk", 1, CELLS


BAD_INPUTS = {  # case: (endpoint, its arguments from the bad files, the message the user must see)
    "no image": ("/compare", lambda b: (None, QUESTION, "gestalt", 1, "topk", CELLS, 0),
                 "no image: upload an image first"),
    "empty question": ("/compare", lambda b: (handle_file(CAT), "  ", "gestalt", 1, "topk", CELLS, 0),
                       "the question is empty"),
    "long question": ("/compare", lambda b: (handle_file(CAT), "why? " * 1000, "gestalt", 1, "topk", CELLS, 0),
                      "the limit is 4000"),
    "text file": ("/compare", lambda b: (handle_file(b["notes.txt"]), QUESTION, "gestalt", 1, "topk", CELLS, 0),
                  "notes.txt is not an image"),
    "truncated image": ("/compare", lambda b: (handle_file(b["cut.png"]), QUESTION, "gestalt", 1, "topk", CELLS, 0),
                        "cut.png could not be decoded as an image"),
    "huge image": ("/microscope", lambda b: (handle_file(b["huge.png"]), QUESTION, "topk", 273, CELLS, 0),
                   "huge.png is too large (9000x8000 pixels); the limit is 64 megapixels"),
    "microscope without image": ("/microscope", lambda b: (None, QUESTION, "topk", 273, CELLS, 0), "no image"),
    "re-select before analysing": ("/reselect", lambda b: ("topk", 50, 0), "Analyse an image first"),
    "faithfulness without image": ("/faithfulness", lambda b: (None, QUESTION, "", "topk", 273, CELLS), "no image"),
    "faithfulness without question": ("/faithfulness", lambda b: (handle_file(CAT), " ", "", "topk", 273, CELLS),
                                      "the question is empty"),
    "pickle checkpoint": ("/ab", lambda b: ab_args(files_a=checkpoint_upload(b["pickle"])),
                          "checkpoint A: uploaded/model.safetensors is a pickle/torch.save file"),
    "foreign safetensors": ("/ab", lambda b: ab_args(files_b=checkpoint_upload(b["foreign"])),
                            "checkpoint B: uploaded/model.safetensors does not fit an ARR-COC layer"),
    "checkpoint of another model": ("/ab", lambda b: ab_args(files_a=checkpoint_upload(b["other_model"])),
                                    "trained for hidden size 1536, but the loaded model has hidden size 64"),
    "config without weights": ("/ab", lambda b: ab_args(files_a=[handle_file(b["pickle"] / "config.json")]),
                               "upload exactly config.json and model.safetensors; got config.json"),
    "torch.save file": ("/ab", lambda b: ab_args(files_a=[handle_file(b["weights.pt"])]), "Invalid file type"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gets_a_clear_error(app_url, bad, case):
    endpoint, args, message = BAD_INPUTS[case]
    with pytest.raises(AppError, match=re.escape(message)):
        Client(app_url, verbose=False).predict(*args(bad), api_name=endpoint)  # a fresh session: no scene


def test_the_app_still_answers_after_bad_inputs(client):
    status, *_, arr_stats, _, _, _, _, _ = compare(client, tokens=1)
    assert status.startswith("Done in") and stats(arr_stats)["visual tokens: saccade"] == 273


# ----------------------------------------------------------------------------- helpers without a server


def test_errors_reach_the_user_with_their_message():
    @ui.reports_errors
    def streams():
        yield "partial"
        raise OutOfMemory("CUDA ran out of memory in the arr pipeline")

    @ui.reports_errors
    def breaks():
        raise KeyError("lost")

    with pytest.raises(gr.Error) as oom:
        list(streams())
    assert oom.value.message == "CUDA ran out of memory in the arr pipeline"
    with pytest.raises(gr.Error) as unexpected:
        breaks()
    assert unexpected.value.message.startswith("Unexpected error (KeyError: 'lost'). The app is still running")


def test_default_checkpoint_is_the_first_that_fits_the_model(arr_model, tmp_path):
    model = ARRCOCQwen(arr_model.vlm)  # its own layer over the shared VLM
    assert ui.install_default_layer(model, None, tmp_path) == (ui.PRIOR, None)
    save_checkpoint(tmp_path / "a_other_model", hidden_size=1536)
    save_checkpoint(tmp_path / "b_fits", prior_weights=[0.1, 0.2, 0.7])
    assert ui.install_default_layer(model, None, tmp_path) == ("b_fits", None)
    assert model.layer.config.prior_weights == [0.1, 0.2, 0.7]
    name, notice = ui.install_default_layer(model, "a_other_model", tmp_path)
    assert name == ui.PRIOR and "'a_other_model' could not be loaded" in notice and "hidden size 1536" in notice
    assert ui.checkpoint_choices(tmp_path) == [ui.PRIOR, "a_other_model", "b_fits"]


def test_answers_agree_up_to_case_spacing_and_end_punctuation():
    assert ui.answers_agree("A  teaspoon.", "a teaspoon")
    assert not ui.answers_agree("a teaspoon", "a fork")


# ----------------------------------------------------------------------------- the console and start-up


def test_the_console_logs_one_line_per_user_error(app_url, app_log, bad):
    client = Client(app_url, verbose=False)
    before = app_log.read_text()
    for case in ("empty question", "text file", "re-select before analysing", "torch.save file"):
        endpoint, args, _ = BAD_INPUTS[case]
        with pytest.raises(AppError):
            client.predict(*args(bad), api_name=endpoint)
    new = app_log.read_text()[len(before):]
    errors = [line.split("user error: ", 1)[1] for line in new.splitlines() if "user error: " in line]
    assert "Traceback" not in new and len(errors) == 4, new  # one line each, no traceback
    assert errors[0].startswith("the question is empty") and errors[1].startswith("notes.txt is not an image")
    assert errors[2].startswith("Analyse an image first") and errors[3].startswith("Invalid file type")


def test_the_console_says_what_start_up_does(app_log):
    log = app_log.read_text()
    assert "loading the model tiny" in log and "Running the offline tiny model" in log and "serving" in log
    assert log.index("loading the model tiny") < log.index("serving")


def test_start_up_says_when_it_falls_back_to_the_offline_model(caplog, tmp_path):
    import argparse

    import app

    with caplog.at_level(logging.INFO, logger="arr_coc.app"):
        model, _, notices = app.load(argparse.Namespace(model=str(tmp_path / "no-model"), checkpoint=None))
    assert f"loading the model {tmp_path / 'no-model'}" in caplog.text
    assert "Running pocket-qwen2-vl" in caplog.text and notices and model.vlm.name == "pocket"


def test_help_answers_before_gradio_and_torch_load():
    code = ("import runpy, sys\nsys.argv = ['app.py', '--help']\ntry:\n    runpy.run_path('app.py', run_name='__main__')\n"
            "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules, 'gradio' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "usage: app.py" in proc.stdout and "--checkpoint" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "exit 0 False False"


def test_a_bad_flag_is_one_line_pointing_to_help():
    proc = subprocess.run([sys.executable, "app.py", "--bogus"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["app.py: error: unrecognized arguments: --bogus (see app.py --help)"]


def test_peak_memory_is_a_number_or_says_it_is_not_available():
    assert ui.memory_text(1306.4) == 1306
    assert ui.memory_text(float("nan")) == "n/a on CPU"  # never a number that means something else
