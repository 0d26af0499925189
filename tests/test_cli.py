"""
The commands' flags: every bad value is refused at parse time (exit 2, one line naming the flag) before
torch or a model loads; --help is fast; train never overwrites a folder silently; the checkpoint resolver
and the console scripts that pyproject.toml declares.

    .venv/bin/python -m pytest tests/test_cli.py -q
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from arr_coc import bench, checkpoints, evaluate, flags, run, train
from arr_coc.commands import cli
from arr_coc.eval import data
from arr_coc.relevance.layer import choose_checkpoint, default_checkpoint

ROOT = Path(__file__).resolve().parents[1]
RUN = ["--image", "assets/chelsea.png", "--question", "hi"]  # the flags run requires

# (command's parse function, arguments, the flag the error must name)
BAD_FLAGS = [
    (run.parse_args, [*RUN, "--budget", "-1"], "--budget"),
    (run.parse_args, [*RUN, "--budget", "20000"], "--budget"),
    (run.parse_args, [*RUN, "--budget", "2000", "--max-cells", "1024"], "--budget"),
    (run.parse_args, [*RUN, "--budget", "many"], "--budget"),
    (run.parse_args, [*RUN, "--max-new-tokens", "0"], "--max-new-tokens"),
    (run.parse_args, [*RUN, "--max-new-tokens", "5000"], "--max-new-tokens"),
    (run.parse_args, [*RUN, "--max-cells", "1023"], "--max-cells"),
    (run.parse_args, [*RUN, "--max-cells", "16385"], "--max-cells"),
    (run.parse_args, [*RUN, "--pipelines", "arr,magic"], "--pipelines"),
    (run.parse_args, [*RUN, "--pipelines", ","], "--pipelines"),
    (run.parse_args, [*RUN, "--strategy", "best"], "--strategy"),
    (run.parse_args, ["--image", "assets/chelsea.png", "--question", "  "], "--question"),
    (run.parse_args, ["--image", "assets/chelsea.png", "--question", "x" * 5000], "--question"),  # as the empty one
    (train.parse_args, ["--steps", "0"], "--steps"),
    (train.parse_args, ["--batch-size", "-2"], "--batch-size"),
    (train.parse_args, ["--lr", "0"], "--lr"),
    (train.parse_args, ["--lr", "nan"], "--lr"),
    (train.parse_args, ["--temperature", "-1"], "--temperature"),
    (train.parse_args, ["--lm-weight", "-0.1"], "--lm-weight"),
    (train.parse_args, ["--scene-size", "10"], "--scene-size"),
    (train.parse_args, ["--eval-every", "0"], "--eval-every"),
    (train.parse_args, ["--kinds", "text_vs_distractor,bogus"], "--kinds"),
    (evaluate.parse_args, ["--synthetic", "0"], "--synthetic"),
    (evaluate.parse_args, ["--budget", "0"], "--budget"),
    (evaluate.parse_args, ["--max-new-tokens", "0"], "--max-new-tokens"),
    (evaluate.parse_args, ["--max-cells", "100000"], "--max-cells"),
    (evaluate.parse_args, ["--baselines", "full,huge"], "--baselines"),
    (evaluate.parse_args, ["--strategies", "topk,best"], "--strategies"),
    (evaluate.parse_args, ["--kinds", "cats"], "--kinds"),
    (evaluate.parse_args, ["--baselines", "", "--strategies", ""], "--baselines"),
    (evaluate.parse_args, ["--limit", "0"], "--limit"),
    (evaluate.parse_args, ["--limit", "-3"], "--limit"),
    (evaluate.parse_args, ["--metric", "bleu"], "--metric"),
    (evaluate.parse_args, ["--schema", "vqav2"], "--schema"),
    (evaluate.parse_args, ["--faithfulness", "--strategies", ""], "--faithfulness"),
    (evaluate.parse_args, ["--faithfulness-steps", "0"], "--faithfulness-steps"),
    (data.main, ["--out", "unused", "--n", "-1"], "--n"),
    (data.main, ["--out", "unused", "--size", "32"], "--size"),
    (data.main, ["--out", "unused", "--kinds", ""], "--kinds"),
    (bench.parse_args, ["--new-tokens", "0"], "--new-tokens"),
    (bench.parse_args, ["--repeats", "0"], "--repeats"),
    (bench.parse_args, ["--sizes", "448,10"], "--sizes"),
    (bench.parse_args, ["--engines", "fast,turbo"], "--engines"),
    (bench.parse_args, ["--max-cells", "100"], "--max-cells"),
    (bench.parse_args, ["--pipelines", "arr,fast"], "--pipelines"),
]
TINY_BENCH = ["--model", "tiny"]  # bench's flags that pass its CPU check, on any machine
# paths and devices, refused at parse time too, before any model loads: (parse, arguments, flag, reason)
BAD_PATHS = [
    (run.parse_args, ["--image", "nowhere.png", "--question", "hi"], "--image", "no such image: nowhere.png"),
    (run.parse_args, ["--image", "assets", "--question", "hi"], "--image", "assets is a folder, not a file"),
    (run.parse_args, [*RUN, "--json", "assets"], "--json", "assets is a folder"),
    (run.parse_args, [*RUN, "--json", "pyproject.toml/run.json"], "--json",
     "cannot write pyproject.toml/run.json: pyproject.toml is a file"),
    (run.parse_args, [*RUN, "--save-dir", "pyproject.toml"], "--save-dir", "pyproject.toml is a file"),
    (run.parse_args, [*RUN, "--device", "tpu"], "--device", "unknown device 'tpu'"),
    (run.parse_args, [*RUN, "--device", "cuda:first"], "--device", "unknown device 'cuda:first'"),
    (evaluate.parse_args, ["--device", "tpu"], "--device", "unknown device 'tpu'"),
    (evaluate.parse_args, ["--dataset", "/nonexistent"], "--dataset", "/nonexistent does not exist"),
    (evaluate.parse_args, ["--dataset", "assets/chartqa"], "--dataset", "assets/chartqa does not exist"),
    (evaluate.parse_args, ["--out", "pyproject.toml"], "--out", "pyproject.toml is a file"),
    # a relative path with a slash, under no folder here, whose schema cannot be told: named as missing, not a hub id
    (evaluate.parse_args, ["--dataset", "nowhere-xyz/does-not-exist"], "--dataset",
     "nowhere-xyz/does-not-exist does not exist (no such file or folder); for a hub dataset of that id, pass --schema"),
    # an ARR checkpoint is no VLM: --checkpoint takes it (a folder, or a shipped checkpoint's name)
    *((parse, [*argv, "--model", name], "--model", f"{name} is an ARR checkpoint (an ARR layer made for a qwen2_vl "
       f"model of hidden size 256), not a VLM: pass it as --checkpoint {name}, with --model the VLM it was made for")
      for parse, argv in ((run.parse_args, RUN), (evaluate.parse_args, []), (train.parse_args, []))
      for name in ("checkpoints/pocket-fineprint", "pocket-fineprint")),
    (run.parse_args, [*RUN, "--model", "/nonexistent/model"], "--model", "no such model folder: /nonexistent/model"),
    # a folder nothing can be written into is refused before the run, not after it (root too: /proc takes no folder)
    (train.parse_args, ["--out", "/proc/arr-coc/ck"], "--out", "cannot write into /proc/arr-coc/ck: /proc is not writable"),
    (evaluate.parse_args, ["--out", "/proc/arr-coc/ev"], "--out", "cannot write into /proc/arr-coc/ev: /proc is not"),
    (run.parse_args, [*RUN, "--json", "/proc/arr-coc/run.json"], "--json", "cannot write /proc/arr-coc/run.json: /proc"),
    (train.parse_args, ["--device", "tpu"], "--device", "unknown device 'tpu'"),
    (bench.parse_args, [*TINY_BENCH, "--device", "tpu"], "--device", "unknown device 'tpu'"),
    (bench.parse_args, [*TINY_BENCH, "--json", "assets"], "--json", "assets is a folder"),
]


def one_line_refusal(parse, argv, capsys) -> str:
    """The parser's refusal of argv: exit 2 and one line on stderr (no usage block) that points to --help."""
    with pytest.raises(SystemExit) as exit:
        parse(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "usage:" not in err[0], err
    assert err[0].endswith(" --help)"), err[0]
    return err[0]


BUDGET_AUTO = "only used with --budget auto or --ablations auto-budget"
# a flag that needs another, given without it, at its default value too (given on the command line, not told by its
# value: flags.ArgumentParser.given): (parse, arguments, the refusal); before, each was silently ignored
NEEDS_ANOTHER = [
    (run.parse_args, [*RUN, "--min-budget", "64"], f"argument --min-budget: {BUDGET_AUTO}"),
    (run.parse_args, [*RUN, "--max-budget", "300", "--budget", "100"], f"argument --max-budget: {BUDGET_AUTO}"),
    (run.parse_args, [*RUN, "--refixate-guide", "prior"], "argument --refixate-guide: only used with --refixate"),
    (run.parse_args, [*RUN, "--refixate-budget", "20"], "argument --refixate-budget: only used with --refixate"),
    (train.parse_args, ["--min-budget", "30"], "argument --min-budget: only used with --budget auto"),
    (train.parse_args, ["--max-budget", "512"], "argument --max-budget: only used with --budget auto"),
    (evaluate.parse_args, ["--min-budget", "64"], f"argument --min-budget: {BUDGET_AUTO}"),
    (evaluate.parse_args, ["--max-budget=300", "--ablations", "raster"], f"argument --max-budget: {BUDGET_AUTO}"),
    (evaluate.parse_args, ["--refixate-guide", "prior"], "argument --refixate-guide: only used with --refixate"),
    (evaluate.parse_args, ["--turns", "4"], "argument --turns: only used with --conversation"),
    *((evaluate.parse_args, ["--dataset", "lmms-lab/textvqa", f"--{name}", value],
       f"argument --{name}: draws synthetic scenes, not with --dataset (--limit takes a set's first items)")
      for name, value in (("synthetic", "16"), ("kinds", "noise"), ("size", "896"))),
]
# ... and with the flag it needs, taken
WITH_THE_OTHER = [
    (run.parse_args, [*RUN, "--budget", "auto", "--min-budget", "64", "--max-budget", "300"]),
    (run.parse_args, [*RUN, "--ablations", "auto-budget", "--max-budget", "300"]),
    (run.parse_args, [*RUN, "--refixate", "0.5", "--refixate-guide", "prior", "--refixate-budget", "20"]),
    (train.parse_args, ["--budget", "auto", "--min-budget", "30", "--max-budget", "512"]),
    (evaluate.parse_args, ["--ablations", "auto-budget", "--min-budget", "64"]),
    (evaluate.parse_args, ["--conversation", "--kinds", "box_word", "--turns", "4"]),
    (evaluate.parse_args, ["--dataset", "lmms-lab/textvqa", "--limit", "3", "--seed", "5"]),
    (evaluate.parse_args, ["--synthetic", "16", "--kinds", "noise", "--size", "896"]),
]


def test_the_parser_names_the_flags_the_command_line_gave_whatever_their_values():
    """flags.ArgumentParser.given: a store, a switch, an append flag given twice, `--flag=value` and argparse's
    abbreviation (--min-b) count; a flag left out does not, and each parse forgets the last."""
    p = flags.config_parser(run.RunConfig)
    p.parse_args([*RUN, "--question", "and?", "--min-b=64", "--faithfulness", "--budget", "273"])
    assert p.given == {"image", "question", "min_budget", "faithfulness", "budget"}
    p.parse_args(RUN)
    assert p.given == {"image", "question"}


@pytest.mark.parametrize("parse, argv, refusal", NEEDS_ANOTHER)
def test_a_flag_that_needs_another_is_refused_without_it_in_one_line(parse, argv, refusal, capsys):
    reason = one_line_refusal(parse, argv, capsys)
    assert reason.split(": error: ")[1].split(" (see ")[0] == refusal


@pytest.mark.parametrize("parse, argv", WITH_THE_OTHER)
def test_a_flag_with_the_flag_it_needs_is_taken(parse, argv):
    parse(argv)


@pytest.mark.parametrize("parse, argv, flag", BAD_FLAGS)
def test_bad_flags_exit_2_naming_the_flag_in_one_line(parse, argv, flag, capsys):
    reason = one_line_refusal(parse, argv, capsys)
    assert f"error: argument {flag}" in reason, reason


@pytest.mark.parametrize("parse, argv, flag, message", BAD_PATHS)
def test_bad_paths_and_devices_are_refused_at_parse_time(parse, argv, flag, message, capsys):
    reason = one_line_refusal(parse, argv, capsys)
    assert f"error: argument {flag}: {message}" in reason, reason


def test_a_file_that_is_no_image_is_refused_at_parse_time(tmp_path, capsys):
    """A PDF (or any file PIL does not know) given as --image: one line, before torch or the model loads."""
    pdf, text = tmp_path / "page.pdf", tmp_path / "notes.txt"
    pdf.write_bytes(b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n")
    text.write_text("not an image")
    reason = one_line_refusal(run.parse_args, ["--image", str(pdf), "--question", "hi"], capsys)
    assert f"argument --image: {pdf} is not an image PIL can read (a PDF: export the page as PNG or JPEG)" in reason
    reason = one_line_refusal(run.parse_args, ["--image", str(text), "--question", "hi"], capsys)
    assert reason.endswith(f"argument --image: {text} is not an image PIL can read (see {flags.command_name()} --help)")


def test_the_question_limit_is_the_pipelines_own():
    from arr_coc.pipelines.request import MAX_QUESTION_CHARS, check_question

    assert cli.question("x" * MAX_QUESTION_CHARS) and check_question("x" * MAX_QUESTION_CHARS)
    with pytest.raises(Exception, match=f"over the limit of {MAX_QUESTION_CHARS}"):
        cli.question("x" * (MAX_QUESTION_CHARS + 1))


def test_an_unknown_or_missing_flag_is_one_line_pointing_to_help(capsys):
    assert "unrecognized arguments: --bogus" in one_line_refusal(run.parse_args, [*RUN, "--bogus"], capsys)
    assert "required: --image, --question" in one_line_refusal(run.parse_args, [], capsys)
    assert one_line_refusal(data.main, ["--n", "3"], capsys).startswith(f"{flags.command_name()}: error: ")


@pytest.mark.parametrize("parse, argv", [(run.parse_args, RUN), (evaluate.parse_args, []), (train.parse_args, []),
                                         (bench.parse_args, TINY_BENCH)])
def test_cuda_is_refused_where_there_is_none(parse, argv, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert "no CUDA GPU on this machine" in one_line_refusal(parse, [*argv, "--device", "cuda"], capsys)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert "it has 2 CUDA GPU(s), cuda:0 .. cuda:1" in one_line_refusal(parse, [*argv, "--device", "cuda:2"], capsys)
    assert parse([*argv, "--device", "CUDA:1"]).device == "cuda:1"
    assert parse([*argv, "--device", "cpu"]).device == "cpu"


def test_bench_on_a_cpu_benches_only_the_tiny_models(monkeypatch, capsys):
    import torch

    for argv in (["--device", "cpu"], ["--device", "cpu", "--model", "Qwen/Qwen2-VL-2B-Instruct"],
                 ["--device", "cpu", "--random-weights"]):
        reason = one_line_refusal(bench.parse_args, argv, capsys)
        assert "no GPU" in reason and "pass --model tiny" in reason, reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "error: argument --model: no GPU" in one_line_refusal(bench.parse_args, [], capsys)  # no --device: the CPU
    for tiny in ("tiny", "tiny-qwen2.5-vl", "tiny-qwen3-vl"):
        assert bench.parse_args(["--model", tiny]).model == tiny


def test_good_flags_parse():
    args = run.parse_args([*RUN, "--budget", "1024", "--max-cells", "1024", "--pipelines", " arr , full"])
    assert (args.budget, args.max_cells, cli.names(args.pipelines)) == (1024, 1024, ["arr", "full"])
    assert run.parse_args(RUN).max_cells == 4096 and evaluate.parse_args([]).max_cells == 4096
    assert evaluate.parse_args(["--max-cells", "16384"]).max_cells == 16384
    assert cli.names(evaluate.parse_args(["--baselines", ""]).baselines) == []
    assert bench.parse_args([*TINY_BENCH, "--pipelines", "arr"]).pipelines == "arr"  # bench splits the string itself


def test_a_commands_flags_make_its_one_request_and_only_arr_gets_the_second_look():
    """cli.request: every flag named as a Request field, the adaptive budget's bounds as its tensions, a row's own
    settings over them; cli.answer passes it whole, its second look to the arr pipeline only."""
    from types import SimpleNamespace

    from arr_coc.pipelines import OPTIONS
    from arr_coc.pipelines.arr_options import Options as ArrOptions, arr_options
    from arr_coc.pipelines.declared import fastv, pixelprune
    from arr_coc.pipelines.request import Request, with_settings
    from arr_coc.relevance.config import TensionSettings

    args = run.parse_args([*RUN, "--max-new-tokens", "8", "--strategy", "grid", "--budget", "40", "--max-cells",
                           "2048", "--fastv-layer", "3", "--refixate", "0.5", "--refixate-budget", "20",
                           "--refixate-guide", "attention", "--ablations", "auto-budget", "--min-budget", "30",
                           "--max-budget", "300", "--pixelprune-tau", "4", "--gestalt-tokens", "400"])
    request = cli.request(args, ablation="raster")
    assert request == Request(max_new_tokens=8, budget=40, max_cells=2048, gestalt_tokens=400,
                              options=(ArrOptions(strategy="grid", refixate=0.5, refixate_budget=20,
                                                  refixate_guide="attention", ablation="raster",
                                                  tensions=TensionSettings(min_budget=30, max_budget=300)),
                                       fastv.Options(fastv_layer=3), pixelprune.Options(pixelprune_tau=4.0)))
    chat = run.parse_args(["--image", "assets/chelsea.png", "--question", "hi", "--question", "and?", "--fresh-cells"])
    assert arr_options(cli.request(chat)).fresh_cells and not arr_options(cli.request(args)).fresh_cells
    swept = cli.request(evaluate.parse_args(["--max-new-tokens", "4"]), strategy="topk", budget=60)  # no --strategy
    assert (swept.max_new_tokens, arr_options(swept).strategy, swept.budget, arr_options(swept).fresh_cells) == (
        4, "topk", 60, False)
    asked = []
    model = SimpleNamespace(answer=lambda image, question, pipeline, request, conversation=None:
                            asked.append((pipeline, request, conversation)))
    for pipeline in ("arr", "full"):
        cli.answer(model, None, "hi", pipeline, request, conversation="chat")
    assert asked == [("arr", request, "chat"), ("full", with_settings(request, dict(refixate=None, refixate_budget=None),
                                                                     OPTIONS), "chat")]


@pytest.mark.parametrize("module, bad", [
    ("run", [["--image", "nowhere.png", "--question", "hi"], ["--image", "assets", "--question", "hi"],
             [*RUN, "--device", "tpu"], [*RUN, "--json", "assets"], ["--image", "pyproject.toml", "--question", "hi"],
             ["--image", "assets/chelsea.png", "--question", "x" * 5000], [*RUN, "--model", "pocket-fineprint"],
             [*RUN, "--min-budget", "64"]]),
    ("train", [["--device", "tpu"], ["--out", "/proc/arr-coc/ck"], ["--model", "checkpoints/pocket-fineprint"],
               ["--max-budget", "300"]]),
    ("evaluate", [["--dataset", "/nonexistent"], ["--device", "tpu"], ["--dataset", "nowhere-xyz/does-not-exist"],
                  ["--turns", "4"], ["--min-budget", "64"], ["--dataset", "lmms-lab/textvqa", "--synthetic", "16"]]),
    ("bench", [["--device", "tpu"], ["--json", "assets"]]),
    ("eval.data", []),
])
def test_help_and_bad_flags_answer_without_torch(module, bad):
    """Parsing imports no torch, transformers or model module: --help is instant, a bad flag or path fails at once."""
    code = (f"import sys\nimport arr_coc.{module} as m\nparse = getattr(m, 'parse_args', m.main)\n"
            f"for argv, code in [(['--help'], 0), (['--bogus-flag'], 2), *((argv, 2) for argv in {bad!r})]:\n"
            "    try:\n        parse(argv)\n    except SystemExit as e:\n        assert e.code == code, (argv, e.code)\n"
            "    else:\n        raise AssertionError(f'{argv} was accepted')\n"
            "heavy = sorted(n for n in ('torch', 'transformers', 'arr_coc.model', 'arr_coc.vlm.qwen2_vl') if n in sys.modules)\n"
            "print('HEAVY', heavy)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout


def test_run_help_on_the_command_line_does_not_import_torch():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "arr_coc.run", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--max-cells" in proc.stdout and "cells of 28 px" in " ".join(proc.stdout.split())
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "arr_coc.commands.cli" in imported and "torch" not in imported and "transformers" not in imported


# ----------------------------------------------------------------------------- train's output folder


def test_train_without_out_writes_a_fresh_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = train.parse_args([])
    assert Path(cfg.out).parent == Path("runs") and Path(cfg.out).name.startswith("arr-")
    assert "checkpoints" not in cfg.out and not Path(cfg.out).exists()


def test_train_refuses_a_non_empty_out_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "ck"
    out.mkdir()
    assert train.parse_args(["--out", str(out)]).out == str(out)  # empty: fine
    (out / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit:
        train.parse_args(["--out", str(out)])
    assert exit.value.code == 2
    reason = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --out" in reason and "--overwrite" in reason
    assert train.parse_args(["--out", str(out), "--overwrite"]).overwrite


def test_train_refuses_the_shipped_checkpoint_on_the_command_line():
    shipped = ROOT / "checkpoints" / "tiny-text-vs-distractor"
    before = {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()}
    proc = subprocess.run([sys.executable, "-m", "arr_coc.train", "--out", str(shipped), "--steps", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--overwrite" in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()} == before


# ----------------------------------------------------------------------------- checkpoints


def layer_config(folder: Path, family: str = "qwen2_vl", hidden_size: int = 64) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(dict(base_model_family=family, hidden_size=hidden_size)))


def test_checkpoint_names_folders_and_hub_ids_resolve(tmp_path, monkeypatch):
    layer_config(tmp_path / "root" / "mine")
    root = tmp_path / "root"
    assert checkpoints.resolve_checkpoint("mine", root) == str(root / "mine")  # a name under root
    assert checkpoints.resolve_checkpoint(str(root / "mine"), tmp_path) == str(root / "mine")  # a folder
    assert checkpoints.resolve_checkpoint("someone/arr-layer", root) == "someone/arr-layer"  # a hub id, as given
    assert choose_checkpoint("prior", "qwen2_vl", 64, root) is None
    assert choose_checkpoint(checkpoints.PRIOR, "qwen2_vl", 64, root) is None
    assert choose_checkpoint("mine", "qwen2_vl", 1536, root) == str(root / "mine")  # asked for: not filtered
    monkeypatch.chdir(ROOT)  # the app's shipped names resolve from anywhere
    assert checkpoints.resolve_checkpoint("tiny-text-vs-distractor") == str(ROOT / "checkpoints" / "tiny-text-vs-distractor")


def passing(folder: Path) -> None:
    """An evidence.json that says the folder's layer passes the default rule (issue 61; tests/test_evidence.py)."""
    from dataclasses import asdict

    (folder / checkpoints.EVIDENCE_FILE).write_text(json.dumps(dict(
        rule=asdict(checkpoints.RULE), files=checkpoints.file_digests(folder), verdict=dict(passes=True))))


def test_the_default_is_the_first_checkpoint_made_for_the_model_whose_evidence_passes(tmp_path):
    assert default_checkpoint("qwen2_vl", 64, tmp_path) is None
    layer_config(tmp_path / "a_big", hidden_size=1536)
    layer_config(tmp_path / "b_other_family", family="qwen3_vl")
    (tmp_path / "c_broken").mkdir()
    (tmp_path / "c_broken" / "config.json").write_text("{not json")
    layer_config(tmp_path / "d_fits_no_evidence")
    layer_config(tmp_path / "e_fits")
    layer_config(tmp_path / "f_fits_too")
    for name in ("a_big", "b_other_family", "c_broken", "e_fits", "f_fits_too"):
        passing(tmp_path / name)
    assert default_checkpoint("qwen2_vl", 64, tmp_path) == str(tmp_path / "e_fits")
    assert choose_checkpoint(None, "qwen2_vl", 1536, tmp_path) == str(tmp_path / "a_big")
    assert choose_checkpoint(None, "qwen2_vl", 32, tmp_path) is None  # nothing made for it: the prior
    assert checkpoints.label(str(tmp_path / "e_fits")) == "e_fits" and checkpoints.label(None) == checkpoints.PRIOR


# ----------------------------------------------------------------------------- packaging


SOURCES = ("arr_coc", "checkpoints", "setup.py", "pyproject.toml", "README.md", "requirements.txt")  # what a build reads


def build_wheel(tmp_path: Path) -> Path:
    """The wheel `pip install .` installs, built from a copy of the repo that also has a models/ folder to ship."""
    pytest.importorskip("setuptools", minversion="77")  # the build backend pyproject.toml names
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    (source / "models" / "pocket-test" / "weights").mkdir(parents=True)  # a nested offline model, as the repo will ship
    (source / "models" / "pocket-test" / "weights" / "model.safetensors").write_bytes(b"weights")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path / "dist")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return next((tmp_path / "dist").glob("arr_coc-*.whl"))


def test_pip_install_ships_the_checkpoints_and_models_found_from_any_folder(tmp_path):
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        files = set(archive.namelist())
        archive.extractall(tmp_path / "site")  # what pip puts in site-packages
    for folder in (ROOT / "checkpoints").iterdir():
        for name in ("config.json", "model.safetensors"):
            assert f"arr_coc/shipped/checkpoints/{folder.name}/{name}" in files, sorted(files)
    assert "arr_coc/shipped/models/pocket-test/weights/model.safetensors" in files
    assert {"arr_coc/eval/data.py", "arr_coc/viz.py", "arr_coc/pipelines/arr.py"} <= files  # every layer ships
    assert not any(f.startswith(("app.py", "tests/", "assets/", "checkpoints/", "models/")) for f in files)
    # run from another folder, the installed package finds its own copy by name
    code = ("from arr_coc import checkpoints\nprint(checkpoints.resolve_checkpoint('tiny-text-vs-distractor'))\n"
            "print(checkpoints.shipped('models'))")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert proc.returncode == 0, proc.stderr
    found, models = proc.stdout.split()
    installed = tmp_path / "site" / "arr_coc" / "shipped"
    assert Path(found) == installed / "checkpoints" / "tiny-text-vs-distractor" and (Path(found) / "config.json").is_file()
    assert Path(models) == installed / "models"


def test_shipped_folders_are_the_installed_copy_else_the_repos(tmp_path):
    package = tmp_path / "repo" / "arr_coc"
    (tmp_path / "repo" / "checkpoints").mkdir(parents=True)
    package.mkdir()
    assert checkpoints.shipped("checkpoints", package) == tmp_path / "repo" / "checkpoints"  # a clone
    (package / "shipped" / "checkpoints").mkdir(parents=True)
    assert checkpoints.shipped("checkpoints", package) == package / "shipped" / "checkpoints"  # pip installed
    assert checkpoints.ROOT == ROOT / "checkpoints"  # these tests run in the repo


def test_what_the_readme_steps_leave_behind_is_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    left = ["data/docvqa/x.parquet", "build/lib/arr_coc/commands/cli.py", "arr_coc.egg-info/PKG-INFO", "runs/eval/report.md"]
    proc = subprocess.run(["git", "check-ignore", *left], cwd=ROOT, capture_output=True, text=True)
    assert proc.stdout.split() == left
    assert subprocess.run(["git", "check-ignore", "-q", "arr_coc/eval/data.py"], cwd=ROOT).returncode == 1  # code is not


def test_console_scripts_point_at_callables():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    scripts = project["scripts"]
    assert set(scripts) == {"arr-coc-run", "arr-coc-train", "arr-coc-evaluate", "arr-coc-bench", "arr-coc-data",
                            "arr-coc-serve"}
    for target in scripts.values():
        module, _, name = target.partition(":")
        assert callable(getattr(__import__(module, fromlist=[name]), name))


def test_a_report_returning_main_exits_0(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["arr-coc-data", "--help"])
    with pytest.raises(SystemExit) as exit:
        cli.data()
    assert exit.value.code == 0
    monkeypatch.setattr(evaluate, "main", lambda: {"summary": {}})
    assert cli.evaluate() == 0
    monkeypatch.setattr(run, "main", lambda: 2)
    assert cli.run() == 2


@pytest.mark.parametrize("command", ["run", "evaluate", "train"])
@pytest.mark.usefixtures("tiny_loaded_once")
def test_a_model_or_dataset_that_cannot_load_exits_2_in_one_line(command, tmp_path, capsys):
    main = {"run": run.main, "evaluate": evaluate.main, "train": train.main}[command]
    own = {"run": RUN, "evaluate": ["--out", str(tmp_path / "eval")], "train": ["--out", str(tmp_path / "ck")]}[command]
    (tmp_path / "not-a-model").mkdir()  # there, but no model in it (one that is not there is refused at parse time)
    assert main(["--model", str(tmp_path / "not-a-model"), *own]) == 2
    error = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("error: "))
    assert f"cannot load the model '{tmp_path / 'not-a-model'}'" in error
    assert "--model pocket runs the shipped offline model" in error and "HF_HUB_OFFLINE=1" in error
    if command == "train":  # a dataset folder without data.jsonl: train reads any set evaluate reads, and says so
        assert main(["--model", "tiny", "--data", str(tmp_path), "--out", str(tmp_path / "ck2")]) == 2
        assert "cannot tell the schema" in capsys.readouterr().err


def test_the_default_output_folder_is_checked_too(tmp_path, monkeypatch, capsys):
    """Without --out, train and evaluate write a fresh runs/...: in a folder that takes no new files, refused now."""
    monkeypatch.chdir("/proc")  # nothing can be made here, even by root
    for parse in (train.parse_args, evaluate.parse_args):
        reason = one_line_refusal(parse, [], capsys)
        assert "argument --out: cannot write into runs/" in reason and ": /proc is not writable" in reason, reason
