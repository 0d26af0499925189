"""pixelprune_n: PixelPrune at ARR's token count (arr_coc/pipelines/pixelprune.py's answer_n): PixelPrune's settings."""

from arr_coc.pipelines.declared.pixelprune import Options
from arr_coc.pipelines.pipeline import Pipeline

PIPELINE = Pipeline("pixelprune_n", "arr_coc.pipelines.pixelprune", "PixelPrune at ARR's token count: of its "
                    "pixel-unique cells, the most unique (farthest from the nearest other), as many as ARR reads",
                    kind="reducer", order=90, from_embeds=True, options=Options, answer="answer_n")
