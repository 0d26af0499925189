"""
arr-coc-serve (arr_coc/engines/serve.py, pyproject's console script): its ARR flags in --help, a wrong flag refused
in one line with exit 2 before vLLM starts (this venv has no vLLM: a flag that passed would meet that refusal
instead), and the server command it becomes, with the architecture of the model's family read from its config.json
(each family's tiny model; a family without one refused in one line). tests/test_vllm.py and
tests/test_vllm_families.py serve through it. Seen failing with the budget's bound in ServerSettings widened (--budget 0
passed to the vLLM check), and with vllm_plugin.ARCHITECTURES' Qwen3-VL entry naming the Qwen2.5-VL class.

    .venv/bin/python -m pytest -q tests/test_serve.py
"""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.engines.serve import ServeConfig, vllm_command
from arr_coc.vlm.tiny import tiny_model_path

ROOT = Path(__file__).resolve().parents[1]


def serve(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arr_coc.engines.serve", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_console_script_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["arr-coc-serve"] == "arr_coc.commands.cli:serve"


def test_help_lists_the_arr_flags():
    done = serve("--help")
    assert done.returncode == 0
    for name in ("--budget", "--checkpoint", "--strategy", "--max-cells", "--model", "--port"):
        assert name in done.stdout


@pytest.mark.parametrize("argv, says", [
    (["--bugdet", "16"], "unrecognized arguments: --bugdet 16"),
    (["--budget", "0"], "argument --budget: must be between 1 and 16384, got 0"),
    (["--strategy", "best"], "argument --strategy: unknown 'best'; choose from topk, logpolar, grid, random"),
    (["--max-cells", "10"], "argument --max-cells: must be between 1024 and 16384, got 10"),
    (["--budget", "5000"], "argument --budget: 5000 exceeds --max-cells 4096"),
    (["--model", "tiny"], "argument --model: tiny is built in memory by the project, not a folder vLLM can load"),
])
def test_a_wrong_flag_is_refused_before_vllm(argv, says):
    done = serve(*argv, "--", "--dtype", "float32")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and says in done.stderr and "no vLLM in" not in done.stderr


def test_a_right_command_line_reaches_the_vllm_check():
    done = serve("--budget", "64", "--", "--dtype", "float32")  # this venv has no vLLM
    assert done.returncode == 2 and "no vLLM in" in done.stderr


def test_the_server_command():
    cfg = ServeConfig(budget=64, strategy="grid", port=8123)
    assert vllm_command(cfg, ["--dtype", "float32"]) == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "pocket", "--host", "127.0.0.1",
        "--port", "8123", "--hf-overrides", '{"architectures": ["ArrCocQwen2VLForConditionalGeneration"], '
        '"arr_budget": 64, "arr_strategy": "grid", "arr_max_cells": 4096}', "--dtype", "float32"]
    assert str(POCKET_FOLDER).endswith("models/pocket-qwen2-vl")


@pytest.mark.parametrize("name, architecture", [
    ("tiny", "ArrCocQwen2VLForConditionalGeneration"),
    ("tiny-qwen2.5-vl", "ArrCocQwen2_5_VLForConditionalGeneration"),
    ("tiny-qwen3-vl", "ArrCocQwen3VLForConditionalGeneration"),
])
def test_the_architecture_is_the_model_family_s(name, architecture):
    command = vllm_command(ServeConfig(model=str(tiny_model_path(name))), [])
    assert json.loads(command[command.index("--hf-overrides") + 1])["architectures"] == [architecture]


def test_a_family_without_an_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llava"}')
    done = serve("--model", str(tmp_path), "--", "--dtype", "float32")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "argument --model: ARR-COC serves qwen2_vl, qwen2_5_vl, qwen3_vl models in vLLM; this one is 'llava'" \
        in done.stderr
