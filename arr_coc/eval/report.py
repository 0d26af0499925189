"""
The evaluation report: per-row summaries of evaluate.py's results, as a Markdown table, JSON and plots.

A row is a stock baseline ("full") or ARR under one strategy ("arr:topk"). Per row: the set's metric
averaged over the items that have reference answers (the others are counted as unscored), the lenient
`contains` beside a benchmark's own metric, visual tokens, TTFT, total time and GFLOPs; box recall and
precision where items have target boxes; faithfulness areas where they were measured.

    summary = summarise(records, rows)
    paths = write_report("runs/eval", summary, header)   # report.md, report.json, accuracy_vs_tokens.png,
                                                         # accuracy_vs_ttft.png (+ faithfulness.png)
"""

import json
import statistics
from pathlib import Path

from matplotlib.figure import Figure
from PIL import Image

from arr_coc.app import viz
from arr_coc.eval.faithfulness import CURVES

# (key, column title, format): the report's columns, in order; a row shows "-" where it has no value
COLUMNS = (
    ("items", "items", "{:.0f}"),
    ("unscored", "unscored (no answers)", "{:.0f}"),
    ("accuracy", "accuracy", "{:.3f}"),
    ("contains", "contains (lenient)", "{:.3f}"),
    ("visual_tokens", "visual tokens", "{:.0f}"),
    ("ttft_ms", "TTFT ms", "{:.0f}"),
    ("total_ms", "total ms", "{:.0f}"),
    ("gflops", "GFLOPs", "{:.1f}"),
    ("box_recall", "box recall", "{:.3f}"),
    ("box_precision", "box precision", "{:.3f}"),
    *((f"{name}_area", f"{name} area", "{:.3f}") for name in CURVES),
)


def summarise(records: list[dict], rows: list[str]) -> dict[str, dict]:
    """Means per row over its records (a key only where the row's records have a value for it); records scored
    None (items without reference answers) are counted under "unscored"."""
    summary = {}
    for row in rows:
        mine = [r for r in records if r["row"] == row]
        means = {"items": float(len(mine))}
        unscored = sum(r["score"] is None for r in mine)
        if unscored:
            means["unscored"] = float(unscored)
        for key in ("score", "contains", "visual_tokens", "ttft_ms", "total_ms", "gflops", "box_recall",
                    "box_precision"):
            values = [r[key] for r in mine if r.get(key) is not None]
            if values:
                means["accuracy" if key == "score" else key] = statistics.fmean(values)
        for name in CURVES:
            areas = [r["faithfulness"]["areas"][name] for r in mine if "faithfulness" in r]
            if areas:
                means[f"{name}_area"] = statistics.fmean(areas)
        summary[row] = means
    return summary


def markdown_table(summary: dict[str, dict], metric: str) -> str:
    """One line per row; only the columns some row has."""
    columns = [c for c in COLUMNS if any(c[0] in m for m in summary.values())]
    titles = [f"accuracy ({metric})" if key == "accuracy" else title for key, title, _ in columns]
    lines = ["| row | " + " | ".join(titles) + " |", "|---" * (len(columns) + 1) + "|"]
    for row, means in summary.items():
        cells = [fmt.format(means[key]) if key in means else "-" for key, _, fmt in columns]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def accuracy_plot(summary: dict[str, dict], x: str, x_label: str, metric: str, path: Path) -> None:
    """Accuracy against a cost (visual tokens, TTFT), one labelled point per row."""
    fig = Figure(figsize=(6, 4), dpi=110, layout="constrained")
    ax = fig.subplots()
    labels: dict[tuple[float, float], list[str]] = {}  # rows on the same point share one label
    for row, means in summary.items():
        marker = "o" if row.startswith("arr") else "s"  # ARR rows round, stock baselines square
        ax.scatter(means[x], means["accuracy"], marker=marker, s=40)
        labels.setdefault((means[x], means["accuracy"]), []).append(row)
    for point, rows in labels.items():
        ax.annotate(", ".join(rows), point, textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"accuracy ({metric})")
    ax.grid(alpha=0.3)
    fig.savefig(path)


def faithfulness_plot(records: list[dict], path: Path) -> bool:
    """The mean deletion, random and insertion curves of every ARR row that measured them, one panel each."""
    rows = list(dict.fromkeys(r["row"] for r in records if "faithfulness" in r))
    if not rows:
        return False
    panels = []
    for row in rows:
        mine = [r["faithfulness"] for r in records if r["row"] == row and "faithfulness" in r]
        mean = {name: [statistics.fmean(values) for values in zip(*(f[name] for f in mine))] for name in CURVES}
        panels.append(viz.faithfulness_chart(mine[0]["fractions"], mean, f"{row}: mean over {len(mine)} items"))
    sheet = Image.new("RGB", (max(p.width for p in panels), sum(p.height for p in panels)), "white")
    for i, panel in enumerate(panels):
        sheet.paste(panel, (0, sum(p.height for p in panels[:i])))
    sheet.save(path)
    return True


def tokens_by_kind(records: list[dict], rows: list[str]) -> str:
    """Markdown: per ARR row (those that record a budget K) and scene kind, the mean visual tokens and the
    accuracy; "" when no row records K. Under --budget auto, K (and so the tokens) is each image's own."""
    rows = [row for row in rows if any(r["row"] == row and "budget" in r for r in records)]
    kinds = list(dict.fromkeys(r.get("kind") for r in records))  # real sets may have no kinds: one column, None
    if not rows:
        return ""
    lines = ["| row | " + " | ".join(str(kind or "all items") for kind in kinds) + " |",
             "|---" * (len(kinds) + 1) + "|"]
    for row in rows:
        cells = []
        for kind in kinds:
            mine = [r for r in records if r["row"] == row and r.get("kind") == kind]
            scored = [r["score"] for r in mine if r["score"] is not None]
            accuracy = f" ({statistics.fmean(scored):.2f})" if scored else ""
            cells.append(f"{statistics.fmean(r['visual_tokens'] for r in mine):.0f}{accuracy}" if mine else "-")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "Mean visual tokens (accuracy) per scene kind:\n\n" + "\n".join(lines)


def write_report(folder: str | Path, summary: dict[str, dict], header: dict, records: list[dict]) -> list[Path]:
    """report.md, report.json and the plots in `folder`; `header` holds the run's settings and throughput."""
    folder = Path(folder)
    metric = header["metric"]
    (folder / "report.json").write_text(json.dumps(dict(header, summary=summary), indent=2))
    settings = ", ".join(f"{k} `{v}`".replace("\n", "\\n")  # the prompt's line break shown, not rendered as a space
                         for k, v in header.items() if v is not None and not isinstance(v, dict))
    by_kind = tokens_by_kind(records, list(summary))
    (folder / "report.md").write_text(f"# ARR-COC evaluation\n\n{settings}\n\n{markdown_table(summary, metric)}\n"
                                      + (f"\n{by_kind}\n" if by_kind else ""))
    paths = [folder / "report.md", folder / "report.json"]
    for x, label, name in (("visual_tokens", "visual tokens per image", "accuracy_vs_tokens.png"),
                           ("ttft_ms", "time to first token (ms)", "accuracy_vs_ttft.png")):
        if any("accuracy" in means for means in summary.values()):  # not when every item is unscored (a test split)
            accuracy_plot(summary, x, label, metric, folder / name)
            paths.append(folder / name)
    if faithfulness_plot(records, folder / "faithfulness.png"):
        paths.append(folder / "faithfulness.png")
    return paths
