"""budget: the stock model on one view resized to about ARR's token count (arr_coc/pipelines/stock.py's budget)."""

from arr_coc.pipelines.pipeline import Pipeline

PIPELINE = Pipeline("budget", "arr_coc.pipelines.stock", "stock: one view resized to about ARR's token count",
                    kind="stock", order=40, answer="budget")
