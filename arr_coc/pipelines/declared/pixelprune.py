"""pixelprune: PixelPrune, the native view's pixel-unique cells (arr_coc/pipelines/pixelprune.py), and its one
setting, tau (pixelprune_n's too)."""

import math
from dataclasses import dataclass

from arr_coc.errors import InputError
from arr_coc.flags import bounded_float, flag
from arr_coc.pipelines.pipeline import Pipeline
from arr_coc.settings import PipelineConfig


@dataclass(frozen=True)
class Options:
    """PixelPrune's settings (--pixelprune-tau for run and evaluate); a request without them: the PipelineConfig's."""
    pixelprune_tau: float = flag(PipelineConfig.pixelprune_tau, "the pixelprune baselines' tau: a cell within this "
                                                                "many 0-255 levels (max over its pixels) of its left "
                                                                "or upper neighbour's reconstruction is dropped "
                                                                "before the ViT (0: exact duplicates only, lossless)",
                                 bounded_float(0.0, 255.0), metavar="TAU")

    def __post_init__(self):
        tau = self.pixelprune_tau
        if not (math.isfinite(tau) and 0 <= tau <= 255):
            raise InputError(f"pixelprune_tau is a pixel difference between 0 and 255, got {tau}")


PIPELINE = Pipeline("pixelprune", "arr_coc.pipelines.pixelprune", "PixelPrune: the native view's pixel-unique cells "
                    "only (a neighbour's duplicate, within tau, dropped before the ViT), every one", kind="reducer",
                    order=80, budget_free=True, from_embeds=True, options=Options)
