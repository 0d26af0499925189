"""
The README (and the pages under docs/) against the code and the files: what a newcomer reads must be true.

- README.md is at most 15 KB and its sections come in the order a newcomer reads them;
- every link and in-page anchor of README.md, docs/*.md and the run write-ups under benchmarks/ resolves, and every repo path they name exists;
- every `python -m arr_coc.X` names a module that exists;
- the counts: the examples the app offers (assets/examples.json), the images they use, the checkpoints shipped;
- every endpoint the app registers (each `api_name` in app.py and arr_coc/app/) is named, and no other;
- every flag of the app and of the commands is in docs/commands.md;
- the test command is the one .ci/run runs;
- the performance tables and the headline are the numbers of the JSON the README names;
- the accuracy intervals are the model card's, and each is the 95% Wilson interval of a count over its n.

No model loads; `--help` of the commands runs in subprocesses (a fraction of a second each).

    .venv/bin/python -m pytest tests/test_readme.py -q
"""

import ast
import itertools
import json
import math
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RUNS = sorted([*(ROOT / "benchmarks").glob("*.md"), *(ROOT / "benchmarks").glob("*/README.md")])  # the run write-ups
PAGES = [[README], *([page] for page in DOCS), RUNS]  # each test's pages: one at a time, the write-ups together
MAX_README_BYTES = 15 * 1024
SECTIONS = ["Contents", "Quick start", "How it works", "What you get offline", "The app", "The command line",
            "Performance", "Accuracy", "Where ARR's selection matters", "Where to read on"]  # the README's second-level headings, in reading order
OUTPUT_DIRS = {"runs", "out", "data", "build"}  # where the commands write: named in examples, not in the repo
INSTALLED = ("arr_coc/shipped", ".venv-vllm/bin/", ".venv-lmms/bin/")  # made by `pip install .` (setup.py) and
# the README's venv steps (a console script there appears once the venv is rebuilt), not in the repo
EXAMPLES = ROOT / "assets" / "examples.json"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}
POCKET_EXAMPLE = "pocket_"  # arr_coc/app/ui.py: an example image named so is a page the pocket model answers
MODEL_CARD = ROOT / "models" / "pocket-qwen2-vl" / "README.md"
COMMANDS = {  # what docs/commands.md lists every flag of: the app and the console scripts (pyproject.toml)
    "app.py": [sys.executable, "app.py", "--help"],
    **{m: [sys.executable, "-m", f"arr_coc.{m}", "--help"] for m in ("run", "train", "evaluate", "bench", "eval.data")},
}


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The body of the second-level section `heading` (up to the next second-level heading)."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"no '## {heading}' section"
    return match.group(1)


def without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def slugs(text: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, only letters, marks, decimal digits, '_', '-' and
    spaces kept, each space a '-'; a repeated heading gets -1, -2, ..."""
    seen, out = {}, set()
    for heading in re.findall(r"^#{1,6} (.+)$", without_fences(text), flags=re.M):
        kept = "".join(c for c in heading.strip().lower()
                       if c in "-_ " or unicodedata.category(c)[0] in "LM" or unicodedata.category(c) in ("Nd", "Nl"))
        slug = kept.replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def links(text: str) -> list[str]:
    """Targets of Markdown links and images outside code."""
    return re.findall(r"\]\(([^)\s]+)\)", without_fences(re.sub(r"`[^`\n]*`", "", text)))


def expand_braces(token: str) -> list[str]:
    """benchmarks/x_{a,b}_{1,2}.json -> the four names."""
    parts = re.split(r"\{([^{}]*)\}", token)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def repo_paths(text: str) -> set[str]:
    """Words that name a file or folder of the repo: in inline code, and in code blocks where they start with one
    of the repo's own top-level folders (with a '/'); output folders, hub ids and placeholders are left out."""
    top = {p.name for p in ROOT.iterdir()} - OUTPUT_DIRS
    package = {p.name for p in (ROOT / "arr_coc").iterdir()}
    words = [w for span in re.findall(r"`([^`\n]+)`", without_fences(text)) for w in span.split()]
    words += [w for block in re.findall(r"^```.*?^```", text, flags=re.M | re.S) for w in block.split()
              if w.split("/")[0] in top and "/" in w]
    found = set()
    for word in words:
        word = word.strip("()[],;:'\"").removesuffix("/")
        if "/" not in word or "://" in word or word.startswith(("$", "-")) or re.search(r"[<>*=|]", word):
            continue
        first = word.split("/")[0]
        if (first in top or first in package) and not word.startswith(INSTALLED):
            found.update(expand_braces(word))
    return found


def exists(path: str) -> bool:
    """A repo path, or one relative to the package (`vlm/decoder.py` in a table of arr_coc's parts)."""
    return (ROOT / path).exists() or (ROOT / "arr_coc" / path).exists()


def module_exists(dotted: str, attribute: bool = False) -> bool:
    """arr_coc.a.b: a module or package of the repo (what `python -m` runs); with attribute, arr_coc.a.b.name
    also passes where arr_coc.a.b does."""
    parts = dotted.split(".")
    for n in (len(parts), len(parts) - 1) if attribute else (len(parts),):
        base = ROOT.joinpath(*parts[:n])
        if n > 1 and (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            return True
    return False


def wilson(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of correct / n (the formula, written out again: the README is checked
    against the statistics, not against the code that printed them)."""
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in text (header and separator rows included)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")]


def number(cell: str) -> float:
    return float(re.sub(r"[*×x ]", "", cell.split("(")[0]))


# ----------------------------------------------------------------------------- size and order


def test_readme_is_at_most_15_kb():
    size = README.stat().st_size
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes, over {MAX_README_BYTES}: move reference to docs/"


def test_readme_sections_come_in_reading_order():
    text = without_fences(read(README))
    assert re.findall(r"^## (.+)$", text, flags=re.M) == SECTIONS
    lines = text.splitlines()
    steps = [i + 1 for i, line in enumerate(lines) if re.match(r"[1-7]\. \*\*", line)
             and i > lines.index("## How it works")]
    assert len(steps) >= 7 and steps[6] <= 120, f"the method's seventh step is on line {steps[6:7]}, past line 120"
    intro = text.split("\n## ", 1)[0]
    assert re.search(r"!\[[^\]]*\]\(docs/screenshots/[^)]+\.png\)", intro), "one screenshot before the contents"
    anchors = re.findall(r"\]\(#([^)]+)\)", section(text, "Contents"))
    assert anchors == [re.sub(r"[^\w -]", "", h.lower()).replace(" ", "-") for h in SECTIONS[1:]], anchors
    assert set(anchors) <= slugs(text), anchors


# ----------------------------------------------------------------------------- links, paths, modules


@pytest.mark.parametrize("pages", PAGES, ids=lambda p: p[0].name if len(p) == 1 else "benchmarks")
def test_links_and_anchors_resolve(pages):
    broken = []
    for page in pages:
        for target in links(read(page)):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (anchor and file.suffix == ".md" and anchor not in slugs(read(file))):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, f"links that lead nowhere: {broken}"


@pytest.mark.parametrize("pages", PAGES, ids=lambda p: p[0].name if len(p) == 1 else "benchmarks")
def test_every_repo_path_named_exists(pages):
    missing = sorted(f"{page.relative_to(ROOT)}: {p}" for page in pages for p in repo_paths(read(page)) if not exists(p))
    assert not missing, f"paths named that do not exist: {missing}"


@pytest.mark.parametrize("pages", PAGES, ids=lambda p: p[0].name if len(p) == 1 else "benchmarks")
def test_every_module_named_exists(pages):
    missing = []
    for page in pages:
        text = read(page)
        run = set(re.findall(r"-m (arr_coc(?:\.\w+)+)", text))  # python -m / torchrun -m: a module
        named = set(re.findall(r"`(arr_coc(?:\.\w+)+)`", text))  # a module, or a name in one
        placeholder = re.compile(r"\.[A-Z]$")  # python -m arr_coc.X
        missing += sorted(f"{page.relative_to(ROOT)}: {m}" for m in
                          {m for m in run if not module_exists(m) and not placeholder.search(m)} |
                          {m for m in named if not module_exists(m, attribute=True) and not placeholder.search(m)})
    assert not missing, f"modules named that do not exist: {missing}"


# ----------------------------------------------------------------------------- counts


def test_example_count():
    app = read(ROOT / "app.py")
    assert "load_examples(" in app and '"examples.json"' in app, "the app's examples are no longer examples.json"
    examples = json.loads(read(EXAMPLES))
    text = read(README)
    said = [int(n) for n in re.findall(r"(\d+) examples", text)]
    assert said and set(said) == {len(examples)}, (said, len(examples))
    pocket = sum(e["image"].startswith(POCKET_EXAMPLE) for e in examples)
    others = [int(n) for n in re.findall(r"The other (\d+)", text)]
    assert others == [len(examples) - pocket], (others, len(examples) - pocket)
    images = {e["image"] for e in examples}
    on_disk = {p.name for p in (ROOT / "assets").iterdir() if p.suffix.lower() in IMAGE_SUFFIXES}
    assert images <= on_disk
    said_images = [int(n) for n in re.findall(r"(\d+) images in `assets/`", text)]
    assert said_images == [len(images)] and len(images) == len(on_disk), (said_images, len(images), len(on_disk))


def test_checkpoint_count():
    shipped = sorted(p.name for p in (ROOT / "checkpoints").iterdir() if (p / "config.json").is_file())
    text = read(README)
    said = [int(n) for n in re.findall(r"(\d+) ARR checkpoints", text)]
    assert said == [len(shipped)], (said, shipped)
    assert all(f"`{name}`" in text for name in shipped), shipped


def registered_endpoints() -> set[str]:
    """Every api_name=... given to an event in app.py and arr_coc/app/."""
    names = set()
    for path in [ROOT / "app.py", *(ROOT / "arr_coc" / "app").glob("*.py")]:
        for node in ast.walk(ast.parse(read(path))):
            if isinstance(node, ast.keyword) and node.arg == "api_name" and isinstance(node.value, ast.Constant):
                names.add(node.value.value)
    return names


def test_every_endpoint_is_named():
    endpoints = registered_endpoints()
    assert {"compare", "microscope", "ab"} <= endpoints  # the extraction still finds them
    listed = re.search(r"^\*\*Endpoints\.\*\*(.*?)(?:\n\n|\Z)", section(read(README), "The app"), flags=re.M | re.S)
    assert listed, "the README's **Endpoints.** paragraph"
    assert set(re.findall(r"`/(\w+)`", listed.group(1))) == endpoints
    commands = read(ROOT / "docs" / "commands.md")
    assert all(f"`/{name}`" in commands for name in endpoints)


def flags_of(output: str) -> set[str]:
    options = output.split("\noptions:", 1)[-1]
    return set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", options, flags=re.M)) - {"--help"}


def test_every_flag_is_in_docs_commands():
    running = {name: subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
               for name, cmd in COMMANDS.items()}
    reference = read(ROOT / "docs" / "commands.md")
    for name, process in running.items():
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, (name, err[-2000:])
        flags = flags_of(out)
        assert flags, name
        missing = sorted(f for f in flags if not re.search(rf"`{re.escape(f)}[ `]", reference))
        assert not missing, f"docs/commands.md lacks these flags of {name}: {missing}"


def test_the_test_command_is_what_ci_runs():
    ci = read(ROOT / ".ci" / "run").split("# The README's test command, verbatim:\n", 1)[1].strip().splitlines()[0]
    assert f"```bash\n{ci}\n```" in section(read(README), "Quick start")


# ----------------------------------------------------------------------------- numbers


def bench() -> tuple[str, dict]:
    performance = section(read(README), "Performance")
    names = re.findall(r"`(benchmarks/[\w.-]+\.json)`", performance)
    assert len(set(names)) == 1, names
    return performance, json.loads(read(ROOT / names[0]))


def test_performance_table_is_the_json():
    performance, run = bench()
    assert run["device"] in performance and "bf16" in performance and run["dtype"] == "torch.bfloat16"
    p = run["sizes"]["1792"]["pipelines"]
    arr = p["arr/fast"]
    labels = {"**ARR-COC**": "arr", "`pixelprune_n`": "pixelprune_n", "`divprune`": "divprune",
              "`visionzip`": "visionzip", "`fastv`": "fastv", "`full`": "full"}
    readers = [r for r in table_rows(performance) if r[0] in labels]
    assert len(readers) == 7, readers
    for row in readers:
        key = f"{labels[row[0]]}/{'hf' if row[1] == 'stock' else 'fast'}"
        got, t, tokens = p[key], p[key]["timings_ms"], p[key]["tokens"]
        visual = f"{tokens['gestalt']} + {tokens['saccade']}" if key == "arr/fast" else str(tokens["total_visual"])
        selection = "–" if t["selection"] == 0 else f"{t['selection']:.1f}"
        assert row[2:6] == [visual, f"{t['vision']:.1f}", selection, f"{t['prefill']:.1f}"], row
        assert number(row[6]) == round(got["ttft_ms"], 1), row
        assert number(row[7]) == round(got["decode_ms_per_token"], 2), row
        assert number(row[8]) == round(got["peak_memory_mb"]), row
        assert number(row[9]) == round(arr["ttft_ms"] / got["ttft_ms"], 2), row


def test_headline_is_this_run():
    _, run = bench()
    p = run["sizes"]["1792"]["pipelines"]
    arr, stock = p["arr/fast"]["ttft_ms"], p["full/hf"]["ttft_ms"]
    ratios = [arr / p[f"{r}/fast"]["ttft_ms"] for r in ("divprune", "visionzip", "fastv")]
    intro = read(README).split("\n## ", 1)[0]
    assert run["device"] in intro
    assert f"{arr:.1f} ms" in intro and f"{stock:.1f} ms" in intro and f"({arr / stock:.2f}×)" in intro
    assert f"{min(ratios):.2f}–{max(ratios):.2f}×" in intro


def test_accuracy_intervals_are_the_model_cards_and_wilson():
    accuracy = section(read(README), "Accuracy")
    card = read(MODEL_CARD)
    rows = [r for r in table_rows(accuracy) if r and r[0].startswith("step")]
    assert rows, "the accuracy table"
    for row in rows:
        n = int(row[1])
        for cell in (c for c in row[4:] if c != "–"):  # –: the pages ask no such question
            p, lo, hi = re.fullmatch(r"(\d\.\d\d) \[(\d\.\d\d), (\d\.\d\d)\]", cell).groups()
            assert cell in card, f"{cell} is not in the model card"
            fits = [k for k in range(n + 1)
                    if f"{k / n:.2f}" == p and [f"{b:.2f}" for b in wilson(k, n)] == [lo, hi]]
            assert fits, f"{cell} is no count of {n} with its Wilson interval"


def test_cpu_table_is_its_json():
    """The README's 2-core CPU table (issue 67) is benchmarks/cpu_pocket78202_ttft.json: `full` and ARR TTFT on the
    fast engine at both sizes, and ARR's follow-up turn from the bench's conversation."""
    run = json.loads((ROOT / "benchmarks/cpu_pocket78202_ttft.json").read_text())
    assert run["device"] == "CPU" and run["model"] == "pocket" and run["dtype"] == "torch.float32"
    section = read(README).split("**On a 2-core CPU**", 1)[1].split("\n\n", 2)[1]
    rows = [r for r in table_rows(section) if r[0] in ("896²", "1792²")]
    assert [r[0] for r in rows] == ["896²", "1792²"], rows
    for row in rows:
        size = run["sizes"][row[0].rstrip("²")]
        follow = next(c for c in size["conversation"] if c["pipeline"] == "arr")
        expected = [size["pipelines"]["full/fast"]["ttft_ms"], size["pipelines"]["arr/fast"]["ttft_ms"],
                    follow["follow_up_ttft_ms"]]
        assert [number(c) for c in row[1:4]] == [round(x) for x in expected], row
