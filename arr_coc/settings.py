"""
How the pipelines look at an image, and the names every layer shares: the first layer, torch-free and importing
nothing, so that vlm/, the pipelines and the commands read the same values (the pipelines' names are their
registry's, arr_coc.pipelines, and the strategies the relevance layer's, arr_coc.relevance.config: both torch-free).
PipelineConfig belongs to the running app or command, never to an ARR checkpoint (whose knobs are
arr_coc.relevance.config.ARRCOCConfig), so A/B compares two layers on identical views.

    from arr_coc.settings import PipelineConfig
    pipe = PipelineConfig(max_cells=16384)
"""

from dataclasses import dataclass

DEFAULT_MODEL = "Qwen/Qwen2-VL-2B-Instruct"
ENGINES = ("fast", "hf")  # generation: our static cache + CUDA graphs, or transformers' own generate()
MIN_CELLS, MAX_CELLS = 1024, 16384  # bounds of PipelineConfig.max_cells (1024 = 2x a 256-token gestalt per side)
GESTALT_PER_CELLS = 4  # the gestalt holds at most max_cells // 4 tokens: the candidate grid stays >= 2x it per side
MAX_QUESTION_CHARS = 4000  # the longest question a pipeline takes (run checks --question against it at parse time)
MAX_QUESTION_TOKENS = 2048  # ... and in the model's tokens (4000 four-byte characters can be 16,000 of them)
MAX_IMAGE_PIXELS = 64_000_000  # the largest image the app and the commands read, checked on its header before
# anything decodes it: larger ones take seconds to decode, for no gain (the model reads a few megapixels of it)
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # the only formats PIL may open for the app and
# the commands (JPEG opens a phone's MPO too); never EPS and the like, whose PIL plugins run programs (Ghostscript)
TINY_NAMES = ("tiny", "tiny-qwen2.5-vl", "tiny-qwen3-vl")  # arr_coc.vlm.tiny.TINY_MODELS' names, torch-free
TINY_LLM_LAYERS = 4  # their LLM depth (arr_coc.vlm.tiny builds them so): --fastv-layer is checked against it before
# torch loads
MAX_NEW_TOKENS = 1024  # the most tokens one request generates (the pipelines and --max-new-tokens check it)
PRIOR_READOUTS = ("calibrated", "default")  # which attention the prior pass reads: the model's calibrated readout
# (its prior.json, arr_coc.vlm.readout; today's where it has none), or today's (every head, the question's rows, the
# middle layer) whatever it has
REFIXATE_GUIDES = ("prior", "attention")  # what points ARR's second look (ARR's Options.refixate_guide), the default first
LOOKS = ("one", "two_scale")  # how ARR's first look chooses its cells (ARR's Options.look), the default first: one, the
# gestalt's prior alone; two_scale, the region around the relevance peak re-read as a crop of its own whose prior
# chooses the cells inside it (arr_coc.pipelines.two_scale)
CROP_TOKENS = 256  # the two-scale look's crop: this many native cells (16 x 16 on a square page, 448 px at 28 px),
# read at native resolution, one token a cell (ARR's Options.crop_tokens)
MIN_CROP_TOKENS = 4  # the smallest crop (2 x 2 cells), as the image processor's smallest view (56 x 56 px)
MAX_CONVERSATION_TOKENS = 16384  # the most tokens a conversation's context holds: a turn that would pass it is
# refused (start a new conversation); Qwen2-VL-2B's K/V cache of that many is 464 MB in bf16


@dataclass(frozen=True)
class PipelineConfig:
    gestalt_max_tokens: int = 256  # at most this many merged gestalt tokens (16x16 at 448^2; at most max_cells // 4,
    # a request's gestalt_tokens overrides it: 576 is Q-Zoom's coarse pass, 24x24 at 672^2)
    max_cells: int = 4096  # cap on the native-resolution candidate grid and on the `full` baseline (64x64 at 1792^2)
    budget_tokens: int = 529  # token count of Views.budget_grid when no budget is asked for (the `budget` baseline
    # sizes its view to ARR's count at the request's budget instead: 23x23 at 644^2 by default)
    prior_layer_fraction: float = 0.5  # read question->gestalt attention at this fraction of the LLM's depth
    fastv_layer: int = 2  # FastV's K (Chen et al. 2024): layers >= K read only the top image tokens (the paper's 2)
    pixelprune_tau: float = 0.0  # PixelPrune's threshold: a cell within this many 0-255 levels of its neighbour's
    # reconstruction is dropped before the ViT (0: exact duplicates only, the paper's lossless setting)

    def __post_init__(self):
        if not MIN_CELLS <= self.max_cells <= MAX_CELLS:
            raise ValueError(f"max_cells must be between {MIN_CELLS} and {MAX_CELLS}, got {self.max_cells}")
        if not 1 <= self.gestalt_max_tokens <= self.max_cells // GESTALT_PER_CELLS:
            raise ValueError(f"gestalt_max_tokens must be between 1 and max_cells // {GESTALT_PER_CELLS} = "
                             f"{self.max_cells // GESTALT_PER_CELLS}, got {self.gestalt_max_tokens}")
