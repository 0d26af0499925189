"""
lmms-eval's `--model arr_coc` (arr_coc/engines/lmms.py) in its own venv gives, item for item, the answers
`python -m arr_coc.evaluate` gives on the same items: 6 pocket-suite pages (made by arr_coc.eval.data), the pocket
model, ARR under topk at one budget, through the local task lmms_tasks/arr_coc_pocket. And its --model_args name
evaluate's rows, read by evaluate's parser, with sampling and rows it cannot run refused.

The venv (.venv-lmms/, gitignored) is made here when missing, or when the files it was installed from changed
(requirements-lmms.txt, requirements.txt, pyproject.toml: a stamp inside it holds their hash), with
`pip install -r requirements-lmms.txt`: 2.5-3.5 minutes and 7.1 GB on this project's 2-core CPU machine (the CUDA
torch of the package index, as the main venv's, whose wheels pip has cached by then), more where every wheel must be
downloaded. The test itself takes 21 s on an idle machine, 55 s beside another test run.

The same for the Qwen2.5-VL and Qwen3-VL tiny random models (test_lmms_eval_answers_equal_evaluate_for_each_family,
~1 min each).

The budget is 16, where the pocket model misses some pages (at 273 it reads all 6 right, and a comparison of right
answers would not tell two budgets apart): passing lmms-eval budget=8 instead was seen failing, 3 of 6 answers apart.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import one_install_at_a_time, run_checked

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-lmms"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / "installed-from.sha256"
INSTALLED_FROM = ("requirements-lmms.txt", "requirements.txt", "pyproject.toml")
BUDGET = 16
ITEMS = 6


def installed_from() -> str:
    """The hash of the files the venv is installed from: a change to any of them installs it again."""
    return hashlib.sha256(b"".join((ROOT / name).read_bytes() for name in INSTALLED_FROM)).hexdigest()


@pytest.fixture(scope="module")
def lmms_python() -> Path:
    """The lmms-eval venv's python, installed from requirements-lmms.txt if missing or stale."""
    want = installed_from()
    with one_install_at_a_time():
        if not (PYTHON.exists() and STAMP.exists() and STAMP.read_text() == want):
            if not PYTHON.exists():
                run_checked([sys.executable, "-m", "venv", VENV], ROOT, 300)
            run_checked([PYTHON, "-m", "pip", "install", "-q", "-r", "requirements-lmms.txt"], ROOT, 3600)
            STAMP.write_text(want)
    return PYTHON


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    """A folder holding data/pocket-suite: the task's JSONL of 6 pocket-suite pages, 2 of each kind."""
    folder = tmp_path_factory.mktemp("lmms")
    run_checked([sys.executable, "-m", "arr_coc.eval.data", "--out", folder / "data" / "pocket-suite", "--n", ITEMS,
                 "--kinds", "fine_print,box_word,shape_colour", "--seed", 0, "--size", 896], ROOT, 300)
    return folder


def evaluate_answers(folder: Path, model: str = "pocket") -> tuple[dict[int, str], float]:
    """evaluate's answer to each item (its index) of the folder's set, ARR under topk at BUDGET, and its exact match
    over them."""
    out = folder / f"evaluate-{model}"
    run_checked([sys.executable, "-m", "arr_coc.evaluate", "--model", model, "--dataset",
                 folder / "data" / "pocket-suite", "--metric", "exact", "--baselines", "", "--strategies", "topk",
                 "--no-oracle", "--budget", BUDGET, "--device", "cpu", "--out", out], ROOT, 1200)
    results = [r for line in (out / "results.jsonl").read_text().splitlines()
               if (r := json.loads(line))["row"] == "arr:topk"]
    return {r["item"]: r["prediction"] for r in results}, sum(r["score"] for r in results) / len(results)


def lmms_answers(python: Path, folder: Path, model_args: str) -> tuple[dict[int, str], dict]:
    """lmms-eval's answer to each doc (its id) of the local pocket task through --model arr_coc, and its results."""
    out = folder / f"lmms-{model_args.split(',')[0].split('=')[1]}"
    run_checked([python, "-m", "lmms_eval", "eval", "--model", "arr_coc", "--model_args", model_args,
                 "--tasks", "arr_coc_pocket", "--include_path", ROOT / "lmms_tasks", "--device", "cpu",
                 "--log_samples", "--output_path", out], folder, 1200, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    samples = [json.loads(line) for path in out.rglob("*_samples_arr_coc_pocket.jsonl")
               for line in path.read_text().splitlines()]
    results = [json.loads(path.read_text()) for path in out.rglob("*_results.json")]
    assert len(results) == 1, f"lmms-eval wrote {len(results)} results files under {out}"
    return {s["doc_id"]: s["filtered_resps"] for s in samples}, results[0]


def test_lmms_eval_answers_equal_evaluate_on_the_pocket_suite(lmms_python, pages):
    expected, exact_match = evaluate_answers(pages)
    answers, results = lmms_answers(lmms_python, pages, f"pretrained=pocket,pipeline=arr,budget={BUDGET}")
    assert len(expected) == ITEMS
    assert answers == expected
    assert results["results"]["arr_coc_pocket"]["exact_match,none"] == pytest.approx(exact_match)


@pytest.mark.parametrize("model", ["tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_lmms_eval_answers_equal_evaluate_for_each_family(lmms_python, pages, model):
    """The same on the Qwen2.5-VL and Qwen3-VL tiny random models (their answers are noise, the same noise; the
    tiny Qwen3-VL's are blank on these pages, its greedy tokens newlines, so there the test shows the family runs
    end to end in lmms-eval, and tests/test_vllm_families.py compares its tokens)."""
    expected, exact_match = evaluate_answers(pages, model)
    answers, results = lmms_answers(lmms_python, pages, f"pretrained={model},pipeline=arr,budget={BUDGET}")
    assert len(expected) == ITEMS
    assert answers == expected
    assert results["results"]["arr_coc_pocket"]["exact_match,none"] == pytest.approx(exact_match)


ROWS_SCRIPT = """
import json, sys
from arr_coc.engines.lmms import ARRCOC, parse_settings
from arr_coc.pipelines.arr_options import arr_options
rows = [parse_settings(p, dict(pretrained="pocket", batch_size=1, **s)).row for p, s in json.loads(sys.argv[1])]
model = ARRCOC.__new__(ARRCOC)  # its settings only: no model loads
model.args = parse_settings("arr", dict(pretrained="pocket", budget=16))
request = model.request({"max_new_tokens": 7, "temperature": 0, "do_sample": False})
try:
    model.request({"temperature": 0.7})
    refused = None
except ValueError as e:
    refused = str(e)
print(json.dumps({"rows": rows, "request": [arr_options(request).strategy, request.budget, request.max_new_tokens],
                  "refused": refused}))
"""


def test_model_args_name_evaluates_rows_and_refuse_what_it_cannot_run(lmms_python, tmp_path):
    asked = [["arr", {}], ["arr", {"strategy": "grid"}], ["arr:logpolar", {}], ["full", {}], ["fastv", {"budget": 64}],
             ["arr-no-gestalt:topk", {}], ["arr+refix:topk", {"refixate": 0.9}]]
    done = run_checked([lmms_python, "-c", ROWS_SCRIPT, json.dumps(asked)], tmp_path, 300)
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["rows"] == ["arr:topk", "arr:grid", "arr:logpolar", "full", "fastv", "arr-no-gestalt:topk",
                             "arr+refix:topk"]
    assert found["request"] == ["topk", 16, 7]
    assert "decodes greedily" in found["refused"]
    for pipeline, why in (("nonsense", "'nonsense' is none of evaluate's rows"),
                          ("arr+refix:topk", "is not one of evaluate's rows here")):
        bad = subprocess.run([lmms_python, "-c", f"from arr_coc.engines.lmms import parse_settings\n"
                              f"parse_settings({pipeline!r}, dict(pretrained='pocket'))"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and why in bad.stderr, bad.stderr[-2000:]
