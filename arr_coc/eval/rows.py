"""
The names of evaluate's rows, and what each one runs: "full", "arr:topk", "arr-no-gestalt:topk" (ARR under an
ablation), "arr+refix:topk" (ARR with its second look), "arr+two_scale:topk" (ARR's two-scale look), "oracle" (ARR
with the asked box's cells forced in). Torch-free, so the commands parse with it.

    split_row("arr-no-gestalt:topk")   # ("arr", "topk", "no-gestalt", False)
    split_row("oracle")                # ("oracle", None, None, False): evaluate runs it as arr:topk, box forced in
    row_look("arr+two_scale:topk")     # "two_scale" (ARR's Options.look); "one" for every other row
"""

from arr_coc.settings import LOOKS

REFIX = "+refix"  # the mark of a row with ARR's second look: "arr+refix:topk"
TWO_SCALE = "+two_scale"  # the mark of a row whose ARR looks at two scales (ARR's Options.look "two_scale"):
# "arr+two_scale:topk", "arr+two_scale+refix:topk"
ORACLE = "oracle"  # the row of ARR's ceiling on items with an asked box: the box's candidate cells forced into the
# budget (the most relevant of them where they are more), the rest chosen by ARR under ORACLE_STRATEGY, fed as ARR
# feeds: "not found" (ARR below it) against "not read" (it below 1)
ORACLE_STRATEGY = "topk"  # the strategy that fills the oracle's budget: ARR's own relevance order, highest first


def split_row(row: str) -> tuple[str, str | None, str | None, bool]:
    """A row's name -> (pipeline, strategy, ablation, whether ARR looks again): "arr-no-gestalt:topk" ->
    ("arr", "topk", "no-gestalt", False); "arr+refix:topk" -> ("arr", "topk", None, True)."""
    pipeline, _, strategy = row.partition(":")
    pipeline, refix, _ = pipeline.replace(TWO_SCALE, "").partition(REFIX)
    pipeline, _, ablation = pipeline.partition("-")
    return pipeline, strategy or None, ablation or None, bool(refix)


def look_mark(look: str) -> str:
    """The mark a look puts in its ARR rows' names: "" for one look (arr:topk), TWO_SCALE for two (arr+two_scale:topk)."""
    return "" if look == LOOKS[0] else TWO_SCALE


def row_look(row: str) -> str:
    """The look a row's ARR runs (ARR's Options.look): "two_scale" for a row marked TWO_SCALE, else "one"."""
    return LOOKS[1] if TWO_SCALE in row.partition(":")[0] else LOOKS[0]
