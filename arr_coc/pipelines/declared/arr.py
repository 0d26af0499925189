"""arr: ARR-COC itself (arr_coc/pipelines/arr.py), and its settings, its Options (strategy, ablation, the second
look, ...: arr_coc/pipelines/arr_options.py, their own module, which the request's checks and the pipelines read)."""

from arr_coc.pipelines.arr_options import Options
from arr_coc.pipelines.pipeline import Pipeline

PIPELINE = Pipeline("arr", "arr_coc.pipelines.arr", "ARR-COC: the gestalt, then saccades chosen by relevance at native "
                    "resolution", kind="arr", order=10, from_embeds=True, options=Options)
