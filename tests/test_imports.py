"""
The layers hold, read from the source: every module of arr_coc/ and app.py is parsed with `ast`, and every import it
makes counts, wherever it stands (at the top, inside a function, under TYPE_CHECKING), relative ones resolved
(`from . import x`, `from ..relevance import layer`), and so does a string naming a module of the project (an
`importlib.import_module("arr_coc.x")` argument, the pipelines' registry). LAYERS below is the one table: bottom to
top, each layer's units (a package, or a single module), and whether its units may import each other. It asserts

    a place for each     every module belongs to one unit of the table
    arrows point down    a module imports only its own unit, the layers below its own, and, where its layer
                         allows it, the other units of its layer (EXCEPTIONS names any edge allowed besides)
    no cycles            no two modules import each other, however far round (strongly connected components)
    one table            docs/ARCHITECTURE.md prints layer_table() as it is

and, in a fresh interpreter, what reading the source cannot see: which third-party packages a module loads (the
commands check their flags before torch loads; the relevance layer loads no transformers model).

    .venv/bin/python -m pytest tests/test_imports.py
    .venv/bin/python tests/test_imports.py        # prints the table as docs/ARCHITECTURE.md holds it
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (layer, its units, whether its units may import each other), bottom to top; a unit is a package (every module in
# it) or one module; a module belongs to the unit that names it or its package most closely
LAYERS = (
    ("1. utilities", ("arr_coc", "arr_coc.settings", "arr_coc.errors", "arr_coc.flags", "arr_coc.checkpoints",
                      "arr_coc.runtime", "arr_coc.eval.intervals"), False),
    ("2. the relevance layer, the VLM", ("arr_coc.relevance", "arr_coc.vlm"), False),
    ("3. pipelines", ("arr_coc.pipelines",), False),
    ("4. pages, drawing", ("arr_coc.synth", "arr_coc.viz"), False),
    ("5. research", ("arr_coc.eval", "arr_coc.pocket", "arr_coc.distill"), False),
    ("6. the façade", ("arr_coc.model",), True),
    ("7. the app, the commands", ("app", "arr_coc.app", "arr_coc.run", "arr_coc.train", "arr_coc.evaluate",
                                  "arr_coc.bench", "arr_coc.engines", "arr_coc.commands", "arr_coc.eval.figures",
                                  "arr_coc.pocket.train"), True),
)
EXCEPTIONS = {  # (importer, imported): why; the only imports allowed besides the table's (none now: runtime/'s graphs
    # asks zerogpu, of its own package, whether CUDA graphs may be captured)
}


def modules() -> dict[str, Path]:
    """Every module of the project by dotted name (a package by its own name), with its file."""
    found = {"app": ROOT / "app.py"}
    for path in sorted((ROOT / "arr_coc").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def unit_of(module: str) -> tuple[int, str]:
    """(its layer's index in LAYERS, its unit): the unit that names the module or its package most closely."""
    best = None
    for index, (_, units, _) in enumerate(LAYERS):
        for unit in units:
            if (module == unit or module.startswith(unit + ".") and unit != "arr_coc") and \
                    (best is None or len(unit) > len(best[1])):
                best = (index, unit)
    if best is None:
        raise KeyError(f"{module} has no place in tests/test_imports.py's LAYERS: add it to a layer")
    return best


def package_of(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def project_module(name: str) -> str | None:
    """The project module an imported name lives in (`arr_coc.vlm.base.VLM` -> arr_coc.vlm.base), None outside."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def named(node: ast.AST, package: str, loggers: set[int]) -> list[str]:
    """The dotted names one node imports: an import statement's modules (relative ones resolved within `package`;
    `from a import b` names a.b where b is a module, else a), or a string naming a project module (not a logger's)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # from . import x (level 1: the package itself), from .. import x, ...
            parent = package.rsplit(".", node.level - 1)[0]
            base = f"{parent}.{base}" if base else parent
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value \
            and node.value in MODULES and id(node) not in loggers:
        return [node.value]
    return []


def imports(module: str) -> dict[str, int]:
    """The project modules `module` imports (at any depth, and by string) -> the line of its first import of each."""
    return imports_in(MODULES[module].read_text(encoding="utf-8"), module, package_of(module))


def imports_in(source: str, module: str, package: str) -> dict[str, int]:
    """What imports() reads of one source: `module`'s own name left out, relative imports resolved in `package`."""
    tree = ast.parse(source)
    loggers = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
               and getattr(node.func, "attr", getattr(node.func, "id", None)) == "getLogger" for arg in node.args}
    found = {}
    for node in ast.walk(tree):
        for name in named(node, package, loggers):
            target = project_module(name)
            if target is not None and target != module:
                found[target] = min(found.get(target, node.lineno), node.lineno)
    return found


GRAPH = {module: imports(module) for module in MODULES}


def test_the_reader_sees_every_form_of_import():
    source = """
import importlib, logging
from typing import TYPE_CHECKING
import arr_coc.vlm.base
if TYPE_CHECKING:
    from arr_coc.model import ARRCOCQwen
def f():
    from . import arr, answer
    from ..relevance import layer
    from .stock import answer_view
    importlib.import_module("arr_coc.viz")
    logging.getLogger("arr_coc.app")  # a logger's name, not an import
"""
    assert imports_in(source, "arr_coc.pipelines.answer", "arr_coc.pipelines") == {
        "arr_coc.vlm.base": 4, "arr_coc.model": 6, "arr_coc.pipelines.arr": 8, "arr_coc.relevance.layer": 9,
        "arr_coc.pipelines.stock": 10, "arr_coc.viz": 11}


def where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def wrong_way(module: str, target: str) -> str | None:
    """Why `module` may not import `target` (None: it may)."""
    (layer, unit), (to_layer, to_unit) = unit_of(module), unit_of(target)
    if unit == to_unit or to_layer < layer or (module, target) in EXCEPTIONS:
        return None
    if to_layer > layer:
        return f"up, from {LAYERS[layer][0]} to {LAYERS[to_layer][0]}"
    return None if LAYERS[layer][2] else f"sideways within {LAYERS[layer][0]}, from {unit} to {to_unit}"


def test_every_module_has_a_place_in_the_table():
    homeless = []
    for module in MODULES:
        try:
            unit_of(module)
        except KeyError as e:
            homeless.append(e.args[0])
    assert not homeless, "\n".join(homeless)
    assert len(MODULES) > 60  # every module was read, not a few


def test_imports_point_down():
    """Every import of every module, at any depth: down a layer, within its unit, or sideways where allowed."""
    wrong = [f"{where(module, line)} {module} imports {target}: {why}"
             for module, targets in sorted(GRAPH.items()) for target, line in sorted(targets.items())
             if (why := wrong_way(module, target))]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_nothing_imports_the_engines():
    """arr_coc/engines/ runs inside another engine's venv (lmms-eval's: requirements-lmms.txt), found through its
    entry point: no other module of the project imports it, at any depth."""
    found = [f"{where(module, line)} {module} imports {target}" for module, targets in sorted(GRAPH.items())
             for target, line in sorted(targets.items())
             if target.startswith("arr_coc.engines") and not module.startswith("arr_coc.engines")]
    assert not found, "the engines' adapters are imported:\n" + "\n".join(found)


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while not component or component[-1] != node:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}}
    assert cycles(graph) == [["a", "b", "c"]] and cycles({"a": {"b": 1}, "b": {}}) == []


def shortest_cycle(graph: dict[str, dict[str, int]], start: str) -> list[str]:
    """The shortest import path from `start` back to itself: [start, ..., start] ([] where there is none)."""
    came_from, frontier = {}, [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return path[::-1] + [start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return []


def rotated(loop: list[str]) -> tuple[str, ...]:
    """A loop [a, b, c, a] started at its first module in sorted order: one loop, however it was found."""
    first = loop.index(min(loop[:-1]))
    return tuple(loop[first:-1] + loop[:first + 1])


def test_no_import_cycles():
    """No module reaches itself through its imports: each cycle shown as its shortest loop through each member."""
    loops = {rotated(shortest_cycle(GRAPH, m)) for component in cycles(GRAPH) for m in component}
    shown = sorted(" -> ".join(f"{a} ({where(a, GRAPH[a][b])})" for a, b in zip(loop, loop[1:])) + f" -> {loop[-1]}"
                   for loop in loops)
    assert not loops, "import cycles:\n" + "\n".join(shown)


def file_name(unit: str) -> str:
    """A unit as the page names it: `arr_coc.vlm` -> vlm/, `arr_coc.checkpoints` -> checkpoints.py, `arr_coc` -> __init__.py."""
    path = MODULES[unit].relative_to(ROOT / "arr_coc") if unit != "app" else Path("app.py")
    return f"{path.parent}/" if path.name == "__init__.py" and unit != "arr_coc" else str(path)


def layer_table() -> str:
    """LAYERS and EXCEPTIONS as docs/ARCHITECTURE.md prints them (a markdown table and its notes)."""
    rows = ["| layer | units (a package: every module in it) | its units import each other |", "|---|---|---|"]
    for name, units, sideways in reversed(LAYERS):
        shown = ", ".join(f"`{file_name(unit)}`" for unit in units)
        rows.append(f"| {name} | {shown} | {'yes' if sideways else 'no'} |")
    rows.append("")
    rows += [f"Allowed besides: `{a.removeprefix('arr_coc.')}` imports `{b.removeprefix('arr_coc.')}` ({why})."
             for (a, b), why in EXCEPTIONS.items()]
    return "\n".join(rows)


def test_the_architecture_page_prints_the_table():
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert layer_table() in page, "docs/ARCHITECTURE.md must print tests/test_imports.py's layer_table():\n" + \
        layer_table()


# what a fresh interpreter must not hold after importing the module alone: third-party packages the source test
# cannot follow (the commands check their flags before torch loads; the relevance layer loads no transformers model)
LOADS_NOTHING_OF = {
    "arr_coc.settings": ("torch",),
    "arr_coc.errors": ("torch",),
    "arr_coc.runtime.zerogpu": ("torch",),
    "arr_coc.eval.intervals": ("torch",),
    "arr_coc.pipelines": ("torch",),  # the registry: the commands' --pipelines
    "arr_coc.pipelines.arr_options": ("torch",),  # ARR's settings: the registry's arr record, the flags' defaults
    "arr_coc.relevance.ablation": ("torch",),  # the commands' --ablations
    "arr_coc.synth.fineprint": ("torch",),
    "arr_coc.eval.rows": ("torch",),  # the commands parse with it
    "arr_coc.relevance.layer": ("transformers.models",),
    "arr_coc.relevance.prior": ("transformers.models",),
}


def loaded(module: str) -> list[str]:
    """Every module a fresh interpreter holds after importing `module` alone."""
    code = f"import json, sys\nimport {module}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("module", sorted(LOADS_NOTHING_OF))
def test_a_module_loads_no_heavy_package_it_does_not_need(module):
    heavy = LOADS_NOTHING_OF[module]
    found = [m for m in loaded(module) if m in heavy or m.startswith(tuple(h + "." for h in heavy))]
    assert found == [], f"{module} loads {found[:5]}"


if __name__ == "__main__":
    print(layer_table())
