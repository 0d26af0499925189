"""visionzip: VisionZip, the native view's most-attended tokens plus merged context (arr_coc/pipelines/visionzip.py)."""

from arr_coc.pipelines.pipeline import Pipeline

PIPELINE = Pipeline("visionzip", "arr_coc.pipelines.visionzip", "VisionZip: the native view's most-attended tokens "
                    "plus merged context, as many as ARR reads", kind="reducer", order=60, from_embeds=True)
