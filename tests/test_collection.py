"""
The suite collects whatever else is installed. A distribution that ships a top-level `tests` package (lmms-eval's
dependency latex2sympy2 does) shadows this repo's tests/, which is no package (no __init__.py): so no test imports
another test module through `tests.`. Shared helpers live in tests/conftest.py, imported as `conftest` (pytest puts
its folder first on sys.path), or as fixtures.

    .venv/bin/python -m pytest -q tests/test_collection.py
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports_of_tests(path: Path) -> list[str]:
    """Where a file imports the `tests` package or a module under it: "tests/x.py:12: tests.y"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                  if name == "tests" or name.startswith("tests.")]
    return found


def test_no_test_imports_another_through_the_tests_package():
    found = [hit for path in sorted((ROOT / "tests").rglob("*.py")) for hit in imports_of_tests(path)]
    assert found == [], "import shared test helpers from conftest, not through the tests package: " + "; ".join(found)


def test_the_suite_collects_with_a_foreign_tests_package_first_on_the_path(tmp_path):
    """The whole suite, collected (every test module imported) with a throwaway top-level `tests` package first on
    PYTHONPATH; before the helpers moved into conftest, test_tensions.py and test_vllm.py failed to import
    (ModuleNotFoundError: No module named 'tests.relevance')."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text('"""A foreign top-level tests package, as latex2sympy2\'s."""\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    shadow = subprocess.run([sys.executable, "-c", "import tests; print(tests.__file__)"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert shadow.stdout.strip() == str(tmp_path / "tests" / "__init__.py"), shadow.stderr  # it does shadow tests/
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "error" not in done.stdout.splitlines()[-1], done.stdout[-3000:]
