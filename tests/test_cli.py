"""
The commands' flags: every bad value is refused at parse time (exit 2, one line naming the flag) before
torch or a model loads; --help is fast; train never overwrites a folder silently; the checkpoint resolver
and the console scripts that pyproject.toml declares.

    .venv/bin/python -m pytest tests/test_cli.py -q
"""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from arr_coc import bench, checkpoints, cli, data, evaluate, run, train

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
    (run.parse_args, ["--image", "x.png", "--question", "  "], "--question"),
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


@pytest.mark.parametrize("parse, argv, flag", BAD_FLAGS)
def test_bad_flags_exit_2_naming_the_flag(parse, argv, flag, capsys):
    with pytest.raises(SystemExit) as exit:
        parse(argv)
    assert exit.value.code == 2
    reason = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"error: argument {flag}" in reason, reason


def test_good_flags_parse():
    args = run.parse_args([*RUN, "--budget", "1024", "--max-cells", "1024", "--pipelines", " arr , full"])
    assert (args.budget, args.max_cells, cli.names(args.pipelines)) == (1024, 1024, ["arr", "full"])
    assert run.parse_args(RUN).max_cells == 4096 and evaluate.parse_args([]).max_cells == 4096
    assert evaluate.parse_args(["--max-cells", "16384"]).max_cells == 16384
    assert cli.names(evaluate.parse_args(["--baselines", ""]).baselines) == []
    assert bench.parse_args(["--pipelines", "arr"]).pipelines == "arr"  # bench splits the string itself


@pytest.mark.parametrize("module", ["run", "train", "evaluate", "data"])
def test_help_and_bad_flags_answer_without_torch(module):
    """Parsing imports no torch, transformers or model module: --help exits 0 at once, a bad flag exits 2 at once."""
    code = (f"import sys\nfrom arr_coc import {module} as m\nparse = getattr(m, 'parse_args', m.main)\n"
            "for argv, expected in ((['--help'], 0), (['--bogus-flag'], 2)):\n"
            "    try:\n        parse(argv)\n    except SystemExit as e:\n        assert e.code == expected, (argv, e.code)\n"
            "    else:\n        raise AssertionError(f'{argv} did not exit')\n"
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
    assert "arr_coc.cli" in imported and "torch" not in imported and "transformers" not in imported


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
    assert checkpoints.choose("prior", "qwen2_vl", 64, root) is None
    assert checkpoints.choose(checkpoints.PRIOR, "qwen2_vl", 64, root) is None
    assert checkpoints.choose("mine", "qwen2_vl", 1536, root) == str(root / "mine")  # asked for: not filtered
    monkeypatch.chdir(ROOT)  # the app's shipped names resolve from anywhere
    assert checkpoints.resolve_checkpoint("tiny-text-vs-distractor") == str(ROOT / "checkpoints" / "tiny-text-vs-distractor")


def test_the_default_is_the_first_checkpoint_made_for_the_model(tmp_path):
    assert checkpoints.default_checkpoint("qwen2_vl", 64, tmp_path) is None
    layer_config(tmp_path / "a_big", hidden_size=1536)
    layer_config(tmp_path / "b_other_family", family="qwen3_vl")
    (tmp_path / "c_broken").mkdir()
    (tmp_path / "c_broken" / "config.json").write_text("{not json")
    layer_config(tmp_path / "d_fits")
    layer_config(tmp_path / "e_fits_too")
    assert checkpoints.default_checkpoint("qwen2_vl", 64, tmp_path) == str(tmp_path / "d_fits")
    assert checkpoints.choose(None, "qwen2_vl", 1536, tmp_path) == str(tmp_path / "a_big")
    assert checkpoints.label(str(tmp_path / "d_fits")) == "d_fits" and checkpoints.label(None) == checkpoints.PRIOR


# ----------------------------------------------------------------------------- packaging


def test_console_scripts_point_at_callables():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    scripts = project["scripts"]
    assert set(scripts) == {"arr-coc-run", "arr-coc-train", "arr-coc-evaluate", "arr-coc-bench", "arr-coc-data"}
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
def test_a_model_or_dataset_that_cannot_load_exits_2_in_one_line(command, tmp_path, capsys):
    main = {"run": run.main, "evaluate": evaluate.main, "train": train.main}[command]
    own = {"run": RUN, "evaluate": ["--out", str(tmp_path / "eval")], "train": ["--out", str(tmp_path / "ck")]}[command]
    assert main(["--model", str(tmp_path / "no-such-model"), *own]) == 2
    error = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("error: "))
    assert f"cannot load the model '{tmp_path / 'no-such-model'}'" in error and "--model tiny" in error
    if command == "train":  # a dataset folder without data.jsonl
        assert main(["--model", "tiny", "--data", str(tmp_path), "--out", str(tmp_path / "ck2")]) == 2
        assert "no such dataset file" in capsys.readouterr().err
