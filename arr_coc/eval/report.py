"""
The evaluation report: per-row summaries of evaluate.py's results (EvalRecord, arr_coc.eval.records), as a
Markdown table, JSON and plots.

A row is a baseline ("full", "divprune") or ARR under one strategy ("arr:topk"); in a budget sweep, a row at one
budget is labelled row@budget ("arr:topk@64"; full and gestalt read no budget and keep their names). Per row:
the set's metric averaged over the items that have reference answers (the others are counted as unscored), the
lenient `contains` beside a benchmark's own metric, visual tokens, TTFT, total time and GFLOPs; box recall and
precision where items have target boxes; faithfulness areas where they were measured; beside a `full` row, each
row's accuracy against it ("tie" where their 95% intervals overlap, else "below" or "above"). Rows with ARR's second
look ("arr+refix:topk", at each budget in a sweep) get their own section: how often it fired, and the accuracy
with and without it. On a set of several scene kinds (the pocket suite's), every row's accuracy per kind with its
95% Wilson interval and items (kind_table; "by_kind" in report.json). ARR rows, which record their tensions, get a
table of the mean visual tokens and accuracy per scene kind (tokens_by_kind: each image's own K under --budget auto).

    summary = summarise(records, [label(row, budget) for row, budget in jobs])
    paths = write_report("runs/eval", summary, header)   # report.md, report.json, accuracy_vs_tokens.png,
                                                         # accuracy_vs_ttft.png (+ faithfulness.png)

A sweep's report has a table per budget (full and gestalt in each), its report.json the curves (each row's
points in budget order), and its two plots one curve per row: accuracy against visual tokens and against TTFT. Each
plot gives every row's 95% Wilson interval (a band, or a bar at a lone point) on a y-axis of 0 to 1, under a title
naming the model and the items.

Rows evaluated on different items (a sweep's budget skipped over an image's grid, a result lost) are flagged at
the top of report.md, and listed under "uneven_items" in report.json (row -> the items it lacks). The oracle row
(ARR with the asked box forced in) reads only the items with a box: it is flagged only where it lacks one of those,
and one line under the tables says how many items it skipped and how many boxes exceeded its budget (oracle_line).
"""

import json
import statistics
from pathlib import Path

from matplotlib import colormaps
from matplotlib.figure import Figure
from PIL import Image

from arr_coc import viz
from arr_coc.eval.faithfulness import CURVES
from arr_coc.eval.records import EvalRecord
from arr_coc.eval.rows import ORACLE
from arr_coc.eval.intervals import interval_text, wilson

# (key, column title, format): the report's columns, in order; a row shows "-" where it has no value
COLUMNS = (
    ("items", "items", "{:.0f}"),
    ("unscored", "unscored (no answers)", "{:.0f}"),
    ("accuracy", "accuracy", "{:.3f}"),
    ("interval", "95% interval", "[{0[0]:.2f}, {0[1]:.2f}]"),  # Wilson's, of the accuracy over its scored items
    ("contains", "contains (lenient)", "{:.3f}"),
    ("visual_tokens", "visual tokens", "{:.0f}"),
    ("ttft_ms", "TTFT ms", "{:.0f}"),
    ("total_ms", "total ms", "{:.0f}"),
    ("gflops", "GFLOPs", "{:.1f}"),
    ("box_recall", "box recall", "{:.3f}"),
    ("box_precision", "box precision", "{:.3f}"),
    ("prior_peak", "prior peak on box", "{:.3f}"),  # the share of items whose attention prior peaks on the box
    *((f"{name}_area", f"{name} area", "{:.3f}") for name in CURVES),
)

PLOTS = (("visual_tokens", "visual tokens per image", "accuracy_vs_tokens.png", "accuracy against visual tokens"),
         ("ttft_ms", "time to first token (ms)", "accuracy_vs_ttft.png", "accuracy against TTFT"))
AT = "@"  # a sweep's label: row@budget


def label(row: str, budget: int | None = None) -> str:
    """A summary's key: the row, at its budget in a sweep ("arr:topk@64")."""
    return row if budget is None else f"{row}{AT}{budget}"


def record_label(record: EvalRecord) -> str:
    """The summary key of one result: its row, at its budget in a sweep."""
    return label(record.row, record.budget)


def split_label(key: str) -> tuple[str, int | None]:
    """label's inverse: "arr:topk@64" -> ("arr:topk", 64); "full" -> ("full", None)."""
    row, at, budget = key.partition(AT)
    return row, int(budget) if at else None


def summarise(records: list[EvalRecord], rows: list[str]) -> dict[str, dict]:
    """Means per row label over its records (a key only where the row's records have a value for it); records
    scored None (items without reference answers) are counted under "unscored"."""
    summary, kinds = {}, list(dict.fromkeys(r.kind_label for r in records))  # the set's kinds, every row's columns
    for row in rows:
        mine = [r for r in records if record_label(r) == row]
        means = {"items": float(len(mine))}
        unscored = sum(r.score is None for r in mine)
        if unscored:
            means["unscored"] = float(unscored)
        for key in ("score", "contains", "visual_tokens", "ttft_ms", "total_ms", "gflops", "box_recall",
                    "box_precision", "prior_peak"):
            values = [getattr(r, key) for r in mine if getattr(r, key) is not None]
            if values:
                means["accuracy" if key == "score" else key] = statistics.fmean(values)
            if values and key == "score":
                means["interval"] = wilson(sum(values), len(values))
        for name in CURVES:
            areas = [r.faithfulness["areas"][name] for r in mine if r.faithfulness is not None]
            if areas:
                means[f"{name}_area"] = statistics.fmean(areas)
        if by_kind := kind_means(mine, kinds):
            means["by_kind"] = by_kind
        summary[row] = means
    return summary


def kind_means(records: list[EvalRecord], kinds: list[str]) -> dict[str, dict]:
    """One row's records of a set with several scene kinds (or layout families), `kinds` the set's kind_labels ->
    per kind_label the row has scored items of, those items, their summed score, the accuracy and its 95% Wilson
    interval ({} for a set of one kind, or none). A row need not hold every kind: the oracle skips boxless items."""
    out = {}
    for kind in kinds if len(kinds) > 1 else ():
        scores = [r.score for r in records if r.kind_label == kind and r.score is not None]
        if scores:
            out[kind] = dict(items=len(scores), correct=sum(scores), accuracy=statistics.fmean(scores),
                             interval=wilson(sum(scores), len(scores)))
    return out


def uneven_items(records: list[EvalRecord], rows: list[str]) -> dict[str, list[int]]:
    """Per row label that lacks some of the items other rows were evaluated on, those items (sorted): its means are
    over other items than its neighbours', so the table compares unlike with unlike. {} when the rows agree. The
    oracle reads only the items with an asked box (boxed_items): it lacks an item only where that item has one."""
    items = {row: {r.item for r in records if record_label(r) == row} for row in rows}
    every, boxed = set().union(*items.values()), boxed_items(records)
    expected = {row: boxed if split_label(row)[0] == ORACLE else every for row in rows}
    return {row: sorted(expected[row] - mine) for row, mine in items.items() if expected[row] - mine}


def boxed_items(records: list[EvalRecord]) -> set[int]:
    """The items with an asked box: those whose results measure box recall."""
    return {r.item for r in records if r.box_recall is not None}


def oracle_line(records: list[EvalRecord]) -> str:
    """One line on the oracle row (evaluate's ORACLE): how many items it skipped for want of an asked box, and how
    many of its results had a box larger than the budget (box_clipped); "" without oracle results."""
    oracle = [r for r in records if r.row == ORACLE]
    if not oracle:
        return ""
    items, boxed = {r.item for r in records}, boxed_items(records)
    clipped = sum(bool(r.box_clipped) for r in oracle)
    return (f"oracle: the asked box's cells forced into ARR's budget, on the {len(boxed)} of {len(items)} items with "
            f"a box ({len(items - boxed)} without one skipped); {clipped} of its {len(oracle)} results had a box "
            "larger than the budget (only its most relevant cells forced in)")


def uneven_line(uneven: dict[str, list[int]], total: int) -> str:
    """uneven_items in one line: each row with how many items it lacks and which (the first ten)."""
    rows = [f"{row} lacks {len(missing)} of {total} (item {', '.join(map(str, missing[:10]))}"
            f"{', ...' if len(missing) > 10 else ''})" for row, missing in uneven.items()]
    return "rows were evaluated on different items, so their means are not comparable: " + "; ".join(rows)


def markdown_table(summary: dict[str, dict], metric: str) -> str:
    """One line per row; only the columns some row has; with a scored `full` row, each row's accuracy against it."""
    columns = [c for c in COLUMNS if any(c[0] in m for m in summary.values())]
    titles = [f"accuracy ({metric})" if key == "accuracy" else title for key, title, _ in columns]
    full = summary.get("full", {}).get("interval")
    titles += ["against `full`"] if full else []
    lines = ["| row | " + " | ".join(titles) + " |", "|---" * (len(titles) + 1) + "|"]
    for row, means in summary.items():
        cells = [fmt.format(means[key]) if key in means else "-" for key, _, fmt in columns]
        cells += [against(means.get("interval"), full) if row != "full" else "-"] if full else []
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def kind_table(summary: dict[str, dict], metric: str) -> str:
    """Markdown: each row's accuracy per scene kind with its 95% Wilson interval and items, "0.90 [0.82, 0.94]
    (n=96)"; "" when no row has kinds (summarise's by_kind)."""
    kinds = list(dict.fromkeys(kind for means in summary.values() for kind in means.get("by_kind", {})))
    if not kinds:
        return ""
    lines = [f"Accuracy ({metric}) per scene kind, 95% Wilson interval, scored items:", "",
             "| row | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for row, means in summary.items():
        cells = [interval_text(m["correct"], m["items"]) if (m := means.get("by_kind", {}).get(kind)) else "-"
                 for kind in kinds]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def against(interval: tuple[float, float] | None, reference: tuple[float, float]) -> str:
    """A row's accuracy beside a reference row's, by their 95% intervals: "tie" where they overlap (no difference
    shown), else "below" or "above"; "-" for a row without scored items."""
    if interval is None:
        return "-"
    return "below" if interval[1] < reference[0] else "above" if interval[0] > reference[1] else "tie"


def refixation_summary(records: list[EvalRecord]) -> dict[str, dict]:
    """
    Per row with a second look (per row@budget in a sweep): items, how many fired and their share, the accuracy
    of its final answers (with it) and of its first answers (without it), overall and over the items where it
    fired.
    """
    summary = {}
    for row in dict.fromkeys(record_label(r) for r in records if r.refixated is not None):
        mine = [r for r in records if record_label(r) == row]
        fired = [r for r in mine if r.refixated]
        means = dict(items=len(mine), fired=len(fired), fire_rate=len(fired) / len(mine))
        for key, subset in (("", mine), ("_when_fired", fired)):
            scored = [r for r in subset if r.score is not None]
            if scored:
                means[f"accuracy{key}"] = statistics.fmean(r.score for r in scored)
                means[f"accuracy_without{key}"] = statistics.fmean(r.first_score for r in scored)
        summary[row] = means
    return summary


def refixation_table(summary: dict[str, dict]) -> str:
    """The second look's Markdown section: one line per row that has one."""
    lines = ["## Second look (refixation)", "",
             "| row | items | fired | fire rate | accuracy with | accuracy without | with, when fired | "
             "without, when fired |", "|---" * 8 + "|"]
    for row, m in summary.items():
        cells = [f"{m[key]:.3f}" if key in m else "-" for key in ("accuracy", "accuracy_without", "accuracy_when_fired",
                                                                  "accuracy_without_when_fired")]
        lines.append(f"| {row} | {m['items']} | {m['fired']} | {m['fire_rate']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def is_sweep(summary: dict[str, dict]) -> bool:
    return any(split_label(key)[1] is not None for key in summary)


def markdown_tables(summary: dict[str, dict], metric: str) -> str:
    """The one table, or in a sweep a table per budget: that budget's rows beside the ones that read none (a
    budget skipped on every item, over every image's candidate grid, has none)."""
    if not is_sweep(summary):
        return markdown_table(summary, metric)
    free = {key: means for key, means in summary.items() if split_label(key)[1] is None}
    budgets = sorted({budget for key in summary if (budget := split_label(key)[1]) is not None})
    tables = []
    for budget in budgets:
        rows = {split_label(key)[0]: means for key, means in summary.items() if split_label(key)[1] == budget}
        if not any(means["items"] for means in rows.values()):
            continue
        tables.append(f"### budget {budget} saccades\n\n{markdown_table({**free, **rows}, metric)}")
    return "\n\n".join(tables)


def curves(summary: dict[str, dict]) -> dict[str, list[dict]]:
    """A sweep's summary -> each row's points in budget order, [{budget, **means}] (one point, budget None, for
    a row that reads no budget)."""
    points: dict[str, list[dict]] = {}
    for key, means in summary.items():
        row, budget = split_label(key)
        points.setdefault(row, []).append(dict(budget=budget, **means))
    return {row: sorted(mine, key=lambda p: p["budget"] or 0) for row, mine in points.items()}


def interval_bars(ax, xs: list[float], intervals: list[tuple[float, float]], color=None) -> None:
    """95% Wilson intervals (summarise's "interval") as a band over a curve's points, or a vertical bar at a lone
    point (a band of one x has no width)."""
    lows, highs = [low for low, _ in intervals], [high for _, high in intervals]
    if len(xs) > 1:
        ax.fill_between(xs, lows, highs, color=color, alpha=0.15, linewidth=0)
    else:
        ax.vlines(xs, lows, highs, colors=color, alpha=0.6, linewidth=2)


def accuracy_axes(ax, x_label: str, metric: str, title: str) -> None:
    """The plots' shared frame: labels, the title, and the accuracy's whole range, 0 to 1 (a y-axis of 0.80-0.87
    made six items' noise look like a difference)."""
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"accuracy ({metric})")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)


def sweep_plot(rows: dict[str, list[dict]], x: str, x_label: str, metric: str, path: Path, title: str = "") -> Figure:
    """Accuracy against a cost, one curve per row through its budgets (a lone square for a row that reads none),
    each with its 95% Wilson band."""
    fig = Figure(figsize=(8, 4.5), dpi=110, layout="constrained")
    ax = fig.subplots()
    palette = colormaps["tab20"]
    for i, (row, points) in enumerate(rows.items()):
        scored = [p for p in points if "accuracy" in p and x in p]  # a budget skipped on every item has none
        if not scored:
            continue
        budget_free = scored[0]["budget"] is None
        ax.plot([p[x] for p in scored], [p["accuracy"] for p in scored], label=row, color=palette(i % 20),
                marker="s" if budget_free else "o", linestyle="none" if budget_free else "-", markersize=5)
        interval_bars(ax, [p[x] for p in scored], [p["interval"] for p in scored], palette(i % 20))
    accuracy_axes(ax, x_label, metric, title)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(path)
    return fig


def accuracy_plot(summary: dict[str, dict], x: str, x_label: str, metric: str, path: Path, title: str = "") -> Figure:
    """Accuracy against a cost (visual tokens, TTFT), one labelled point per row with its 95% Wilson interval."""
    fig = Figure(figsize=(6, 4), dpi=110, layout="constrained")
    ax = fig.subplots()
    labels: dict[tuple[float, float], list[str]] = {}  # rows on the same point share one label
    for row, means in summary.items():
        marker = "o" if row.startswith("arr") else "s"  # ARR rows round, stock baselines square
        dots = ax.scatter(means[x], means["accuracy"], marker=marker, s=40)
        interval_bars(ax, [means[x]], [means["interval"]], dots.get_facecolor()[0])
        labels.setdefault((means[x], means["accuracy"]), []).append(row)
    for point, rows in labels.items():
        ax.annotate(", ".join(rows), point, textcoords="offset points", xytext=(5, 4), fontsize=8)
    accuracy_axes(ax, x_label, metric, title)
    fig.savefig(path)
    return fig


def plot_title(what: str, header: dict) -> str:
    """A plot's title: what it shows, the model that answered and the items (the intervals are per row's own)."""
    model = header.get("model_name") or header.get("model")
    return (f"{what}" + (f", {model}" if model else "") + (f", {header['items']} items" if header.get("items") else "")
            + "; bands: 95% Wilson intervals")


def faithfulness_plot(records: list[EvalRecord], path: Path) -> bool:
    """The mean deletion, random and insertion curves of every ARR row that measured them, one panel each."""
    rows = list(dict.fromkeys(r.row for r in records if r.faithfulness is not None))
    if not rows:
        return False
    panels = []
    for row in rows:
        mine = [r.faithfulness for r in records if r.row == row and r.faithfulness is not None]
        mean = {name: [statistics.fmean(values) for values in zip(*(f[name] for f in mine))] for name in CURVES}
        panels.append(viz.faithfulness_chart(mine[0]["fractions"], mean, f"{row}: mean over {len(mine)} items"))
    sheet = Image.new("RGB", (max(p.width for p in panels), sum(p.height for p in panels)), "white")
    for i, panel in enumerate(panels):
        sheet.paste(panel, (0, sum(p.height for p in panels[:i])))
    sheet.save(path)
    return True


def tokens_by_kind(records: list[EvalRecord], rows: list[str]) -> str:
    """Markdown: per ARR row label (those that record their tensions, K among them) and scene kind, the mean visual
    tokens and the accuracy; "" when no row records K. Under --budget auto, K (and so the tokens) is each image's
    own."""
    rows = [row for row in rows if any(record_label(r) == row and r.tensions is not None for r in records)]
    kinds = list(dict.fromkeys(r.kind for r in records))  # a real set's one kind, its schema: one column
    if not rows:
        return ""
    lines = ["| row | " + " | ".join(str(kind or "all items") for kind in kinds) + " |",
             "|---" * (len(kinds) + 1) + "|"]
    for row in rows:
        cells = []
        for kind in kinds:
            mine = [r for r in records if record_label(r) == row and r.kind == kind]
            scored = [r.score for r in mine if r.score is not None]
            accuracy = f" ({statistics.fmean(scored):.2f})" if scored else ""
            cells.append(f"{statistics.fmean(r.visual_tokens for r in mine):.0f}{accuracy}" if mine else "-")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "Mean visual tokens (accuracy) per scene kind:\n\n" + "\n".join(lines)


def write_report(folder: str | Path, summary: dict[str, dict], header: dict, records: list[EvalRecord]) -> list[Path]:
    """report.md, report.json and the plots in `folder`; `header` holds the run's settings and throughput."""
    folder = Path(folder)
    metric, sweep = header["metric"], is_sweep(summary)
    refixation = refixation_summary(records)
    uneven = uneven_items(records, list(summary))
    (folder / "report.json").write_text(json.dumps(dict(header, summary=summary, refixation=refixation, **(
        {"curves": curves(summary)} if sweep else {}), uneven_items=uneven), indent=2))
    paths = [folder / "report.md", folder / "report.json"]
    for x, x_label, name, what in PLOTS:
        if any("accuracy" in means for means in summary.values()):  # not when every item is unscored (a test split)
            if sweep:
                sweep_plot(curves(summary), x, x_label, metric, folder / name, plot_title(what, header))
            else:
                accuracy_plot(summary, x, x_label, metric, folder / name, plot_title(what, header))
            paths.append(folder / name)
    if faithfulness_plot(records, folder / "faithfulness.png"):
        paths.append(folder / "faithfulness.png")
    settings = ", ".join(f"{k} `{v}`".replace("\n", "\\n")  # the prompt's line break shown, not rendered as a space
                         for k, v in header.items() if v is not None and not isinstance(v, dict))
    titles = {name: title for _, _, name, title in PLOTS} | {"faithfulness.png": "faithfulness curves"}
    links = "".join(f"\n![{titles[p.name]}]({p.name})\n" for p in paths[2:])
    second_look = f"\n{refixation_table(refixation)}\n" if refixation else ""
    by_kind = "\n\n".join(t for t in (kind_table(summary, metric), tokens_by_kind(records, list(summary))) if t)
    warning = (f"**Warning: {uneven_line(uneven, len({r.item for r in records}))}.**\n\n" if uneven else "")
    oracle = f"\n{oracle_line(records)}.\n" if oracle_line(records) else ""
    (folder / "report.md").write_text(f"# ARR-COC evaluation\n\n{warning}{settings}\n\n{markdown_tables(summary, metric)}\n"
                                      + oracle + (f"\n{by_kind}\n" if by_kind else "") + second_look + links)
    return paths
