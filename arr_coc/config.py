"""
The commands' names and settings in one torch-free place, so that they check their flags before anything heavy
loads: arr_coc.settings (PipelineConfig, the model, engines and bounds), the pipelines' registry and the relevance
layer's strategies.

    from arr_coc.config import PIPELINES, PipelineConfig
"""

from arr_coc.pipelines import BASELINES, PIPELINES  # noqa: F401  (re-exported: the registry's names, torch-free)
from arr_coc.relevance.config import ARRCOCConfig, STRATEGIES  # noqa: F401  (re-exported: --strategy choices)
from arr_coc.settings import (DEFAULT_MODEL, ENGINES, MAX_CELLS, MAX_QUESTION_CHARS, MIN_CELLS,  # noqa: F401
                              PipelineConfig)

DEFAULT_BUDGET = ARRCOCConfig.budget  # saccades per image: the flags' default is the layer's
