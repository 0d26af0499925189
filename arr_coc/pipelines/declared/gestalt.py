"""gestalt: the stock model on the low-res gestalt view alone (arr_coc/pipelines/stock.py's gestalt)."""

from arr_coc.pipelines.pipeline import Pipeline

PIPELINE = Pipeline("gestalt", "arr_coc.pipelines.stock", "stock: the low-res gestalt view alone", kind="stock",
                    order=30, budget_free=True, answer="gestalt")
