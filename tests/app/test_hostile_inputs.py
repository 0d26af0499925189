"""
Hostile input, each answered as the user's mistake it is (issue 54 item 8): one clear line (a gr.Error that names
it, exit 2 in the commands), never "Unexpected error" and a traceback.

    .venv/bin/python -m pytest tests/app/test_hostile_inputs.py -q
"""

import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest
from PIL import EpsImagePlugin, Image, UnidentifiedImageError

from arr_coc.app import handlers, ui
from arr_coc.errors import InputError
from arr_coc.eval import data
from arr_coc.relevance.config import ARRCOCConfig
from arr_coc.relevance.layer import ARRCOCLayer, CheckpointError
from arr_coc.vlm import images
from arr_coc.vlm.tiny import tiny_config

ROOT = Path(__file__).resolve().parents[2]
CAT = Image.open(ROOT / "assets" / "chelsea.png")
QUESTION = "What colour are the cat's eyes?"


def last(events) -> tuple:
    """A streaming handler's last output; its gr.Error, raised."""
    out = None
    for out in events:
        pass
    return out


def refusal(run) -> str:
    """The message of the gr.Error that run() raises (the user's toast)."""
    with pytest.raises(gr.Error) as refused:
        run()
    return refused.value.message


def test_a_lone_surrogate_in_a_question_is_one_line_in_the_app(arr_model):
    assert refusal(lambda: last(handlers.compare(arr_model, CAT, "What\ud800?", "gestalt", 1, "topk", 4096, 5))) == (
        "the question is not valid text: a lone surrogate (U+D800) at character 5")
    with pytest.raises(InputError, match=r"lone surrogate \(U\+DCFF\) at character 1"):
        arr_model.answer(CAT, "\udcff", "gestalt", max_new_tokens=1)


def test_a_question_of_bytes_that_are_no_utf8_is_refused_at_parse_time():
    """A shell passes such bytes on; Python's argv holds them as lone surrogates."""
    proc = subprocess.run([sys.executable, "-m", "arr_coc.run", "--model", "tiny", "--image", "assets/chelsea.png",
                           "--question", b"\xff"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["python -m arr_coc.run: error: argument --question: the question is not valid "
                                        "text: a lone surrogate (U+DCFF) at character 1 (see python -m arr_coc.run "
                                        "--help)"]


def uploaded_checkpoint(folder: Path, config_json: str | None = None, **config) -> list[str]:
    """A tiny-model checkpoint (as `config` says), its config.json replaced by `config_json` if given."""
    ARRCOCLayer(ARRCOCConfig(hidden_size=tiny_config().text_config.hidden_size, **config)).save_pretrained(folder)
    if config_json is not None:
        (folder / "config.json").write_text(config_json)
    return [str(folder / "config.json"), str(folder / "model.safetensors")]


@pytest.mark.parametrize("config_json, message", [
    ('{"base_model_family": "qwen2_vl", "hidden_size": 1' + "0" * 5000 + "}",
     "uploaded/config.json is not valid JSON: Exceeds the limit (4300 digits) for integer string conversion: value "
     "has 5001 digits"),
    ("[" * 100_000 + "]" * 100_000, "uploaded/config.json is not a usable config: its JSON nests too deep"),
], ids=["5000 digits", "100000 nested ["])
def test_a_hostile_checkpoint_config_is_one_line(arr_model, tmp_path, config_json, message):
    files = uploaded_checkpoint(tmp_path, config_json)
    with pytest.raises(CheckpointError) as refused:
        ui.load_uploaded_layer(arr_model, files)
    assert str(refused.value) == message
    assert refusal(lambda: last(handlers.ab(arr_model, tmp_path, CAT, QUESTION, ui.PRIOR, files, ui.PRIOR, None,
                                            "topk", 1, 4096))) == f"checkpoint A: {message}"


def test_a_checkpoint_whose_budget_no_image_can_give_reads_the_image_whole(arr_model, tmp_path):
    """budget 65536 is a valid config (4x the largest grid), more cells than any native view holds (at most 4096):
    ARR reads the image whole, as full does, and the A/B summary says so for that side (issue 67: ARR never reads
    more than full); before, the 26x38 = 988 candidate cells of the cat refused it."""
    files = uploaded_checkpoint(tmp_path, budget=65536)
    *_, summary = last(handlers.ab(arr_model, tmp_path, CAT, QUESTION, ui.PRIOR, files, ui.PRIOR, None, "topk", 1,
                                   4096))
    assert "read the image whole" in summary and "budget 65536" in summary


def test_converse_caps_the_saccades_at_the_images_cells_as_the_other_tabs_do(arr_model):
    """65536 saccades cut to the cat's 26 x 38 candidate cells: more than its 176 native ones, so ARR reads those
    whole, as full does (a budget of every candidate cell always does: they are at least the native cells)."""
    chat, status, rows, *_ = handlers.converse(arr_model, None, CAT, QUESTION, "full", 1, 65536, False, 5)
    first = chat.arr.answers[0]
    assert status.startswith("Turn 1:")
    assert first.reads_native == "the image holds 176 cells (11x16) <= gestalt 247 + budget 988"
    assert first.tokens.total_visual == 176 and first.saccades == []
    chat, status, *_ = handlers.converse(arr_model, chat, CAT, "And its nose?", "full", 1, 65536, False, 5)
    assert status.startswith("Turn 2:") and chat.arr.answers[1].reads_native == first.reads_native


@pytest.mark.parametrize("out", ["file.txt", "file.txt/sub"])
def test_eval_data_out_under_an_existing_file_is_one_line(tmp_path, capsys, out):
    (tmp_path / "file.txt").write_text("not a folder")
    with pytest.raises(SystemExit) as stop:
        data.main(["--out", str(tmp_path / out), "--n", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1
    assert f"argument --out: {tmp_path / out} cannot be a folder: {tmp_path / 'file.txt'} is a file" in err[0]


def test_an_eps_upload_never_reaches_pils_ghostscript_plugin(upload_folder, monkeypatch):
    """Only the formats the app's message names are opened: an EPS file is no image to it, and PIL's EPS plugin
    (which runs Ghostscript) is never asked."""
    eps = upload_folder / "page.png"
    eps.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n%%EOF\n")
    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", lambda self: pytest.fail("PIL's EPS plugin ran"))
    with pytest.raises(UnidentifiedImageError):
        images.open_image(eps)
    assert refusal(lambda: ui.read_upload(ui.FileData(path=str(eps), orig_name="page.png"))) == (
        "page.png is not an image: upload a PNG, JPEG, WebP, GIF, BMP or TIFF file")


def test_only_a_file_inside_gradios_cache_may_be_opened(arr_model, upload_folder, tmp_path_factory):
    """cached_file (F1): a file in the cache is read; a file outside it, the cache folder itself, a '..' out of it,
    a link in it to a file outside, a URL and no path at all each get the same one line, whatever is there."""
    outside = tmp_path_factory.mktemp("outside")
    Image.new("RGB", (4, 4)).save(outside / "secret.png")
    Image.new("RGB", (4, 4)).save(upload_folder / "upload.png")
    (upload_folder / "link.png").symlink_to(outside / "secret.png")
    assert ui.cached_file(str(upload_folder / "upload.png")) == str((upload_folder / "upload.png").resolve())
    hostile = [str(outside / "secret.png"), str(outside / "gone.png"), str(outside), str(upload_folder),
               str(upload_folder / ".." / outside.name / "secret.png"), str(upload_folder / "link.png"),
               f"file://{outside / 'secret.png'}", "http://127.0.0.1:9/secret.png", "", None, 7]
    assert {refusal(lambda path=path: ui.cached_file(path)) for path in hostile} == {ui.NOT_UPLOADED}
    assert refusal(lambda: ui.read_upload(ui.FileData(path=str(outside / "secret.png")))) == ui.NOT_UPLOADED
    assert refusal(lambda: ui.check_inputs(arr_model, str(outside / "secret.png"), "What is it?")) == ui.NOT_UPLOADED
