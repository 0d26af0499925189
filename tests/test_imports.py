"""
The layers hold: each package, imported alone in a fresh interpreter, loads nothing from the layers above it
(docs/ARCHITECTURE.md). Bottom to top:

    1. utilities   settings, errors, flags, hub, graphs, timing, flops, distributed, zerogpu, checkpoints
    2. relevance/ and vlm/, side by side, neither loading the other
    3. pipelines/
    4. synth/ (the page generator) and viz (drawing)
    5. eval/ and pocket/ (the pocket model's training)
    6. the facade (model), the app and the commands (cli, run, train, evaluate, bench, config)

The pipelines take the model's Parts, never the facade: no module of arr_coc/pipelines/ names arr_coc.model in any
import, not even one for type hints only (under TYPE_CHECKING) or inside a function, which a fresh interpreter
never runs.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("arr_coc.model", "arr_coc.app", "arr_coc.cli", "arr_coc.run", "arr_coc.train", "arr_coc.evaluate",
            "arr_coc.bench", "arr_coc.config")
ABOVE_PIPELINES = ("arr_coc.synth", "arr_coc.viz", "arr_coc.eval", "arr_coc.pocket") + COMMANDS
LAYERS = {  # module imported alone -> the prefixes it must not load
    "arr_coc.settings": ("arr_coc.vlm", "arr_coc.relevance", "arr_coc.pipelines", "torch") + ABOVE_PIPELINES,
    "arr_coc.vlm.families": ("arr_coc.relevance", "arr_coc.pipelines") + ABOVE_PIPELINES,
    "arr_coc.vlm.qwen2_vl": ("arr_coc.relevance", "arr_coc.pipelines") + ABOVE_PIPELINES,
    "arr_coc.vlm.qwen3_vl": ("arr_coc.relevance", "arr_coc.pipelines") + ABOVE_PIPELINES,
    "arr_coc.vlm.tiny": ("arr_coc.relevance", "arr_coc.pipelines") + ABOVE_PIPELINES,
    "arr_coc.relevance.layer": ("arr_coc.vlm", "arr_coc.pipelines", "transformers.models") + ABOVE_PIPELINES,
    "arr_coc.relevance.prior": ("arr_coc.vlm", "arr_coc.pipelines", "transformers.models") + ABOVE_PIPELINES,
    "arr_coc.relevance.ablation": ("arr_coc.vlm", "arr_coc.pipelines") + ABOVE_PIPELINES,
    "arr_coc.pipelines.arr": ABOVE_PIPELINES,
    "arr_coc.pipelines.fastv": ABOVE_PIPELINES,
    "arr_coc.pipelines.visionzip": ABOVE_PIPELINES,
    "arr_coc.pipelines.conversation": ABOVE_PIPELINES,
    "arr_coc.synth.fineprint": ("arr_coc.vlm", "arr_coc.relevance", "arr_coc.pipelines", "arr_coc.eval",
                                "arr_coc.pocket", "torch") + COMMANDS,
    "arr_coc.viz": ("arr_coc.pipelines", "arr_coc.eval", "arr_coc.pocket") + COMMANDS,
    "arr_coc.eval.report": COMMANDS,
    "arr_coc.eval.data": COMMANDS,
    "arr_coc.eval.faithfulness": COMMANDS,
    "arr_coc.eval.sets": COMMANDS,
    "arr_coc.eval.conversations": COMMANDS,
    "arr_coc.eval.figures": COMMANDS,
    "arr_coc.eval.rows": ("torch",) + COMMANDS,  # the commands parse with it
    "arr_coc.pocket.train": ("arr_coc.relevance", "arr_coc.pipelines", "arr_coc.viz") + COMMANDS,
}


def loaded(module: str) -> list[str]:
    """Every module a fresh interpreter holds after importing `module` alone."""
    code = f"import json, sys\nimport {module}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_a_module_loads_nothing_from_the_layers_above_it(module):
    above = [m for m in loaded(module) if m.startswith(LAYERS[module]) and not m.startswith(module)]
    assert above == [], f"{module} loads {above}"


FACADE = "arr_coc.model"


def imported_names(path: Path, package: str) -> list[str]:
    """Every module a source file names in an import, wherever the import stands (at the top, in a function, under
    TYPE_CHECKING): `from arr_coc.model import X`, `import arr_coc.model`, `from arr_coc import model` (relative ones
    resolved within `package`), and importlib's string `"arr_coc.model"`."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x (level 1: the package itself), from .. import x, ...
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and node.value == FACADE:
            names.append(node.value)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "arr_coc" / "pipelines").glob("*.py")), ids=lambda path: path.name)
def test_no_pipeline_imports_the_facade(path):
    facade = [name for name in imported_names(path, "arr_coc.pipelines")
              if name == FACADE or name.startswith(FACADE + ".")]
    assert facade == [], f"arr_coc/pipelines/{path.name} imports the facade: {facade}"
