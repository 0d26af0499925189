"""
The Gradio app end to end: `python app.py --model tiny` on a free port, driven through gradio_client.
Each tab's API, streaming, 10 concurrent requests, and every bad input answered with a clear error
while the app stays up. Also the app helpers in arr_coc/app/ui.py that need no server.

    .venv/bin/python -m pytest tests/test_app.py -q
"""

import html
import io
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gradio as gr
import httpx
import numpy as np
import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image
from safetensors.torch import save_file
from conftest import giant_png, text_bomb_png

from arr_coc import viz
from arr_coc.app import ui
from arr_coc.errors import OutOfMemory
from arr_coc.model import ARRCOCQwen
from arr_coc.relevance.config import ARRCOCConfig
from arr_coc.relevance.layer import ARRCOCLayer, CheckpointError, list_checkpoints
from arr_coc.vlm.tiny import tiny_config
from arr_coc.vlm.views import make_views

ROOT = Path(__file__).resolve().parents[1]
CAT_FOLDER = Path(tempfile.mkdtemp(prefix="arr_coc_test_app_"))  # the cat at twice its size, written once
CAT = str(CAT_FOLDER / "chelsea_902x600.png")  # 21x32 native cells (tiny) > 247 + 273: ARR chooses its saccades (the
# 451x300 original holds 176, which ARR reads whole, as full does)
Image.open(ROOT / "assets" / "chelsea.png").resize((902, 600)).save(CAT)
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


def mosaic_size(k: int, numbered: int = viz.TOP_LABELS) -> tuple[int, int]:
    """The size of a saccade mosaic of k 28 px cells (ceil(sqrt(k)) columns), the rows with numbered tiles each with
    its 26 px band of rank numbers above (0.28 of an 84 px tile, + 2)."""
    cols, tile, gap = math.ceil(math.sqrt(k)), 28 * viz.MOSAIC_SCALE, viz.MOSAIC_GAP
    rows, banded = math.ceil(k / cols), math.ceil(min(k, numbered) / cols)
    return cols * tile + (cols + 1) * gap, rows * tile + (rows + 1) * gap + 26 * banded


def with_key(size: tuple[int, int]) -> tuple[int, int]:
    """A heatmap's size: its canvas and the key's strip below (viz.with_key), 55 px under a 768 px wide canvas, 62 px
    under a 902 px one (the cat) and 142 px under a 2048 px one."""
    return size[0], size[1] + {768: 55, 902: 62, 2048: 142}[size[0]]


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


def test_every_api_output_has_a_name(client):
    """gradio_client names each output by its component's label; an unlabelled one comes out as value_<id>."""
    endpoints = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert [r["label"] for r in endpoints["/faithfulness"]["returns"]] == ["Faithfulness curves", "Summary"]
    assert endpoints["/converse"]["returns"][0]["label"] == "Status"
    unnamed = [(name, r["label"]) for name, e in endpoints.items() for r in e["returns"] if r["label"].startswith("value_")]
    assert not unnamed


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
        assert s["image"] == "902 x 600 px" and s["native grid (full)"] == ui.grid_text(views.native_grid, views.cell)
        assert 1 <= s["new tokens"] <= TOKENS and s["peak memory MB"] > 0
        assert s["total ms"] >= s["prefill ms"] + s["decode ms"] > 0
        rate = (s["new tokens"] - 1) / s["decode ms"] * 1000 if s["decode ms"] else 0.0  # the first comes from prefill
        assert s["tokens/s (decode)"] == pytest.approx(rate, rel=0.05, abs=0.5)
        assert s["TTFT ms"] == pytest.approx(s["vision ms"] + s["selection ms"] + s["prefill ms"], abs=0.2)
    assert arr["candidate grid"] == ui.grid_text(views.candidate_grid, views.cell) and "candidate grid" not in base
    assert arr["selection ms"] > 0 and base["selection ms"] == 0  # the baselines select nothing
    assert Image.open(heatmap).size == with_key(viz.canvas_size(*views.image.size))
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
    assert Image.open(heatmap).size == with_key(viz.canvas_size(2400, 900)) == (2048, 768 + 142)
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
    assert Image.open(heatmap).size == with_key(viz.canvas_size(*Image.open(CAT).size)) == (902, 600 + 62)
    assert Image.open(channels).height > 300 and Image.open(scorers).width > 3 * Image.open(scorers).height
    assert Image.open(mosaic).size == mosaic_size(273)

    heatmap, summary, fewer, mosaic = client.predict("topk", 50, 5, api_name="/reselect")  # no VLM work: the kept scene
    assert re.search(r"drawn in \d+ ms", summary)
    assert summary.startswith("**50 saccades**")
    assert [r[:4] for r in fewer["data"]] == [r[:4] for r in rows[:50]]  # top-k of 50 is the head of top-k of 273,
    assert sorted(r[4] for r in fewer["data"]) == list(range(1, 51))  # fed row by row: each its place among the 50
    assert Image.open(mosaic).size == mosaic_size(50, numbered=5)
    _, summary, spread, _ = client.predict("grid", 50, 5, api_name="/reselect")
    assert summary.startswith("**50 saccades** · strategy `grid`")
    assert {tuple(r[1:3]) for r in spread["data"]} != {tuple(r[1:3]) for r in fewer["data"]}


def test_a_three_turn_conversation_then_a_new_image(client):
    """Three questions about one image through the API: a row a turn, ARR prefilling only its new block and
    question after turn 1, the conversation growing; fresh cells make every follow-up's saccades all new; New
    image clears it, and the next question is a turn 1 again."""
    questions = [QUESTION, "And its nose?", "Where is it?"]
    for turn, q in enumerate(questions, start=1):
        status, turns, heatmap, moved = client.predict(handle_file(CAT), q, "full", 2, 40, True, 5,
                                                       api_name="/converse")
        assert status.startswith(f"Turn {turn}: ARR prefilled") and Image.open(heatmap).width > 300
        assert (moved is None) == (turn == 1)
    assert turns["headers"] == ui.TURN_HEADERS
    rows = turns["data"]
    assert [r[0] for r in rows] == [1, 2, 3] and [r[1] for r in rows] == questions
    prefilled, context = [r[7] for r in rows], [r[9] for r in rows]
    assert prefilled[1] < prefilled[0] and context[0] < context[1] < context[2]
    assert rows[1][10] == "40 / 0 / 40" and rows[2][10] == "40 / 0 / 40"  # fresh cells: each turn's all new
    status, turns, heatmap, moved = client.predict(api_name="/new_conversation")
    assert turns["data"] == [] and heatmap is None and status.startswith("A new conversation")
    status, turns, _, moved = client.predict(handle_file(CAT), QUESTION, "full", 2, 40, False, 5, api_name="/converse")
    assert status.startswith("Turn 1:") and [r[0] for r in turns["data"]] == [1] and moved is None
    with pytest.raises(AppError, match="this conversation's baseline is full: press New image"):
        client.predict(handle_file(CAT), QUESTION, "gestalt", 2, 40, False, 5, api_name="/converse")
    status, turns, _, _ = client.predict(handle_file(STREET), QUESTION, "full", 2, 40, False, 5, api_name="/converse")
    assert status.startswith("Turn 1:")  # another image in the box: a new conversation


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
    assert Image.open(heat_a).size == Image.open(heat_b).size == (902, 600 + 62)  # the cat's canvas, and its key
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
    small = mode not in ("L", "RGBA")  # 64x48 px or 1x1: a 2x2 native view, which ARR reads whole, as full does
    assert status.startswith("Done in") and stats(arr_stats)["visual tokens: saccade"] == (0 if small else 273)
    assert ("ARR read the image whole" in status) == small


# ----------------------------------------------------------------------------- bad inputs


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> dict[str, Path]:
    """Files no request should accept: a text file, a cut-off PNG, a 72-megapixel image, a 400-megapixel PNG header,
    bad checkpoints."""
    folder = tmp_path_factory.mktemp("bad")
    files = {name: folder / name for name in ("notes.txt", "cut.png", "huge.png", "giant.png", "weights.pt")}
    files["notes.txt"].write_text("not an image")
    files["cut.png"].write_bytes(Path(CAT).read_bytes()[:4000])
    Image.new("1", (9000, 8000)).save(files["huge.png"])  # 1-bit: quick to write, 72 MP to decode
    giant_png(files["giant.png"])  # a 400 MP header, past PIL's own limit
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
    "giant image": ("/compare", lambda b: (handle_file(b["giant.png"]), QUESTION, "gestalt", 1, "topk", CELLS, 0),
                    "giant.png is too large (over 178 megapixels); the limit is 64 megapixels"),
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
                                    "checkpoint A: checkpoint uploaded was made for an unnamed model ('qwen2_vl', "
                                    "hidden size 1536), but the loaded model is tiny ('qwen2_vl', hidden size 64)"),
    "config without weights": ("/ab", lambda b: ab_args(files_a=[handle_file(b["pickle"] / "config.json")]),
                               "upload exactly config.json and model.safetensors; got config.json"),
    "torch.save file": ("/ab", lambda b: ab_args(files_a=[handle_file(b["weights.pt"])]), "Invalid file type"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gets_a_clear_error(app_url, bad, case):
    endpoint, args, message = BAD_INPUTS[case]
    with pytest.raises(AppError, match=re.escape(message)):
        Client(app_url, verbose=False).predict(*args(bad), api_name=endpoint)  # a fresh session: no scene


# ----------------------------------------------------------------------------- hostile uploads


def sideways_jpeg(path: Path, size: tuple[int, int]) -> Path:
    """A grey JPEG stored `size` (w, h) with EXIF orientation 6 (rotate 90 to view): gradio's own preprocess
    would decode and turn it, at full size, before any check of ours."""
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    Image.new("L", size, 128).save(path, exif=exif)
    return path


def checkpoint_with(folder: Path, **fields) -> list:
    """The tiny model's layer, saved, its config.json then edited as a hostile upload would: as handle_files."""
    files = save_checkpoint(folder)
    config = json.loads(Path(files[0]).read_text())
    Path(files[0]).write_text(json.dumps({**config, **fields}))
    return [handle_file(f) for f in files]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, Path]:
    """The issue's probes: a sideways 72-megapixel JPEG, PNGs whose text inflates to 500 MB."""
    folder = tmp_path_factory.mktemp("hostile")
    return {"sideways.jpg": sideways_jpeg(folder / "sideways.jpg", (9000, 8000)),
            "bomb.png": text_bomb_png(folder / "bomb.png"),
            "late-bomb.png": text_bomb_png(folder / "late-bomb.png", before_pixels=False)}


@pytest.mark.parametrize("fields, message", [
    ({"balancer_hidden": 15_000_000}, "checkpoint A: uploaded/config.json: balancer_hidden must be in [1, 1024], "
                                      "got 15000000"),
    ({"prior_weights": "x"}, "checkpoint A: uploaded/config.json: prior_weights must be a list of 3 numbers in "
                             "[0, 1], got 'x'"),
    ({"prior_weights": "xyz"}, "prior_weights must be a list of 3 numbers in [0, 1], got 'xyz'"),
    ({"hidden_size": "64"}, "hidden_size must be an integer in [1, 16384], got '64'"),
])
def test_a_hostile_config_is_refused_by_field_before_the_layer_is_built(app_url, tmp_path, fields, message):
    """Item 8: a config.json's sizes and types are checked before anything is built from them (the 350-byte
    upload with balancer_hidden 15000000 took 8 GB and the shared queue for 18 s)."""
    start = time.monotonic()
    with pytest.raises(AppError) as refused:
        Client(app_url, verbose=False).predict(*ab_args(files_a=checkpoint_with(tmp_path, **fields)), api_name="/ab")
    assert message in str(refused.value) and "Unexpected error" not in str(refused.value)
    assert time.monotonic() - start < 30  # no layer of 15 million units was built: a CPU takes minutes


@pytest.mark.parametrize("endpoint", ["/compare", "/microscope"])
def test_a_sideways_huge_jpeg_is_refused_from_its_header(app_url, hostile, endpoint):
    """Item 9: the pixel limit is checked on the file's header, before gradio or PIL decodes and turns it by its
    EXIF orientation: the message gives the size as stored (9000x8000), not as turned (8000x9000)."""
    args = {"/compare": (QUESTION, "gestalt", 1, "topk", CELLS, 0), "/microscope": (QUESTION, "topk", 273, CELLS, 0)}
    with pytest.raises(AppError, match=re.escape("sideways.jpg is too large (9000x8000 pixels); the limit is 64 "
                                                 "megapixels")):
        Client(app_url, verbose=False).predict(handle_file(hostile["sideways.jpg"]), *args[endpoint],
                                               api_name=endpoint)


@pytest.mark.parametrize("name", ["bomb.png", "late-bomb.png"])
def test_a_png_whose_text_inflates_to_500_mb_gets_one_clear_line(app_url, app_log, hostile, name):
    """Item 10: a decompression bomb in a PNG's metadata is refused in one line naming the file, not the
    server's temporary path, and the console logs one line, no traceback."""
    before = app_log.read_text()
    with pytest.raises(AppError) as refused:
        Client(app_url, verbose=False).predict(handle_file(hostile[name]), QUESTION, "gestalt", 1, "topk", CELLS, 0,
                                               api_name="/compare")
    message = str(refused.value)
    assert f"{name} could not be decoded as an image (a compressed metadata chunk inflates past the 1 MB PIL " \
           "reads: a decompression bomb)" in message
    assert "Could not preprocess" not in message and "/tmp" not in message and "gradio" not in message
    new = app_log.read_text()[len(before):]
    assert "Traceback" not in new and new.count("user error: ") == 1, new


def test_an_upload_over_the_size_limit_is_refused(app_url, tmp_path):
    """Item 11: the server refuses an upload over ui.MAX_UPLOAD_MB itself (HTTP 413), not only a polite client."""
    client = Client(app_url, verbose=False)
    assert client.config["max_file_size"] == ui.MAX_UPLOAD_MB << 20
    big = tmp_path / "big.png"
    with open(big, "wb") as f:
        f.truncate((ui.MAX_UPLOAD_MB << 20) + 1)  # sparse: no 50 MB written to disk
    with open(big, "rb") as f:  # as a client that skips the size check would send it
        response = httpx.post(client.upload_url, files=[("files", ("big.png", f))], timeout=60)
    assert response.status_code == 413
    with pytest.raises(ValueError, match="exceeds the maximum file size"):
        compare(client, image=str(big))


def test_the_upload_cache_is_cleaned_while_serving_and_at_shutdown(tmp_path):
    """Item 11: uploads and drawings leave gradio's cache (GRADIO_TEMP_DIR) --cache-age seconds after they were
    written, and all of them when the server stops (SIGTERM); the examples stay."""
    from conftest import serve_app

    cache = tmp_path / "cache"

    def cached() -> list[str]:
        examples = {Path(e["image"]).name for e in json.loads((ROOT / "assets" / "examples.json").read_text())}
        return sorted(p.name for p in cache.rglob("*") if p.is_file() and p.name not in examples)

    upload = tmp_path / "upload.png"  # a name no example has
    upload.write_bytes(Path(CAT).read_bytes())
    with serve_app(tmp_path / "app.log", "--cache-age", "10", env={"GRADIO_TEMP_DIR": str(cache)}) as url:
        client = Client(url, verbose=False, download_files=str(tmp_path / "downloads"))
        assert compare(client, image=str(upload), tokens=1)[0].startswith("Done in")
        assert cached()  # the drawings, just written (and the upload, unless the request took over 10 s)
        deadline = time.monotonic() + 60
        while cached() and time.monotonic() < deadline:  # the schedule: every 10 s, what is older than 10 s
            time.sleep(1)
        assert cached() == []
        with open(upload, "rb") as f:  # an upload a second old when the server stops
            assert httpx.post(client.upload_url, files=[("files", ("late.png", f))], timeout=60).is_success
        assert cached() == ["late.png"]
    assert cached() == []  # the server stopped: its files went with it


def test_the_app_still_answers_after_bad_inputs(client):
    status, *_, arr_stats, _, _, _, _, _ = compare(client, tokens=1)
    assert status.startswith("Done in") and stats(arr_stats)["visual tokens: saccade"] == 273


# ----------------------------------------------------------------------------- helpers without a server


def test_an_upload_is_not_decoded_before_its_header_passes_the_pixel_limit(upload_folder, monkeypatch):
    """The image input's preprocess reads the header first: a sideways JPEG over the limit is refused with no
    decode and no EXIF turn (gradio's "pil" preprocess did both, 0.5 GB for a 13000x13000 photo)."""
    from gradio.data_classes import ImageData
    from PIL import ImageFile, ImageOps

    component = ui.image_input(label="Image")
    assert component.type == "filepath" and component.preprocess is ui.read_upload
    path = sideways_jpeg(upload_folder / "upload.jpg", (300, 200))
    decoded = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self, load=ImageFile.ImageFile.load: decoded.append(
        "load") or load(self))
    monkeypatch.setattr(ImageOps, "exif_transpose", lambda image, turn=ImageOps.exif_transpose, **kw: decoded.append(
        "turn") or turn(image, **kw))
    monkeypatch.setattr(ui, "MAX_IMAGE_PIXELS", 300 * 200 - 1)
    with pytest.raises(gr.Error, match=re.escape("photo.jpg is too large (300x200 pixels)")):
        component.preprocess(ImageData(path=str(path), orig_name="photo.jpg"))
    assert decoded == []
    monkeypatch.setattr(ui, "MAX_IMAGE_PIXELS", 64_000_000)
    assert component.preprocess(ImageData(path=str(path), orig_name="photo.jpg")).size == (200, 300)  # upright
    assert decoded and component.preprocess(None) is None


def test_an_inline_data_url_upload_is_read_with_the_same_checks(upload_folder):
    """A client may send the image inline (a data: URL): gradio would decode and turn it in full; ours reads its
    header first, as for a file, and a broken one is one line naming no server path."""
    import base64

    from gradio.data_classes import ImageData

    def data_url(raw: bytes) -> str:
        return "data:image/png;base64," + base64.b64encode(raw).decode()

    buffer = io.BytesIO()
    Image.new("1", (9000, 8000)).save(buffer, format="PNG")
    with pytest.raises(gr.Error, match=re.escape("the image is too large (9000x8000 pixels)")):
        ui.read_upload(ImageData(path=None, url=data_url(buffer.getvalue())))
    assert ui.read_upload(ImageData(path=None, url=data_url(Path(CAT).read_bytes()), orig_name="cat.png")).size == \
        (902, 600)
    with pytest.raises(gr.Error, match=r"cat.png could not be decoded as an image \(") as broken:
        ui.read_upload(ImageData(path=str(upload_folder / "gone.png"), orig_name="cat.png"))  # cleaned from the cache
    assert str(upload_folder) not in broken.value.message


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


def test_default_checkpoint_is_the_first_that_fits_the_model_and_passed_the_rule(arr_model, tmp_path):
    from dataclasses import asdict

    from arr_coc import checkpoints

    model = ARRCOCQwen(arr_model.vlm)  # its own layer over the shared VLM
    assert ui.install_default_layer(model, None, tmp_path) == (ui.PRIOR, None)
    save_checkpoint(tmp_path / "a_other_model", hidden_size=1536)
    save_checkpoint(tmp_path / "b_fits", prior_weights=[0.1, 0.2, 0.7])
    assert ui.install_default_layer(model, None, tmp_path) == (ui.PRIOR, None)  # no evidence: the prior
    (tmp_path / "b_fits" / checkpoints.EVIDENCE_FILE).write_text(json.dumps(dict(  # issue 61's rule, passed
        rule=asdict(checkpoints.RULE), files=checkpoints.file_digests(tmp_path / "b_fits"), verdict=dict(passes=True))))
    assert ui.install_default_layer(model, None, tmp_path) == ("b_fits", None)
    assert model.layer.config.prior_weights == [0.1, 0.2, 0.7]
    name, notice = ui.install_default_layer(model, "a_other_model", tmp_path)
    assert name == ui.PRIOR and "'a_other_model' could not be loaded" in notice and "hidden size 1536" in notice
    assert ui.checkpoint_choices(tmp_path, model) == [ui.PRIOR, "b_fits"]  # only what fits is offered


def test_a_checkpoint_of_another_model_is_not_offered_and_its_refusal_names_both_models(arr_model):
    """Item 7: the A/B offers the shipped checkpoints made for the loaded model, and they load; the others (the
    pocket model's, under the tiny model) are not offered, and loading one names both models."""
    model, root = ARRCOCQwen(arr_model.vlm), ROOT / "checkpoints"
    offered = ui.checkpoint_choices(root, model)
    others = [name for name in list_checkpoints(root) if name not in offered]
    assert offered[0] == ui.PRIOR and "pocket-fineprint" in others
    for name in offered[1:]:
        model.load_layer(str(root / name))
    for name in others:
        refusal = (rf"^checkpoint {name} was made for \S+ \('qwen2_vl', hidden size \d+\), but the loaded model "
                   r"is tiny \('qwen2_vl', hidden size 64\)$")
        with pytest.raises(CheckpointError, match=refusal):
            model.load_layer(str(root / name))
    with pytest.raises(CheckpointError, match=re.escape("was made for pocket ('qwen2_vl', hidden size 256), but")):
        model.load_layer(str(root / "pocket-fineprint"))


def test_the_ab_dropdowns_offer_only_checkpoints_made_for_the_loaded_model(app_url, arr_model):
    """Item 7: the served page's two A/B dropdowns hold the prior and the checkpoints that load on its model."""
    config = json.load(urllib.request.urlopen(f"{app_url}/config", timeout=10))
    offered = {c["props"]["label"]: [choice[1] for choice in c["props"]["choices"]] for c in config["components"]
               if c["type"] == "dropdown" and c["props"].get("label", "").startswith("Checkpoint ")}
    fitting = ui.checkpoint_choices(ROOT / "checkpoints", ARRCOCQwen(arr_model.vlm))
    assert offered == {"Checkpoint A": fitting, "Checkpoint B": fitting} and "pocket-fineprint" not in fitting


def test_the_examples_that_answer_offline_come_first_with_their_answers(app_url):
    """Item 16: the pocket pages lead the examples, labelled with the answer the offline pocket model gives; every
    other example (the photos, the synthetic scenes) says it means something only with real Qwen-VL weights."""
    path = ROOT / "assets" / "examples.json"
    entries, labels = json.loads(path.read_text()), ui.example_labels(path)
    offline = [e["image"].startswith(ui.POCKET_EXAMPLE) for e in entries]
    assert any(offline) and offline == sorted(offline, reverse=True)  # the pocket pages, then the rest
    for entry, label, pocket in zip(entries, labels, offline):
        expected = entry["note"].split("Expected answer:")[1].strip().rstrip(".")
        assert label == (f"{entry['question']} → {expected} (answers offline: the pocket model)" if pocket else
                         f"{entry['question']} · meaningful only with real Qwen-VL weights")
    config = json.load(urllib.request.urlopen(f"{app_url}/config", timeout=10))
    shown = [[html.unescape(row[1]) for row in c["props"]["samples"]] for c in config["components"]
             if c["type"] == "dataset"]
    assert shown == [labels] * 4  # in every tab, beside each image's thumbnail (row[0])


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


@pytest.mark.parametrize("port, why", [("-1", "must be between 1 and 65535, got -1"),
                                       ("70000", "must be between 1 and 65535, got 70000"),
                                       ("taken", "{port} is in use on 127.0.0.1")])
def test_a_bad_or_taken_port_is_refused_in_one_line_before_anything_loads(port, why):
    import socket

    with socket.socket() as taken:  # a server already listening there
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        number = str(taken.getsockname()[1])
        proc = subprocess.run([sys.executable, "app.py", "--port", number if port == "taken" else port], cwd=ROOT,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"app.py: error: argument --port: {why.format(port=number)} (see app.py --help)"]


def test_peak_memory_is_a_number_or_says_it_is_not_available():
    assert ui.memory_text(1306.4) == 1306
    assert ui.memory_text(float("nan")) == "n/a on CPU"  # never a number that means something else
