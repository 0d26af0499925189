"""
evaluate's plots (arr_coc.eval.report: accuracy_plot, sweep_plot) carry the 95% Wilson intervals the report gives,
a title naming the model and the items, and a y-axis from 0 to 1 (issue 67 item 5: no bands, no title, 0.80-0.87
for n = 6).

    python -m pytest -q tests/eval/test_report_plots.py
"""

import numpy as np
import pytest
from matplotlib.collections import LineCollection, PolyCollection

from arr_coc.eval import report
from arr_coc.eval.records import EvalRecord

# Wilson 95% intervals written out (Newcombe 1998 and standard values: tests/pocket/test_pocket.py pins them too)
HALF = (0.2993, 0.7007)  # 10 of 20
NONE_OF_TEN = (0.0, 0.2775)  # 0 of 10


def records(row: str, correct: int, n: int, tokens: int, budget: int | None = None) -> list[EvalRecord]:
    return [EvalRecord(item=i, id=str(i), kind="", row=row, budget=budget, sweep=budget is not None, prediction="",
                       answers=["a"], score=float(i < correct), visual_tokens=tokens, gflops=1.0, ttft_ms=10.0 + tokens,
                       total_ms=20.0, confidence=None) for i in range(n)]


def bars(ax) -> list[tuple[float, float, float]]:
    """(x, low, high) of each vertical interval bar (vlines: a LineCollection of vertical segments)."""
    found = []
    for collection in ax.collections:
        if isinstance(collection, LineCollection):
            found += [(float(s[0, 0]), float(s[:, 1].min()), float(s[:, 1].max())) for s in collection.get_segments()]
    return sorted(found)


def test_the_point_plot_has_each_rows_interval_a_title_and_a_y_axis_of_0_to_1(tmp_path):
    summary = report.summarise(records("full", 10, 20, 400) + records("arr:topk", 0, 10, 300), ["full", "arr:topk"])
    fig = report.accuracy_plot(summary, "visual_tokens", "visual tokens", "exact", tmp_path / "p.png",
                               report.plot_title("accuracy against visual tokens", dict(model_name="pocket", items=20)))
    ax = fig.axes[0]
    got = bars(ax)
    assert [x for x, _, _ in got] == [300.0, 400.0]
    assert got[0][1:] == pytest.approx(NONE_OF_TEN, abs=1e-4) and got[1][1:] == pytest.approx(HALF, abs=1e-4)
    assert ax.get_ylim() == (0.0, 1.0)
    assert ax.get_title() == "accuracy against visual tokens, pocket, 20 items; bands: 95% Wilson intervals"
    assert (tmp_path / "p.png").stat().st_size > 5_000


def test_the_sweep_plot_has_a_band_per_curve_and_a_bar_at_a_lone_point(tmp_path):
    rows = records("arr:topk", 10, 20, 300, budget=44) + records("arr:topk", 0, 10, 350, budget=94) + \
        records("full", 10, 20, 400)
    summary = report.summarise(rows, ["arr:topk@44", "arr:topk@94", "full"])
    fig = report.sweep_plot(report.curves(summary), "visual_tokens", "visual tokens", "exact", tmp_path / "s.png",
                            "a title")
    ax = fig.axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1  # arr's curve through its two budgets
    outline = bands[0].get_paths()[0].vertices  # [x, y] round the band: the lows, then the highs back
    at = {x: sorted({round(float(y), 4) for px, y in outline if px == x}) for x in (300.0, 350.0)}
    assert at[300.0] == pytest.approx(list(HALF), abs=1e-4)
    assert at[350.0] == pytest.approx(list(NONE_OF_TEN), abs=1e-4)
    assert bars(ax) == [(400.0, pytest.approx(HALF[0], abs=1e-4), pytest.approx(HALF[1], abs=1e-4))]  # full: a bar
    assert ax.get_ylim() == (0.0, 1.0) and ax.get_title() == "a title"
    assert np.isclose([line.get_ydata() for line in ax.lines if line.get_label() == "full"][0], 0.5).all()


def test_the_report_titles_its_plots_with_the_model_and_the_items(tmp_path, monkeypatch):
    rows = records("full", 10, 20, 400) + records("arr:topk", 0, 20, 300)
    summary = report.summarise(rows, ["full", "arr:topk"])
    titles, draw = [], report.accuracy_plot
    monkeypatch.setattr(report, "accuracy_plot", lambda *a: titles.append(a[-1]) or draw(*a))
    report.write_report(tmp_path, summary, dict(metric="exact", model_name="tiny", items=20), rows)
    assert titles == ["accuracy against visual tokens, tiny, 20 items; bands: 95% Wilson intervals",
                      "accuracy against TTFT, tiny, 20 items; bands: 95% Wilson intervals"]
    assert {p.name for p in tmp_path.iterdir()} >= {"accuracy_vs_tokens.png", "accuracy_vs_ttft.png"}
