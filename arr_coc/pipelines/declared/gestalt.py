"""gestalt: the stock model on the low-res gestalt view alone (arr_coc/pipelines/gestalt.py)."""

from arr_coc.pipelines.pipeline import Pipeline

PIPELINE = Pipeline("gestalt", "arr_coc.pipelines.gestalt", "stock: the low-res gestalt view alone", kind="stock",
                    order=30, budget_free=True)
