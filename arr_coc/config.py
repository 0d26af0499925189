"""
The pipelines' settings and names. PipelineConfig says how the pipelines look at an image (gestalt size,
native-resolution cap, the prior's layer); it belongs to the running app or command, never to an ARR checkpoint
(whose knobs are arr_coc.relevance.config.ARRCOCConfig), so A/B compares two layers on identical views.
The names (the pipelines' registry, engines, strategies) are here, apart from torch, so the commands check their flags before anything heavy loads.

    from arr_coc.config import PipelineConfig
    pipe = PipelineConfig(max_cells=16384)
"""

from dataclasses import dataclass

from arr_coc.pipelines import BASELINES, PIPELINES  # noqa: F401  (re-exported: the registry's names, torch-free)
from arr_coc.relevance.config import ARRCOCConfig, STRATEGIES  # noqa: F401  (re-exported: --strategy choices)

DEFAULT_BUDGET = ARRCOCConfig.budget  # saccades per image: the flags' default is the layer's
DEFAULT_MODEL = "Qwen/Qwen2-VL-2B-Instruct"
ENGINES = ("fast", "hf")  # generation: our static cache + CUDA graphs, or transformers' own generate()
MIN_CELLS, MAX_CELLS = 1024, 16384  # bounds of PipelineConfig.max_cells (1024 = 2x a 256-token gestalt per side)
MAX_QUESTION_CHARS = 4000  # the longest question a pipeline takes (run checks --question against it at parse time)


@dataclass(frozen=True)
class PipelineConfig:
    gestalt_max_tokens: int = 256  # at most this many merged gestalt tokens (16x16 at 448^2)
    max_cells: int = 4096  # cap on the native-resolution candidate grid and on the `full` baseline (64x64 at 1792^2)
    budget_tokens: int = 529  # token count of Views.budget_grid when no budget is asked for (the `budget` baseline
    # sizes its view to ARR's count at the request's budget instead: 23x23 at 644^2 by default)
    prior_layer_fraction: float = 0.5  # read question->gestalt attention at this fraction of the LLM's depth
    fastv_layer: int = 2  # FastV's K (Chen et al. 2024): layers >= K read only the top image tokens (the paper's 2)

    def __post_init__(self):
        if not MIN_CELLS <= self.max_cells <= MAX_CELLS:
            raise ValueError(f"max_cells must be between {MIN_CELLS} and {MAX_CELLS}, got {self.max_cells}")
        if not 1 <= self.gestalt_max_tokens <= MIN_CELLS // 4:
            raise ValueError(f"gestalt_max_tokens must be between 1 and {MIN_CELLS // 4}, got {self.gestalt_max_tokens}")
