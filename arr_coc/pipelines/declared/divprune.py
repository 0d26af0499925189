"""divprune: DivPrune, the native view's most diverse tokens (arr_coc/pipelines/divprune.py)."""

from arr_coc.pipelines.pipeline import Pipeline

PIPELINE = Pipeline("divprune", "arr_coc.pipelines.divprune", "DivPrune: the native view's most diverse tokens, as "
                    "many as ARR reads", kind="reducer", order=50, from_embeds=True)
