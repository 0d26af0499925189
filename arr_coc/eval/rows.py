"""
The names of evaluate's rows, and what each one runs: "full", "arr:topk", "arr-no-gestalt:topk" (ARR under an
ablation), "arr+refix:topk" (ARR with its second look), "oracle" (ARR with the asked box's cells forced in).
Torch-free, so the commands parse with it.

    split_row("arr-no-gestalt:topk")   # ("arr", "topk", "no-gestalt", False)
    split_row("oracle")                # ("oracle", None, None, False): evaluate runs it as arr:topk, box forced in
"""

REFIX = "+refix"  # the mark of a row with ARR's second look: "arr+refix:topk"
ORACLE = "oracle"  # the row of ARR's ceiling on items with an asked box: the box's candidate cells forced into the
# budget (the most relevant of them where they are more), the rest chosen by ARR under ORACLE_STRATEGY, fed as ARR
# feeds: "not found" (ARR below it) against "not read" (it below 1)
ORACLE_STRATEGY = "topk"  # the strategy that fills the oracle's budget: ARR's own relevance order, highest first


def split_row(row: str) -> tuple[str, str | None, str | None, bool]:
    """A row's name -> (pipeline, strategy, ablation, whether ARR looks again): "arr-no-gestalt:topk" ->
    ("arr", "topk", "no-gestalt", False); "arr+refix:topk" -> ("arr", "topk", None, True)."""
    pipeline, _, strategy = row.partition(":")
    pipeline, refix, _ = pipeline.partition(REFIX)
    pipeline, _, ablation = pipeline.partition("-")
    return pipeline, strategy or None, ablation or None, bool(refix)
