"""full: the stock model as users run it (arr_coc/pipelines/stock.py's full)."""

from arr_coc.pipelines.pipeline import Pipeline

PIPELINE = Pipeline("full", "arr_coc.pipelines.stock", "stock: the native view, capped at max_cells (the model as users "
                    "run it)", kind="stock", order=20, budget_free=True, answer="full")
