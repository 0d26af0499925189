"""`python -m arr_coc.run`: the table, the JSON, the PNGs, and exit code 2 with one line on bad input."""

import json
import subprocess
import sys

import pytest
from PIL import Image
from conftest import giant_png, text_bomb_png

from arr_coc.errors import InputError
from arr_coc.run import load_image, main

pytestmark = pytest.mark.usefixtures("tiny_loaded_once")  # the commands share the session's tiny model

QUESTION = "What colour are the cat's eyes?"
PAGE = "assets/hubble_deep_field.jpg"  # 1000x872 px: 31x36 native cells, more than ARR reads (15x17 gestalt + 273),
# so ARR chooses its saccades (the cat's 11x16 it reads whole, as full does: tests/pipelines/test_reads_native.py)


def test_run_measures_faithfulness_of_arrs_answer_or_a_given_one(tmp_path, capsys):
    args = ["--model", "tiny", "--image", PAGE, "--question", QUESTION, "--max-new-tokens", "3",
            "--pipelines", "arr", "--faithfulness", "--faithfulness-steps", "2", "--budget", "30"]
    assert main([*args, "--json", str(tmp_path / "own.json"), "--save-dir", str(tmp_path / "png")]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "own.json").read_text())
    curves = report["faithfulness"]
    assert curves["answer"] == report["pipelines"]["arr"]["answer"]  # ARR's own answer, by default
    assert curves["counts"] == [0, 15, 30] and f"deletion {curves['areas']['deletion']:.4f}" in printed
    assert Image.open(tmp_path / "png" / "faithfulness.png").size[0] > 300
    assert main([*args, "--answer", "green", "--json", str(tmp_path / "given.json")]) == 0
    assert json.loads((tmp_path / "given.json").read_text())["faithfulness"]["answer"] == "green"
    with pytest.raises(SystemExit) as e:
        main([*args[:-4], "--pipelines", "full", "--faithfulness"])
    assert e.value.code == 2 and "--faithfulness: needs the arr pipeline" in capsys.readouterr().err


def test_run_writes_json_for_every_pipeline(tmp_path, capsys):
    out = tmp_path / "run.json"
    code = main(["--model", "tiny", "--image", PAGE, "--question", QUESTION, "--max-new-tokens", "2",
                 "--json", str(out), "--pipelines", "arr,full,gestalt,budget,fastv", "--strategy", "logpolar"])
    assert code == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in ("arr", "full", "gestalt", "budget", "fastv"))
    report = json.loads(out.read_text())
    assert report["model"] == "tiny" and report["question"] == QUESTION and report["max_cells"] == 4096
    assert report["checkpoint"] == "prior (untrained)"  # the default rule: no shipped layer's evidence passes
    assert "answers are meaningless" in report["notice"]
    assert set(report["versions"]) == {"torch", "transformers", "arr_coc"} and all(report["versions"].values())
    results = report["pipelines"]
    assert list(results) == ["arr", "full", "gestalt", "budget", "fastv"]
    visual = {name: results[name]["tokens"]["total_visual"] for name in ("fastv", "arr", "full")}
    assert visual["fastv"] == min(visual["arr"], visual["full"])  # ARR's count, capped by the view's own tokens
    for entry in results.values():
        assert set(entry) >= {"answer", "tokens", "timings_ms", "peak_memory_mb"}
        assert set(entry["tokens"]) == {"gestalt", "saccade", "text", "total_visual"}
    arr = results["arr"]
    assert arr["tokens"]["saccade"] == 273 and len(arr["saccades"]) == 273 and arr["strategy"] == "logpolar"
    first = arr["saccades"][0]
    assert set(first) == {"rank", "row", "col", "score", "box", "round"} and first["rank"] == 1 and first["round"] == 1
    assert "refixation" not in arr and 0 <= arr["confidence"] <= 1  # the second look is off by default
    w, h = Image.open(PAGE).size
    assert all(0 <= s["box"][0] < s["box"][2] <= w and 0 <= s["box"][1] < s["box"][3] <= h for s in arr["saccades"])
    assert arr["grid"] == [31, 36] and len(arr["weights"]) == 3 and "fallback" in arr  # the native grid


def test_run_adds_a_row_per_ablation_at_the_same_budget(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["--model", "tiny", "--image", PAGE, "--question", QUESTION, "--max-new-tokens", "1",
                 "--pipelines", "arr", "--ablations", "fixed-weights,no-gestalt", "--json", str(out)]) == 0
    assert "arr-fixed-weights" in capsys.readouterr().out
    results = json.loads(out.read_text())["pipelines"]
    assert list(results) == ["arr", "arr-fixed-weights", "arr-no-gestalt"]
    assert results["arr"]["ablation"] is None and results["arr-fixed-weights"]["weights"] == [0.2, 0.2, 0.6]
    gestalt = results["arr"]["tokens"]["gestalt"]
    assert results["arr-no-gestalt"]["tokens"]["saccade"] == 273 + gestalt
    assert results["arr-no-gestalt"]["tokens"]["gestalt"] == 0
    assert {r["tokens"]["total_visual"] for r in results.values()} == {273 + gestalt}


def test_run_prints_and_records_the_tensions_and_the_adaptive_budget(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["--model", "tiny", "--image", PAGE, "--question", QUESTION, "--max-new-tokens", "1",
                 "--pipelines", "arr", "--ablations", "explore", "--budget", "auto", "--min-budget", "30",
                 "--max-budget", "90", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())["pipelines"]
    tensions = results["arr"]["tensions"]
    assert tensions["auto_budget"] and 30 <= tensions["budget"] <= 90 and tensions["explore"] == 0
    assert results["arr"]["tokens"]["saccade"] == tensions["budget"]
    assert results["arr-explore"]["tensions"]["explore"] == 0.25
    assert f"arr tensions: explore e=0.000, diversify lambda=0.000, K={tensions['budget']} (auto" in printed
    assert "arr-explore tensions: explore e=0.250" in printed
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--image", "assets/chelsea.png", "--question", "q", "--min-budget", "50",
              "--max-budget", "40"])
    assert "--min-budget: 50 exceeds --max-budget 40" in capsys.readouterr().err


def test_run_saves_the_microscope_pngs(tmp_path):
    code = main(["--model", "tiny", "--image", "assets/synth_chart.png", "--question", "What is the Kiwis value?",
                 "--pipelines", "arr", "--max-new-tokens", "1", "--save-dir", str(tmp_path / "png")])
    assert code == 0
    names = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert names == ["channels.png", "heatmap.png", "mosaic.png", "scorers.png"]
    assert Image.open(tmp_path / "png" / "heatmap.png").size[0] > 200


def test_run_prints_and_records_a_second_look(tmp_path, capsys):
    """--refixate 1 always fires (no answer is certain), --refixate 0 never: the line and the JSON say so, with
    both confidences and both answers; the baseline rows have no second look."""
    args = ["--model", "tiny", "--image", PAGE, "--question", QUESTION, "--max-new-tokens", "2",
            "--pipelines", "arr,gestalt", "--budget", "40"]
    assert main([*args, "--refixate", "1", "--refixate-budget", "25", "--json", str(tmp_path / "on.json"),
                 "--save-dir", str(tmp_path / "on")]) == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "on.json").read_text())["pipelines"]
    r = results["arr"]["refixation"]
    assert r["tau"] == 1.0 and r["fired"] is True and r["saccades"] == [40, 25] and len(r["answers"]) == 2
    assert len(r["confidences"]) == 2 and len(r["timings_ms"]) == 2 and results["arr"]["tokens"]["saccade"] == 65
    assert f"arr: confidence {r['confidences'][0]:.4f} < tau 1.0: a second look of 25 saccades (prior)" in printed
    assert r["guide"] == "prior"
    assert {s["round"] for s in results["arr"]["saccades"]} == {1, 2} and "refixation" not in results["gestalt"]
    assert main([*args, "--refixate", "0", "--json", str(tmp_path / "off.json"), "--save-dir", str(tmp_path / "off")]) == 0
    assert ">= tau 0.0: no second look" in capsys.readouterr().out
    heatmaps = [Image.open(tmp_path / look / "heatmap.png") for look in ("on", "off")]
    assert heatmaps[0].height > heatmaps[1].height  # the second look's legend: its boxes are green
    r = json.loads((tmp_path / "off.json").read_text())["pipelines"]["arr"]["refixation"]
    assert r["fired"] is False and len(r["answers"]) == 1 and r["saccades"] == [40]
    with pytest.raises(SystemExit) as e:
        main([*args, "--refixate-budget", "25"])
    assert e.value.code == 2 and "only used with --refixate" in capsys.readouterr().err
    for wrong, why in ((["--refixate-guide", "attention"], "--refixate-guide: only used with --refixate"),
                       (["--refixate", "1", "--refixate-guide", "gaze"], "unknown 'gaze'; choose from prior, attention")):
        with pytest.raises(SystemExit) as e:
            main([*args, *wrong])
        assert e.value.code == 2 and why in capsys.readouterr().err


def test_several_questions_are_one_conversation_with_a_json_entry_per_turn(tmp_path, capsys):
    args = ["--model", "tiny", "--image", PAGE, "--question", QUESTION, "--question", "And its nose?",
            "--question", "Where is it?", "--max-new-tokens", "2", "--budget", "30", "--fresh-cells"]
    assert main([*args, "--json", str(tmp_path / "chat.json"), "--save-dir", str(tmp_path / "png")]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "chat.json").read_text())
    assert report["questions"] == [QUESTION, "And its nose?", "Where is it?"] and report["fresh_cells"] is True
    turns = report["turns"]
    assert [t["question"] for t in turns] == report["questions"] and "pipelines" not in report
    assert list(turns[0]["pipelines"]) == ["arr", "full", "gestalt", "budget", "divprune", "visionzip", "pixelprune",
                                           "pixelprune_n"]  # no fastv
    arr = [t["pipelines"]["arr"] for t in turns]
    assert [a["conversation"]["turn"] for a in arr] == [1, 2, 3]
    cells = [{(s["row"], s["col"]) for s in a["saccades"]} for a in arr]
    assert [len(c) for c in cells] == [30, 30, 30] and not cells[0] & cells[1] and not cells[2] & (cells[0] | cells[1])
    assert arr[1]["tokens"]["gestalt"] == 0 and turns[1]["pipelines"]["full"]["tokens"]["total_visual"] == 0
    assert "turn 3: 'Where is it?'" in printed and f"{arr[2]['conversation']['prefilled']} tokens prefilled" in printed
    assert (tmp_path / "png" / "turn-3" / "moves.png").is_file() and not (tmp_path / "png" / "turn-1" / "moves.png").exists()


@pytest.mark.parametrize("flags, message", [
    (["--fresh-cells"], "--fresh-cells: only used with several --question"),
    (["--question", "Why?", "--pipelines", "arr,fastv"], "--pipelines: not with several --question (a conversation): fastv"),
    (["--question", "Why?", "--refixate", "0.5"], "--refixate: not with several --question"),
    (["--question", "Why?", "--faithfulness"], "--faithfulness: not with several --question"),
])
def test_a_conversation_flag_that_cannot_work_is_refused_at_parse_time(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", "tiny", "--image", "assets/chelsea.png", "--question", QUESTION, *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [  # a missing image, or a file that is none, is refused at parse time
    (["--image", "{cut}", "--question", "hi"], "cut.png as an image (OSError: image file is truncated"),
    (["--image", "assets/chelsea.png", "--question", "hi", "--checkpoint", "assets"], "config.json"),
])
def test_bad_input_exits_2_with_one_line(capsys, args, message, tmp_path):
    cut = tmp_path / "cut.png"  # a PNG cut short: its header passes, its pixels do not decode
    data = open("assets/chelsea.png", "rb").read()
    cut.write_bytes(data[:len(data) // 2])
    assert main(["--model", "tiny", *(a.format(cut=cut) for a in args)]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # progress lines first, then the reason
    assert message in err[-1] and err[-1].startswith("error: ") and not any("Traceback" in line for line in err)


def test_a_shipped_checkpoint_is_found_by_name_and_the_notice_is_printed(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["--model", "tiny", "--image", "assets/chelsea.png", "--question", QUESTION, "--pipelines", "arr",
                 "--max-new-tokens", "1", "--checkpoint", "tiny-text-vs-distractor", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert "loading tiny on" in err and "loaded " in err and "note: Running the offline tiny" in err
    assert json.loads(out.read_text())["checkpoint"] == "tiny-text-vs-distractor"


def test_load_image_applies_the_exif_orientation(tmp_path):
    """A photo stored 300x200 with orientation 6 (rotate 90) is 200x300 upright, as the app receives it."""
    path = tmp_path / "sideways.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    Image.new("RGB", (300, 200), (200, 30, 30)).save(path, exif=exif)
    assert Image.open(path).size == (300, 200)
    assert load_image(str(path)).size == (200, 300)


def test_a_png_whose_text_inflates_past_pils_limit_exits_2_with_one_line(tmp_path, capsys):
    """A zTXt chunk after the pixels (so the header passes --image's check) inflating to 64 MB: PIL's ValueError
    was a traceback; it is one line naming the file and what is wrong, before the model loads."""
    text_bomb_png(tmp_path / "bomb.png", 64 << 20, before_pixels=False)
    assert main(["--model", "tiny", "--image", str(tmp_path / "bomb.png"), "--question", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: cannot read {tmp_path / 'bomb.png'} as an image (OSError: a compressed metadata chunk "
                   "inflates past the 1 MB PIL reads: a decompression bomb)"]


def test_a_png_whose_text_inflates_before_its_pixels_is_refused_at_parse_time(tmp_path, capsys):
    """The same bomb before the pixels: PIL meets it reading the header, so --image refuses it, in one line."""
    text_bomb_png(tmp_path / "bomb.png", 64 << 20, before_pixels=True)
    with pytest.raises(SystemExit) as stop:
        main(["--model", "tiny", "--image", str(tmp_path / "bomb.png"), "--question", "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1
    assert f"argument --image: cannot read {tmp_path / 'bomb.png'} as an image (ValueError: " in err[0]


def test_an_image_over_the_apps_64_megapixels_is_refused_from_its_header(tmp_path, capsys):
    """Issue 54 item 7: a 13000x13000 image (169 megapixels, under PIL's own 179) that the app refuses ran in `run`
    at a 6 GB peak. --image refuses it from its header, before the model loads, and load_image does too."""
    giant = giant_png(tmp_path / "giant.png", 13000, 13000)
    with pytest.raises(SystemExit) as stop:
        main(["--model", "tiny", "--image", str(giant), "--question", "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1
    assert (f"argument --image: {giant} is too large (13000x13000 pixels); the limit is 64 megapixels, as in the app: "
            "downscale it first") in err[0]
    with pytest.raises(InputError, match=r"too large \(13000x13000 pixels\); the limit is 64 megapixels"):
        load_image(str(giant))


def test_a_fifo_as_the_image_is_refused_unread(tmp_path, capsys):
    """Issue 54 item 8: `run --image <a fifo>` hung, waiting for a writer. It is refused in one line, unread."""
    import os

    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as stop:
        main(["--model", "tiny", "--image", str(fifo), "--question", "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1
    assert f"argument --image: {fifo} is not a regular file (a fifo, a socket or a device)" in err[0]


@pytest.mark.parametrize("flags, reason", [
    (["--image", "nowhere.png"], "argument --image: no such image: nowhere.png"),
    (["--image", "assets"], "argument --image: assets is a folder, not a file"),
    (["--image", "assets/chelsea.png", "--device", "tpu"], "argument --device: unknown device 'tpu'"),
    (["--image", "assets/chelsea.png", "--json", "assets"], "argument --json: assets is a folder"),
])
def test_a_bad_path_or_device_is_one_line_before_the_model_loads(flags, reason):
    proc = subprocess.run([sys.executable, "-m", "arr_coc.run", "--model", "tiny", *flags, "--question", "hi"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()  # one: no "loading tiny" line before it, no traceback
    assert len(lines) == 1 and lines[0].startswith(f"python -m arr_coc.run: error: {reason}"), lines
    assert lines[0].endswith("(see python -m arr_coc.run --help)")


def test_faithfulness_answer_is_plain_text_and_capped_before_the_model_loads(tmp_path, capsys):
    args = ["--model", "tiny", "--image", PAGE, "--question", QUESTION, "--max-new-tokens", "2",
            "--pipelines", "arr", "--faithfulness", "--faithfulness-steps", "1", "--budget", "10"]
    assert main([*args, "--answer", "a <|image_pad|> b", "--json", str(tmp_path / "pad.json")]) == 0
    assert json.loads((tmp_path / "pad.json").read_text())["faithfulness"]["answer"] == "a <|image_pad|> b"
    capsys.readouterr()
    assert main([*args, "--answer", "x" * 1001]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["error: the answer to score is 1001 characters long; the limit is 1000"]


# ----------------------------------------------------------------------------- offline: the pocket fallback


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """No hub (its one quick probe gets no answer) and an empty cache; the flags the command sets are put back."""
    import huggingface_hub

    from arr_coc import checkpoints

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # restored after go_offline sets it
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(checkpoints, "hub_answers", lambda endpoint, timeout=checkpoints.HUB_TIMEOUT_S: False)
    return huggingface_hub.constants


def test_offline_the_default_model_falls_back_to_the_pocket_model_at_once(offline_hub, tmp_path, capsys):
    """No --model, no hub, no cache: the pocket model answers, a note says why, the JSON records it; no retries."""
    import time

    start = time.perf_counter()
    assert main(["--image", "assets/chelsea.png", "--question", QUESTION, "--pipelines", "gestalt",
                 "--max-new-tokens", "1", "--json", str(tmp_path / "run.json")]) == 0
    assert time.perf_counter() - start < 20  # the hub's retries alone wait about 35 s
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith("note: Could not load the model 'Qwen/Qwen2-VL-2B-Instruct': the hub (")
    assert "cannot be reached, and it is not in the local cache. Running pocket-qwen2-vl" in notes[0]
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["model"] == report["model_name"] == "pocket" and "pocket-qwen2-vl" in report["notice"]
    assert offline_hub.HF_HUB_OFFLINE  # the process went offline: transformers read the cache alone


@pytest.mark.parametrize("model", ["someone/no-such-vl", "Qwen/Qwen2-VL-2B-Instruct"])
def test_offline_a_hub_model_asked_for_by_name_is_refused_naming_the_way_out(model, offline_hub, capsys):
    """Asked for by name (even the default's), a model the hub cannot give is refused, not swapped, in one line."""
    assert main(["--model", model, "--image", "assets/chelsea.png", "--question", QUESTION]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: cannot load the model '{model}': the hub (") and "not in the local cache" in error
    assert "--model pocket runs the shipped offline model" in error and "HF_HUB_OFFLINE=1" in error


@pytest.mark.parametrize("command", ["arr_coc.run", "arr_coc.evaluate"])
def test_help_names_the_default_model_and_the_pocket_model(command):
    proc = subprocess.run([sys.executable, "-m", command, "--help"], capture_output=True, text=True, timeout=120)
    model_help = " ".join(proc.stdout.partition("\n  --model MODEL")[2].split())[:400]  # its help, not the usage
    assert "'pocket' (the offline model shipped in models/pocket-qwen2-vl" in model_help
    assert "Default: Qwen/Qwen2-VL-2B-Instruct; where the hub cannot be reached and the cache lacks it, the pocket" in model_help


@pytest.mark.parametrize("command, model", [("run", "tiny"), ("run", "pocket"), ("evaluate", "tiny-qwen3-vl")])
def test_a_fastv_layer_the_model_lacks_is_refused_before_it_loads(command, model):
    """Issue 54 item 10: --fastv-layer 99 was refused only after the model loaded. The tiny models' and the pocket
    model's LLMs have 4 layers, known before loading (their recipe, the shipped config.json): K is 1 to 3."""
    flags = ["--image", "assets/chelsea.png", "--question", "hi"] if command == "run" else []
    proc = subprocess.run([sys.executable, "-m", f"arr_coc.{command}", "--model", model, *flags, "--fastv-layer", "99"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"python -m arr_coc.{command}: error: argument --fastv-layer: {model}'s LLM "
                                        "has 4 layers, so FastV's K is between 1 and 3, got 99 (see python -m "
                                        f"arr_coc.{command} --help)"]


def test_the_torch_free_tiny_names_and_depth_are_the_tiny_recipes(arr_model):
    from arr_coc import settings
    from arr_coc.vlm.tiny import TINY_MODELS

    assert settings.TINY_NAMES == tuple(TINY_MODELS) and settings.TINY_LLM_LAYERS == 4
    assert len(arr_model.vlm.language_model.layers) == settings.TINY_LLM_LAYERS
