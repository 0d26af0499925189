"""
The commands' flags are defined once, as config dataclass fields, and docs/commands.md's flag tables are what those
dataclasses generate (arr_coc.commands.docs), so the page cannot drift from the code.

    .venv/bin/python -m pytest tests/test_commands_docs.py -q
"""

import ast
from dataclasses import dataclass
from pathlib import Path

from arr_coc import flags
from arr_coc.commands import docs

ROOT = Path(__file__).resolve().parents[1]
SHARED = {"model", "checkpoint", "budget", "min_budget", "max_budget", "max_cells", "gestalt_tokens", "fastv_layer",
          "refixate", "refixate_budget", "faithfulness_steps",  # each defined once in arr_coc/commands/cli.py (cli.model_flag, ...;
          # fastv_layer in FastV's Options, OWN)
          "device", "seed"}  # ... and these in arr_coc/flags.py (device_flag, seed_flag), for commands at any layer
OWN = {("arr_coc/pocket/heldout.py", "model"): "an exported pocket folder that stock transformers loads, not a VLM "
                                               "for the façade: its own flag",
       ("arr_coc/pipelines/declared/fastv.py", "fastv_layer"): "FastV's Options, its one definition: run's and "
                                                               "evaluate's configs take it from the registry "
                                                               "(flags.with_flags_of)",
       ("arr_coc/commands/evidence.py", "checkpoint"): "the one folder the default rule judges (required; no 'prior', "
                                                       "no hub id): its own flag",
       ("arr_coc/commands/evidence.py", "budget"): "the rule's fixed budget (64, never 'auto'): its own flag",
       ("arr_coc/engines/vllm_plugin.py", "budget"): "a vLLM server's fixed budget (vLLM sizes an image's tokens before "
                                                     "encoding it: never 'auto'): its own flag",
       ("arr_coc/engines/serve.py", "model"): "what vLLM loads (a folder or hub id; 'pocket' its folder; never a tiny "
                                              "model, built in memory): its own flag"}


def test_the_page_holds_exactly_the_tables_the_configs_generate():
    page = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    assert page.count(docs.BEGIN) == 1 and page.count(docs.END) == 1
    block = page[page.index(docs.BEGIN):page.index(docs.END) + len(docs.END)]
    assert block == docs.tables(), "docs/commands.md's flag tables are stale: run python -m arr_coc.commands.docs --write"


def test_the_results_page_and_the_readmes_tables_are_what_the_runs_generate():
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert page == docs.results_page(), "docs/results.md is stale: run python -m arr_coc.commands.docs --write"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme == docs.readme_with_tables(readme), "the README's generated tables are stale: run ... docs --write"


def test_the_generated_tables_hold_the_runs_numbers():
    """Two cells written out from the JSON by hand: ARR's 1792² row of the c41afe3 bench (ttft_ms 27.83,
    decode 1.98, peak 5329 MB) and step 78202's held-out sparse row at 896² (58, 94 and 96 of 96)."""
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert "| **ARR-COC** | fast | 256 + 273 | 11.9 | 8.4 | 7.6 | **27.8** | 1.98 | 5329 | 1.00× |" in page
    assert "| held-out sparse | 896² | `full` | 96 | 0.60 [0.50, 0.70] | 0.98 [0.93, 0.99] | 1.00 [0.96, 1.00] |" in page


def test_the_selection_tables_hold_the_sweeps_numbers():
    """Rows counted from the sweep's results.jsonl.gz by a script of its own (seeds merged, 96 pages a cell): ARR at
    64 saccades on box words (94, 63, 82 and 52 correct; box recall 0.96, 0.77, 0.80, 0.64) in the README and
    docs/results.md, and PixelPrune at 273 on fine print (60, 12, 65 and 0 correct) in docs/results.md."""
    arr = "| ARR (box recall) | 0.98 [0.93, 0.99] (0.96) | 0.66 [0.56, 0.74] (0.77) | 0.85 [0.77, 0.91] (0.80) | " \
          "0.54 [0.44, 0.64] (0.64) |"
    readme, page = ((ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "docs/results.md"))
    assert arr in readme and arr in page
    assert "| PixelPrune at ARR's tokens | 0.62 [0.53, 0.72] | 0.12 [0.07, 0.21] | 0.68 [0.58, 0.76] | " \
           "0.00 [0.00, 0.04] |" in page
    assert "n = 96 pages a cell." in readme


def test_a_configs_rows_and_parser_read_its_fields():
    @dataclass
    class Config:
        budget: int = flags.flag(273, "saccades, at most 5%", flags.bounded_int(1, 10))
        on: bool = flags.flag(False, "a switch")
        image: str = flags.flag(None, "an image", required=True)
        order: str | None = flags.flag(None, "feed order", flags.one_of(("raster", "relevance")), metavar="ORDER")
        sizes: list[int] = flags.flag([448, 896], "sides", flags.int_list(1, 4096))
        internal: bool = False  # no help: not a flag

    assert flags.flag_rows(Config) == [
        ("`--budget BUDGET`", "`273`", "saccades, at most 5%"), ("`--on`", "off", "a switch"),
        ("`--image IMAGE`", "required", "an image"), ("`--order ORDER`", "–", "feed order (raster, relevance)"),
        ("`--sizes SIZES`", "`448,896`", "sides")]
    cfg = flags.parse_config(Config, ["--image", "a.png", "--on", "--order", "raster", "--sizes", "1,2"])
    assert cfg == Config(budget=273, on=True, image="a.png", order="raster", sizes=[1, 2])
    assert Config().sizes is not Config().sizes  # a list default is each config's own


def definitions(path: Path) -> list[tuple[str, int]]:
    """The flags a source defines itself: (name, line) of each `name: ... = flag(...)` field and each
    add_argument("--name", ...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call) and isinstance(node.target, ast.Name):
            func = node.value.func
            if getattr(func, "id", getattr(func, "attr", None)) == "flag":
                found.append((node.target.id, node.lineno))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args \
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("--"):
            found.append((node.args[0].value[2:].replace("-", "_"), node.lineno))
    return found


def test_each_shared_flag_is_defined_once():
    sources = [ROOT / "app.py", *sorted((ROOT / "arr_coc").rglob("*.py"))]
    again = [f"{path.relative_to(ROOT)}:{line} defines --{name}" for path in sources
             for name, line in definitions(path)
             if name in SHARED and (str(path.relative_to(ROOT)), name) not in OWN]
    assert not again, "use the shared field (cli.model_flag, flags.device_flag, ...): " + "; ".join(again)
