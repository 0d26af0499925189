"""
A pipeline declares itself (issue #62 step 1): a throwaway pipeline with one option, declared by one module alone
(a PIPELINE record and its Options, as arr_coc/pipelines/declared/ holds them), is in the registry, the app's
dropdown choices, run's and evaluate's flags and the generated docs. The module lies in a folder of its own, added to
the declarations' package path, in a fresh interpreter (the registry is read once, as arr_coc.pipelines loads).

    .venv/bin/python -m pytest tests/pipelines/test_declared.py -q
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

THROWAWAY = '''"""echo: a throwaway pipeline of tests/pipelines/test_declared.py, never asked to answer."""

from dataclasses import dataclass

from arr_coc.flags import bounded_int, flag
from arr_coc.pipelines.pipeline import Pipeline


@dataclass(frozen=True)
class Options:
    """The echo pipeline's one setting."""
    echo_times: int = flag(3, "how many times the echo pipeline repeats its answer", bounded_int(1, 9))


PIPELINE = Pipeline("echo", "arr_coc.pipelines.stock", "Echo: the native view, its answer repeated", kind="reducer",
                    order=95, options=Options, answer="full")
'''

DRIVER = '''
import contextlib, importlib, io, json, sys
import arr_coc.pipelines.declared as declared
declared.__path__.append(sys.argv[1])  # the throwaway's folder joins the declarations' own
import arr_coc.pipelines as pipelines
importlib.reload(pipelines)  # the registry read again, with the throwaway's module
from arr_coc.commands import cli
from arr_coc.app import options
from arr_coc import evaluate, run
from arr_coc.commands import docs


def help_of(parse):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parse(["--help"])
    return out.getvalue()


args = run.parse_args(["--model", "tiny", "--image", "assets/chelsea.png", "--question", "q", "--pipelines", "echo",
                       "--echo-times", "5"])
print(json.dumps(dict(
    pipelines=pipelines.PIPELINES, reducers=pipelines.REDUCERS, baselines=pipelines.BASELINES,
    what=pipelines.describe(("echo",)), compare=options.choices("compare"), microscope=options.choices("microscope"),
    chat=options.choices("chat"), run_help=help_of(run.parse_args), evaluate_help=help_of(evaluate.parse_args),
    docs=docs.tables(), echo_times=args.echo_times, pipelines_flag=args.pipelines,
    options=[repr(o) for o in cli.request(args).options])))
'''

ROW = "| `--echo-times ECHO_TIMES` | `3` | how many times the echo pipeline repeats its answer |"


def declared_with_throwaway(tmp_path) -> dict:
    (tmp_path / "echo.py").write_text(THROWAWAY, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="400")  # no wrapping in --help
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_throwaway_pipeline_declared_by_its_module_alone_is_everywhere(tmp_path):
    found = declared_with_throwaway(tmp_path)
    assert found["pipelines"] == ["arr", "full", "gestalt", "budget", "divprune", "visionzip", "fastv", "pixelprune",
                                  "pixelprune_n", "echo"]
    assert found["reducers"] == ["divprune", "visionzip", "fastv", "pixelprune", "pixelprune_n", "echo"]
    assert found["what"] == "echo: Echo: the native view, its answer repeated"
    assert found["compare"] == ["full", "gestalt", "budget", "divprune", "visionzip", "fastv", "pixelprune",
                                "pixelprune_n", "echo"]
    assert found["microscope"] == ["none", "divprune", "visionzip", "fastv", "pixelprune", "pixelprune_n", "echo"]
    assert found["chat"] == ["full", "gestalt", "budget", "divprune", "visionzip", "pixelprune",
                             "pixelprune_n", "echo"]
    for command in ("run_help", "evaluate_help"):
        assert "--echo-times ECHO_TIMES" in found[command]
        assert "how many times the echo pipeline repeats its answer" in " ".join(found[command].split())
        assert "echo: Echo: the native view, its answer repeated" in " ".join(found[command].split())
    run_table, evaluate_table = (found["docs"].split(f"### `python -m arr_coc.{c}`")[1].split("### ")[0]
                                 for c in ("run", "evaluate"))
    assert ROW in run_table and ROW in evaluate_table
    assert (found["echo_times"], found["pipelines_flag"]) == (5, "echo")
    arr, *others = found["options"]  # ARR's own Options first (the registry's order), then the reducers' and echo's
    assert arr.startswith("Options(strategy='topk', layer=None, ablation=None, ")
    assert others == ["Options(fastv_layer=2)", "Options(pixelprune_tau=0.0)", "Options(echo_times=5)"]


def test_without_it_the_registry_and_the_flags_are_the_repositorys_own():
    from arr_coc.commands import docs
    from arr_coc.pipelines import PIPELINES, REDUCERS

    assert "echo" not in PIPELINES and "echo" not in REDUCERS and "--echo-times" not in docs.tables()


def test_each_pipeline_answers_through_the_function_its_record_names():
    """The stock views are stock.py's full, gestalt and budget; the PixelPrunes pixelprune.py's answer and answer_n
    (issue #62 step 3: no module holds one line that only names a view)."""
    from arr_coc import pipelines

    found = {name: (pipelines.answer_of(name).__module__, pipelines.answer_of(name).__name__)
             for name in pipelines.PIPELINES}
    assert found == {"arr": ("arr_coc.pipelines.arr", "answer"), "full": ("arr_coc.pipelines.stock", "full"),
                     "gestalt": ("arr_coc.pipelines.stock", "gestalt"), "budget": ("arr_coc.pipelines.stock", "budget"),
                     "divprune": ("arr_coc.pipelines.divprune", "answer"),
                     "visionzip": ("arr_coc.pipelines.visionzip", "answer"),
                     "fastv": ("arr_coc.pipelines.fastv", "answer"),
                     "pixelprune": ("arr_coc.pipelines.pixelprune", "answer"),
                     "pixelprune_n": ("arr_coc.pipelines.pixelprune", "answer_n")}


def test_a_pipelines_own_setting_by_name_goes_into_its_options():
    """ARRCOCQwen.answer(..., fastv_layer=3) as before: the name goes into FastV's Options (Request.options), a None
    drops it (the PipelineConfig's again), a bad tau is refused in the words check_request used."""
    import pytest

    from arr_coc.errors import InputError
    from arr_coc.pipelines import OPTIONS
    from arr_coc.pipelines.declared import fastv, pixelprune
    from arr_coc.pipelines.request import Request, setting, with_settings

    request = with_settings(Request(budget=40), dict(fastv_layer=3, pixelprune_tau=4), OPTIONS)
    assert request == Request(budget=40, options=(fastv.Options(fastv_layer=3), pixelprune.Options(pixelprune_tau=4)))
    assert (setting(request, "fastv_layer", 2), setting(Request(), "fastv_layer", 2)) == (3, 2)
    assert with_settings(request, dict(fastv_layer=None), OPTIONS).options == (pixelprune.Options(pixelprune_tau=4),)
    with pytest.raises(InputError, match="pixelprune_tau is a pixel difference between 0 and 255, got 300"):
        with_settings(None, dict(pixelprune_tau=300), OPTIONS)


def test_a_request_holds_only_what_every_pipeline_shares():
    """Issue #62 step 1: a Request's own fields are those every pipeline reads; a pipeline's own settings are its
    Options in Request.options (ARR's among them)."""
    from dataclasses import fields

    from arr_coc.pipelines.request import Request

    assert [f.name for f in fields(Request)] == ["max_new_tokens", "budget", "max_cells", "gestalt_tokens", "options",
                                                 "stop", "converse"]


def test_arrs_settings_are_the_arr_records_options():
    """ARR's twelve settings, its Options on its record (arr_coc/pipelines/arr_options.py), none of them a flag of its
    own (run's and evaluate's ARR flags are the commands'), and by name they go into it (with_settings)."""
    from dataclasses import fields

    from arr_coc.flags import flag_fields
    from arr_coc.pipelines import OPTIONS, REGISTRY
    from arr_coc.pipelines.arr_options import Options, arr_options
    from arr_coc.pipelines.request import Request, with_settings

    assert [f.name for f in fields(Options)] == ["strategy", "layer", "ablation", "tensions", "refixate",
                                                 "refixate_budget", "refixate_guide", "look", "crop_tokens",
                                                 "fresh_cells", "include", "upsample"]
    assert REGISTRY["arr"].options is Options and Options in OPTIONS and flag_fields(Options) == []
    request = with_settings(Request(budget=40), dict(refixate=0.5, strategy="grid"), OPTIONS)
    assert request == Request(budget=40, options=(Options(strategy="grid", refixate=0.5),))
    assert arr_options(with_settings(request, dict(refixate=None), OPTIONS)) == Options(strategy="grid")
    assert arr_options(Request()) == Options() and with_settings(request, dict(refixate=None, strategy=None),
                                                                 OPTIONS) == Request(budget=40)
