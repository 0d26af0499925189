"""
arr-coc-serve (arr_coc/engines/serve.py, pyproject's console script): its ARR flags in --help, a wrong flag refused
in one line with exit 2 before vLLM starts (this venv has no vLLM: a flag that passed would meet that refusal
instead), and the server command it becomes. tests/test_vllm.py serves through it. Seen failing with the budget's
bound in ServerSettings widened (--budget 0 passed to the vLLM check).

    .venv/bin/python -m pytest -q tests/test_serve.py
"""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.engines.serve import ServeConfig, vllm_command

ROOT = Path(__file__).resolve().parents[1]


def serve(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arr_coc.engines.serve", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_console_script_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["arr-coc-serve"] == "arr_coc.cli:serve"


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
