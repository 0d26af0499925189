"""
The two configs of ARR-COC, kept apart on purpose:

- ARRCOCConfig: the ARR relevance layer's own knobs (scorer sizes, budget, strategy). A checkpoint's
  config.json is this dataclass, serialised.
- PipelineConfig: how the pipelines look at an image (gestalt size, native-resolution cap, the prior's
  layer). It belongs to the running app or command, never to a checkpoint, so A/B compares two layers on
  identical views.

    from arr_coc.config import ARRCOCConfig, PipelineConfig
    cfg = ARRCOCConfig(hidden_size=1536)
    pipe = PipelineConfig(max_cells=16384)
"""

from dataclasses import dataclass, field

STRATEGIES = ("topk", "logpolar", "grid", "random")
PIPELINES = ("arr", "full", "gestalt", "budget")  # here, not in model.py, so the commands check flags without torch
BASELINES = ("full", "gestalt", "budget")
DEFAULT_MODEL = "Qwen/Qwen2-VL-2B-Instruct"
ENGINES = ("fast", "hf")  # generation: our static cache + CUDA graphs, or transformers' own generate()


@dataclass
class ARRCOCConfig:
    # --- the VLM this layer is built for (checked when a checkpoint is loaded) ---
    base_model_family: str = "qwen2_vl"  # model_type of the VLM whose embeddings feed the participatory scorer
    hidden_size: int = 1536  # LLM hidden size D of that VLM (Qwen2-VL-2B: 1536)
    # --- budget ---
    budget: int = 273  # saccades per image, fixed for every image and query
    strategy: str = "topk"  # default allocation strategy, one of STRATEGIES
    seed: int = 0  # seed of the `random` strategy
    # --- texture and scorers ---
    texture_channels: int = 13  # channels of generate_texture_array
    info_hidden: int = 16  # width of the propositional scorer's learned residual
    persp_hidden: int = 16  # width of the perspectival scorer's learned residual CNN
    partic_dim: int = 32  # width of the participatory cross-attention (cells x query tokens)
    balancer_hidden: int = 32  # width of the balancer MLP
    prior_weights: list[float] = field(default_factory=lambda: [0.2, 0.2, 0.6])  # balancer weights of the untrained layer
    # --- allocation ---
    logpolar_rho: int = 16  # radial bins of the logpolar strategy
    logpolar_theta: int = 17  # angular bins of the logpolar strategy (16 x 17 = 272 <= 273)
    void_tolerance: float = 1e-4  # relevance range below this (relative) is a "semantic void": fall back to grid

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.budget < 0:
            raise ValueError(f"budget must be >= 0, got {self.budget}")
        if len(self.prior_weights) != 3:
            raise ValueError(f"prior_weights needs 3 values, got {self.prior_weights}")


MIN_CELLS, MAX_CELLS = 1024, 16384  # bounds of PipelineConfig.max_cells (1024 = 2x a 256-token gestalt per side)


@dataclass(frozen=True)
class PipelineConfig:
    gestalt_max_tokens: int = 256  # at most this many merged gestalt tokens (16x16 at 448^2)
    max_cells: int = 4096  # cap on the native-resolution candidate grid and on the `full` baseline (64x64 at 1792^2)
    budget_tokens: int = 529  # token count of the same-budget `budget` baseline (23x23 at 644^2)
    prior_layer_fraction: float = 0.5  # read question->gestalt attention at this fraction of the LLM's depth

    def __post_init__(self):
        if not MIN_CELLS <= self.max_cells <= MAX_CELLS:
            raise ValueError(f"max_cells must be between {MIN_CELLS} and {MAX_CELLS}, got {self.max_cells}")
        if not 1 <= self.gestalt_max_tokens <= MIN_CELLS // 4:
            raise ValueError(f"gestalt_max_tokens must be between 1 and {MIN_CELLS // 4}, got {self.gestalt_max_tokens}")
