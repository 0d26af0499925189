"""
The names of evaluate's rows, and what each one runs: "full", "arr:topk", "arr-no-gestalt:topk" (ARR under an
ablation), "arr+refix:topk" (ARR with its second look). Torch-free, so the commands parse with it.

    split_row("arr-no-gestalt:topk")   # ("arr", "topk", "no-gestalt", False)
"""

REFIX = "+refix"  # the mark of a row with ARR's second look: "arr+refix:topk"


def split_row(row: str) -> tuple[str, str | None, str | None, bool]:
    """A row's name -> (pipeline, strategy, ablation, whether ARR looks again): "arr-no-gestalt:topk" ->
    ("arr", "topk", "no-gestalt", False); "arr+refix:topk" -> ("arr", "topk", None, True)."""
    pipeline, _, strategy = row.partition(":")
    pipeline, refix, _ = pipeline.partition(REFIX)
    pipeline, _, ablation = pipeline.partition("-")
    return pipeline, strategy or None, ablation or None, bool(refix)
