"""
No function over MAX_LINES lines, read from the source: every module of arr_coc/ and app.py is parsed with `ast`,
and every function counts (top-level, methods, nested ones, async ones), from its `def` to its last line
(decorators left out), blank lines, comments and docstrings included. A longer one fails the test, named by
file:line with its length: split it into pieces that read top to bottom (issue 50).

    .venv/bin/python -m pytest tests/test_function_length.py
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60


def sources() -> list[Path]:
    """Every module the rule covers: arr_coc/ (all of it) and app.py."""
    return sorted((ROOT / "arr_coc").rglob("*.py")) + [ROOT / "app.py"]


def function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, length in lines) of every function and method in one module, nested ones too."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_rule_reads_every_module():
    paths = sources()
    assert ROOT / "arr_coc" / "evaluate.py" in paths and ROOT / "arr_coc" / "pocket" / "trainer.py" in paths
    assert sum(len(function_lengths(path)) for path in paths) > 500  # the functions are found, methods and all


def test_no_function_is_longer_than_the_bound():
    too_long = [f"{path.relative_to(ROOT)}:{line} {name}: {length} lines"
                for path in sources() for name, line, length in function_lengths(path) if length > MAX_LINES]
    assert not too_long, f"{len(too_long)} function(s) over {MAX_LINES} lines; split them:\n" + "\n".join(too_long)
