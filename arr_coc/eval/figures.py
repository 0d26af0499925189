"""
The README's figures of a budget sweep (evaluate --budgets): accuracy against visual tokens and against time to
first token, one curve per method with its 95% Wilson band, a panel per page kind (and layout family, where the
results name one: sparse and dense pages apart). The time is the full-size
architecture's, from a `bench --budgets` run on one GPU (the same run for every method), not the small model's
that answered.

    python -m arr_coc.eval.figures --bench benchmarks/h100_..._1792_budgets.json --size 1792 --out docs/figures \
        --curve "full=full@runs/sw_bw,runs/sw_fp" --curve "ARR prior=arr-raster:topk@runs/sw_bw,runs/sw_fp" \
        --curve "ARR answer loss=arr:topk@runs/sw_answer"

A curve is NAME=ROW@FOLDER[,FOLDER...]: the results of that evaluate row in those folders (each result names its
kind); a row that reads no budget (full, gestalt) is drawn as a line across at its one accuracy. A curve whose
method the bench did not time is left out of the TTFT figure, and the command says so.
"""

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from matplotlib import colormaps
from matplotlib.figure import Figure

from arr_coc import flags
from arr_coc.eval.records import EvalRecord
from arr_coc.eval.rows import split_row
from arr_coc.eval.intervals import wilson
from arr_coc.pipelines import REDUCERS


@dataclass
class Point:
    """One method at one budget on one kind."""
    budget: int | None  # saccades (None: a row that reads no budget)
    correct: float  # exact matches
    n: int  # items
    tokens: float  # mean visual tokens the LLM read

    @property
    def accuracy(self) -> float:
        return self.correct / self.n


def curve_spec(text: str) -> tuple[str, str, list[str]]:
    """An argparse type: NAME=ROW@FOLDER[,FOLDER...] -> (name, row, folders)."""
    name, _, rest = text.partition("=")
    row, _, folders = rest.partition("@")
    if not (name and row and folders):
        raise argparse.ArgumentTypeError(f"expected NAME=ROW@FOLDER[,FOLDER...], got {text!r}")
    missing = [f for f in folders.split(",") if not (Path(f) / "results.jsonl").is_file()]
    if missing:
        raise argparse.ArgumentTypeError(f"no results.jsonl in {', '.join(missing)}")
    return name, row, folders.split(",")


def points(row: str, folders: list[str]) -> dict[str, list[Point]]:
    """{kind and family (EvalRecord.kind_label): [Point per budget, in order]} of an evaluate row in result folders."""
    tally = defaultdict(lambda: [0.0, 0, 0.0])  # (kind, budget) -> correct, n, tokens
    for folder in folders:
        for line in (Path(folder) / "results.jsonl").read_text().splitlines():
            r = EvalRecord.from_json(json.loads(line))
            if r.row == row and r.score is not None:
                cell = tally[(r.kind_label, r.budget)]
                cell[0] += r.score
                cell[1] += 1
                cell[2] += r.visual_tokens
    out = defaultdict(list)
    for (kind, budget), (correct, n, tokens) in sorted(tally.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        out[kind].append(Point(budget, correct, n, tokens / n))
    return out


def bench_ttft(bench: dict, size: int, row: str, budget: int | None) -> float | None:
    """The bench's TTFT (fast engine) of the pipeline behind an evaluate row at a budget (a budget-free row: its
    own); None where the bench did not time it."""
    pipeline = split_row(row)[0]  # "arr-raster:topk" -> "arr"
    timings = bench["sizes"][str(size)]
    if budget is None or pipeline not in ("arr", "budget", *REDUCERS):
        return timings["pipelines"].get(f"{pipeline}/fast", {}).get("ttft_ms")
    return timings["budgets"].get(str(budget), {}).get(pipeline, {}).get("ttft_ms")


def figure(curves: dict[str, dict[str, list[Point]]], x, x_label: str, title: str) -> Figure:
    """A panel per kind; per curve its accuracy against x(curve name, point) with the 95% band (a budget-free row:
    a line across, its x written on it, panel by panel: its tokens differ by family); a curve with a point x gives None for is left out, its colour kept."""
    kinds = sorted({kind for by_kind in curves.values() for kind in by_kind})
    cols = min(len(kinds), 2)  # two panels a row: a kind's sparse and dense families side by side
    rows = -(-len(kinds) // cols)
    fig = Figure(figsize=(6 * cols + 2, 4.6 * rows), dpi=110, layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False).ravel()
    for spare in grid[len(kinds):]:
        spare.set_visible(False)
    axes = grid[:len(kinds)]
    palette = colormaps["tab10"]
    for ax, kind in zip(axes, kinds):
        written = 0  # budget-free lines written on so far in this panel: each one's x goes further left
        for i, (name, by_kind) in enumerate(curves.items()):
            mine = by_kind.get(kind, [])
            if not mine or any(x(name, p) is None for p in mine):  # none here, or not on this axis (untimed)
                continue
            bands = [wilson(p.correct, p.n) for p in mine]
            colour = palette(i % 10)
            if mine[0].budget is None:  # read no budget: its one accuracy across the plot, banded, its x written
                ax.axhline(mine[0].accuracy, color=colour, linestyle="--", label=name)  # on it in each panel
                ax.axhspan(*bands[0], color=colour, alpha=0.08)
                ax.text(0.99 - 0.12 * written, mine[0].accuracy, f"at {x(name, mine[0]):.0f}", color=colour,
                        fontsize=7, ha="right", va="bottom", transform=ax.get_yaxis_transform())
                written += 1
                continue
            xs = [x(name, p) for p in mine]
            ax.plot(xs, [p.accuracy for p in mine], "o-", color=colour, label=name, markersize=4)
            ax.fill_between(xs, [b[0] for b in bands], [b[1] for b in bands], color=colour, alpha=0.15)
        ax.set_title(f"{kind} ({mine[0].n if mine else 0} pages a point)")
        ax.set_xlabel(x_label)
        ax.set_ylabel("exact match, 95% Wilson band")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(title, fontsize=10)
    return fig


def bench_file(path: str) -> dict:
    """An argparse type: a bench --json file, read."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"cannot read {path} as a bench JSON ({type(e).__name__})") from None


@dataclass
class FiguresConfig:
    """`python -m arr_coc.eval.figures`'s flags, each field one (arr_coc.flags.flag)."""
    curve: list[tuple] = flags.flag(None, "NAME=ROW@FOLDER[,FOLDER...]: one curve, from an evaluate row's results in "
                                          "those folders", curve_spec, required=True, append=True)
    bench: dict = flags.flag(None, "a bench --json of a run with --budgets: the TTFT of each method at each budget",
                             bench_file, required=True)
    size: int = flags.flag(None, "the page side of the sweep, and the bench size whose TTFT is used",
                           flags.bounded_int(56, 8192), required=True)
    title: str = flags.flag("", "a line over both figures (the model, the pages, the devices)")
    out: str = flags.flag(None, "write the two PNGs into this folder (made if missing)", required=True)


def parse_args(argv=None) -> FiguresConfig:
    return flags.parse_config(FiguresConfig, argv, flags.config_parser(FiguresConfig, __doc__))


def main(argv=None) -> list[Path]:
    args = parse_args(argv)
    bench = args.bench
    if "budgets" not in bench.get("sizes", {}).get(str(args.size), {}):
        raise SystemExit(f"error: the bench JSON has no --budgets timings at {args.size} px")
    curves = {name: points(row, folders) for name, row, folders in args.curve}
    rows = {name: row for name, row, _ in args.curve}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "accuracy_vs_tokens.png", out / "accuracy_vs_ttft.png"]
    figure(curves, lambda name, p: p.tokens, "visual tokens the LLM read", args.title).savefig(paths[0])
    for name, by_kind in curves.items():
        if any(bench_ttft(bench, args.size, rows[name], p.budget) is None for ps in by_kind.values() for p in ps):
            print(f"{name}: the bench did not time {rows[name]} at these budgets; left out of the TTFT figure")
    figure(curves, lambda name, p: bench_ttft(bench, args.size, rows[name], p.budget),
           f"TTFT ms of the 2B architecture ({bench['device']}, bench)", args.title).savefig(paths[1])
    for path in paths:
        print(f"wrote {path}")
    return paths


if __name__ == "__main__":
    main()
