"""
SCORERS: the relevance layer's ways of knowing, one entry each: the layer builds a scorer module per entry (named
by it: the checkpoint's key prefix), the balancer weighs their maps ([B, S, gh, gw], in this order), the ablations
run each alone, the drawing titles each map, and the untrained balancer gives each its prior weight. A new scorer
is one entry here plus its module (arr_coc.relevance.knowing's classes show the two methods it needs); a checkpoint
saved with fewer scorers loads with the newer ones at their priors (ARRCOCLayer.from_pretrained).

ARRCOCConfig: the ARR relevance layer's own knobs (scorer sizes, budget, strategy). A checkpoint's config.json
is this dataclass, serialised; how a pipeline looks at an image (views, caps, the prior's layer) is
arr_coc.settings.PipelineConfig and never part of a checkpoint. TensionSettings: the tensions a request fixes by
hand (arr_coc.relevance.tensions), never part of a checkpoint either. Torch-free: the commands read it at parse time.

    from arr_coc.relevance.config import ARRCOCConfig
    cfg = ARRCOCConfig(hidden_size=1536)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Scorer:
    """One way of knowing, as the layer, the balancer, the ablations and the drawing take it."""
    name: str  # the layer's attribute, its checkpoint keys' prefix, its map's name (ScoreMaps.information, ...) and
    # the ablation that runs it alone
    what: str  # what it scores, in a few words: the ablation's description says "<what> alone"
    prior_weight: float  # its balancer weight in the untrained layer (ARRCOCConfig.prior_weights), in [0, 1]
    module: str  # "package.module.Class": an nn.Module with from_config(ARRCOCConfig) and score(textures, inputs)


SCORERS = (  # in the balancer's order; a new scorer goes last, so that older checkpoints' scorers keep their places
    Scorer("information", "the information (propositional) scorer", 0.2, "arr_coc.relevance.knowing.InformationScorer"),
    Scorer("perspectival", "the perspectival (salience) scorer", 0.2, "arr_coc.relevance.knowing.PerspectivalScorer"),
    Scorer("participatory", "the participatory (query coupling) scorer", 0.6,
           "arr_coc.relevance.knowing.ParticipatoryScorer"),
)


def scorers() -> tuple[Scorer, ...]:
    """SCORERS, read at each call (a test may add an entry)."""
    return SCORERS


def scorer_names() -> tuple[str, ...]:
    """The scorers' names, in the balancer's order (read at each call: a test may add an entry)."""
    return tuple(s.name for s in SCORERS)


def prior_weights() -> list[float]:
    """Each scorer's prior weight, in the balancer's order: the untrained layer's balancer weights."""
    return [s.prior_weight for s in SCORERS]


STRATEGIES = ("topk", "logpolar", "grid", "random", "regions", "regions_ink")  # the allocators
# (arr_coc.relevance.attending); new ones go at the end: the vLLM plugin passes a strategy by its index here
SACCADE_ORDERS = ("relevance", "raster")  # the orders the saccades can be fed to the LLM in
BUSY_PAGES = ("grid", "keep")  # what a busy image's selection becomes (ARRCOCConfig.busy_pages)
LEGACY_SACCADE_ORDER = "relevance"  # the order of a checkpoint whose config.json names none: the default before
# issue 61, which every such checkpoint was trained and measured in
MAX_EXPLORE = 0.5  # at most half the budget goes to coverage: ARR stays relevance-led
AUTO = "auto"  # the budget value that turns the adaptive budget on (--budget auto)
WIDTH = (1, 1024)  # a scorer's or the balancer's width (16 and 32 by default): far wider is no ARR layer but a bomb
BUDGET = (1, 65536)  # saccades: 4x the largest candidate grid (arr_coc.settings.MAX_CELLS)
# every number field's range, inclusive: a checkpoint's config.json (an upload, in the app) is checked against these
# before anything is built from it, so a hostile size cannot allocate gigabytes
LIMITS = dict(
    hidden_size=(1, 16384),  # the LLM's hidden size (Qwen2-VL-2B: 1536; the largest Qwen-VL: 8192)
    budget=(0, BUDGET[1]), seed=(0, 2**63 - 1),
    texture_channels=(13, 13),  # generate_texture_array's 13 channels: the scorers can be fed no other count
    info_hidden=WIDTH, persp_hidden=WIDTH, partic_dim=WIDTH, balancer_hidden=WIDTH,
    logpolar_rho=(1, 1024), logpolar_theta=(1, 1024),
    void_tolerance=(0.0, 1.0), void_top_fraction=(1e-6, 1.0), void_structure=(0.0, 1e6),
    spacing_radius=(0.0, 1e6), min_budget=BUDGET, max_budget=BUDGET, budget_temperature=(1e-6, 1e6),
)


@dataclass
class ARRCOCConfig:
    # --- the VLM this layer is built for (checked when a checkpoint is loaded) ---
    base_model_family: str = "qwen2_vl"  # model_type of the VLM whose embeddings feed the participatory scorer
    hidden_size: int = 1536  # LLM hidden size D of that VLM (Qwen2-VL-2B: 1536)
    # --- budget ---
    budget: int = 273  # saccades per image, fixed for every image and query
    strategy: str = "topk"  # default allocation strategy, one of STRATEGIES
    seed: int = 0  # seed of the `random` strategy
    # the order the saccades are fed to the LLM, at their true positions either way: "raster" (row by row: the
    # order of every image the VLM was trained on; the default since issue 61: the pocket model reads the asked box
    # forced into 64 saccades 0.66 / 0.72 in raster order, 0.50 / 0.53 in relevance order;
    # benchmarks/pocket75135_defaults_issue61/README.md) or
    # "relevance" (most relevant first: sequence position as a priority signal, the seeds' lesson 4; an ablation)
    saccade_order: str = "raster"
    # --- texture and scorers ---
    texture_channels: int = 13  # channels of generate_texture_array
    info_hidden: int = 16  # width of the propositional scorer's learned residual
    persp_hidden: int = 16  # width of the perspectival scorer's learned residual CNN
    partic_dim: int = 32  # width of the participatory cross-attention (cells x query tokens)
    balancer_hidden: int = 32  # width of the balancer MLP
    prior_weights: list[float] = field(default_factory=prior_weights)  # the untrained balancer's weights, one a scorer
    # --- allocation ---
    logpolar_rho: int = 16  # radial bins of the logpolar strategy
    logpolar_theta: int = 17  # angular bins of the logpolar strategy (16 x 17 = 272 <= 273)
    void_tolerance: float = 1e-4  # relevance range below this (relative) is a "semantic void": fall back to grid
    void_top_fraction: float = 0.02  # the top cells the busy-image test weighs (2 % of the candidate cells)
    # a busy image: its content map's top 2 % of cells hold less than this many times the 2 % a uniform map gives
    # them (concentration.image_structure, on the scorers' hand-designed priors, so the same for every checkpoint;
    # busy_pages says what its selection becomes). Measured at 896-1792 px: noise 2.04-2.12, periodic textures
    # 1.91-2.03 are busy; data.py documents 2.19-2.20, photos >= 2.56, fine-print pages >= 8 are not
    void_structure: float = 2.15
    # what a busy image's selection becomes: "keep" (the strategy's own picks kept, Allocation.fallback "busy":
    # recorded, not acted on) or "grid" (swapped for an even grid, "semantic_void"); one of BUSY_PAGES. "keep" since
    # issue 61: on 43 busy box_grid pages (pocket model, 896², 64 saccades) a grid held 0.07 of the asked box and read
    # 0.02 of its words, the kept selection 0.45 and 0.30 (benchmarks/pocket75135_defaults_issue61/README.md)
    busy_pages: str = "keep"
    # --- the three tensions (arr_coc.relevance.tensions); each prior is what a fresh or older checkpoint does ---
    spacing_radius: float = 2.0  # cells: the width of the proximity a spacing penalty lambda > 0 pushes picks apart by
    min_budget: int = 64  # the adaptive budget's floor (--budget auto; --min-budget)
    max_budget: int = 512  # the adaptive budget's ceiling (--budget auto; --max-budget), capped by the grid's cells
    budget_temperature: float = 0.5  # softmax temperature of the relevance map's entropy, the adaptive budget's prior

    def __post_init__(self):
        for f in fields(self):  # types and ranges first: the checks below, and the layer, trust them
            check_field(f.name, f.type, getattr(self, f.name))
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.saccade_order not in SACCADE_ORDERS:
            raise ValueError(f"saccade_order must be one of {SACCADE_ORDERS}, got {self.saccade_order!r}")
        if self.busy_pages not in BUSY_PAGES:
            raise ValueError(f"busy_pages must be one of {BUSY_PAGES}, got {self.busy_pages!r}")
        if not 1 <= self.min_budget <= self.max_budget:
            raise ValueError(f"the adaptive budget needs 1 <= min_budget <= max_budget, got {self.min_budget}, "
                             f"{self.max_budget}")


def check_field(name: str, kind: str, value) -> None:
    """
    One ARRCOCConfig field (`kind`: its annotation) against its type and LIMITS; TypeError or ValueError naming
    the field. JSON has no int/float split that matters here: a whole number is a valid float, but a bool is no
    number and 1.0 no int.
    """
    if kind == "str":
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {shown(value)}")
    elif name == "prior_weights":
        if not (isinstance(value, (list, tuple)) and len(value) == len(SCORERS) and all(is_number(v) for v in value)
                and all(0 <= v <= 1 for v in value)):
            raise TypeError(f"{name} must be a list of {len(SCORERS)} numbers in [0, 1], got {shown(value)}")
    else:
        lo, hi = LIMITS[name]
        if not is_number(value) or (kind == "int" and not isinstance(value, int)):
            raise TypeError(f"{name} must be {'an integer' if kind == 'int' else 'a number'} in [{lo}, {hi}], "
                            f"got {shown(value)}")
        if not lo <= value <= hi:  # NaN fails too
            raise ValueError(f"{name} must be in [{lo}, {hi}], got {shown(value)}")


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def shown(value) -> str:
    """A config value as an error message quotes it: its repr, cut short (a hostile file may hold megabytes)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class TensionSettings:
    """Tensions fixed by hand in place of the balancer's (None: the balancer's own), and the adaptive budget's
    bounds (None: the layer config's)."""
    explore: float | None = None  # e in [0, 0.5]
    diversify: float | None = None  # lambda >= 0
    particularize: float | None = None  # f in [0, 1] (--budget auto only)
    min_budget: int | None = None  # the adaptive budget's floor
    max_budget: int | None = None  # the adaptive budget's ceiling

    def __post_init__(self):
        checks = dict(explore=(0.0, MAX_EXPLORE), diversify=(0.0, float("inf")), particularize=(0.0, 1.0))
        for name, (lo, hi) in checks.items():
            value = getattr(self, name)
            if value is not None and not lo <= value <= hi:
                raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
        if self.min_budget is not None and self.max_budget is not None and not 1 <= self.min_budget <= self.max_budget:
            raise ValueError(f"the adaptive budget needs 1 <= min <= max, got {self.min_budget}, {self.max_budget}")

    def over(self, other: TensionSettings | None) -> TensionSettings:
        """These settings, each unset one taken from `other`."""
        if other is None:
            return self
        return TensionSettings(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None
                                  else getattr(other, f.name) for f in fields(self)})


NO_SETTINGS = TensionSettings()  # nothing fixed by hand
