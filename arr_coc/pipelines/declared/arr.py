"""arr: ARR-COC itself (arr_coc/pipelines/arr.py). Its settings are still the Request's own fields (strategy, budget,
ablation, refixate, ...), not yet an Options of its own."""

from arr_coc.pipelines.pipeline import Pipeline

PIPELINE = Pipeline("arr", "arr_coc.pipelines.arr", "ARR-COC: the gestalt, then saccades chosen by relevance at native "
                    "resolution", kind="arr", order=10, from_embeds=True)
