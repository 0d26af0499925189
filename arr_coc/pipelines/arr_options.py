"""
ARR's own settings: its Options (the arr record's, arr_coc/pipelines/declared/arr.py), carried in Request.options as
every pipeline's are, with their checks (Options.check, which check_request calls) and arr_options(request), how the
pipelines read them. Torch-free at import (the layer and the include mask are torch-typed: string annotations), so
the registry and the commands load it before torch.

Its own module, not declared/arr.py: no import cycle forces it (declared/arr.py imports pipeline.py alone, and the
registry's package imports nothing of the request's), but the request module, the ARR pipeline, the app and the
commands read these settings, and the declarations' package holds the registry's records.

Unlike the other pipelines' Options, its fields are no flags (arr_coc.flags.flag): run and evaluate name ARR's
settings in flags of their own, run's --strategy and --look, evaluate's --strategies and --looks (a row each), the
second look's --refixate flags (arr_coc.commands.cli), which take their defaults from these fields; cli.request puts
the flags a command has into these Options. with_flags_of copies no field of these (they have no help).

    request = Request(budget=40, options=(Options(strategy="grid", refixate=0.5),))
    arr_options(request).refixate   # 0.5; arr_options(Request()).refixate: None, Options()'s
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from arr_coc.errors import InputError
from arr_coc.relevance import ablation as ablations
from arr_coc.relevance.ablation import NO_ABLATION, Ablation
from arr_coc.relevance.config import TensionSettings
from arr_coc.settings import CROP_TOKENS, LOOKS, MAX_CELLS, MIN_CROP_TOKENS, REFIXATE_GUIDES

if TYPE_CHECKING:
    import torch

    from arr_coc.relevance.layer import ARRCOCLayer


@dataclass(frozen=True)
class Options:
    """ARR's settings for one request (each optional; None: the model's own setting); a request without them:
    Options(), ARR as its layer and the PipelineConfig have it."""
    strategy: str | None = None  # ARR's allocation strategy (default: the layer's)
    layer: ARRCOCLayer | None = None  # the ARR layer to score with (default: the model's)
    ablation: Ablation | str | None = None  # what of ARR to switch off (arr_coc.relevance.ablation; None: nothing), or
    # its name: check_request makes a name its Ablation
    tensions: TensionSettings | None = None  # ARR's tensions fixed by hand, the adaptive budget's bounds
    refixate: float | None = None  # tau: an answer less confident than this looks again (None: never)
    refixate_budget: int | None = None  # the second look's saccades K2 (default: REFIXATE_SHARE of the first look's K)
    refixate_guide: str = REFIXATE_GUIDES[0]  # what points the second look (one of REFIXATE_GUIDES): "prior", the prior pass
    # again with the first saccades in its context; "attention", where the first answer's own attention fell
    look: str = LOOKS[0]  # how ARR's first look chooses its cells (one of LOOKS): "one", the gestalt's prior alone;
    # "two_scale", the region around the relevance peak re-read as a crop whose own prior chooses the cells inside it
    # (arr_coc.pipelines.two_scale); the reducers at ARR's count count the crop's tokens too
    crop_tokens: int = CROP_TOKENS  # the two-scale look's crop: this many native cells, read one token a cell
    fresh_cells: bool = False  # arr's follow-ups: select only cells no earlier turn of the conversation read
    include: torch.Tensor | None = None  # [GH, GW] bool on the views' candidate grid: cells ARR's first look must
    # read, the rest of its budget chosen as ever, the most relevant of them where they outnumber the budget
    # (evaluate's oracle row forces the asked box's cells in)
    upsample: bool = False  # choose saccades even where the native view holds no more cells than its LLM
    # would read (the candidate grid then upsampled past the image: the warm-up, studies of selection on small
    # images); default: read the native view whole there, as full does (Answer.reads_native says why)

    def check(self) -> Options:
        """These settings, their ablation an Ablation (None for none: NO_ABLATION's name, or the object), their
        bounds checked (InputError naming the bound); the same Options where nothing changed."""
        ablation = ablation_named(self.ablation)
        ablation = None if ablation is NO_ABLATION else ablation
        if self.refixate is not None and not (math.isfinite(self.refixate) and 0 <= self.refixate <= 1):
            raise InputError(f"refixate (tau) is a confidence between 0 and 1, got {self.refixate}")
        if self.refixate_guide not in REFIXATE_GUIDES:
            raise InputError(f"refixate_guide must be one of {', '.join(REFIXATE_GUIDES)}, got {self.refixate_guide!r}")
        if self.refixate_budget is not None and int(self.refixate_budget) < 1:
            raise InputError(f"refixate_budget (the second look's saccades) must be at least 1, got {self.refixate_budget}")
        if self.look not in LOOKS:
            raise InputError(f"look must be one of {', '.join(LOOKS)}, got {self.look!r}")
        if not MIN_CROP_TOKENS <= int(self.crop_tokens) <= MAX_CELLS:
            raise InputError(f"crop_tokens (the two-scale look's crop) must be between {MIN_CROP_TOKENS} and "
                             f"{MAX_CELLS}, got {self.crop_tokens}")
        return self if ablation is self.ablation else replace(self, ablation=ablation)

    def arr_only(self, pipeline: str) -> str | None:
        """Why a pipeline other than arr cannot take these settings (an ablation, a second look, cells forced in:
        what only ARR does), None where it can (every other setting of ARR's it passes by)."""
        ablation = self.ablation.name if isinstance(self.ablation, Ablation) else self.ablation
        if ablation not in (None, NO_ABLATION.name):
            return f"an ablation ({ablation}) switches off part of ARR: it needs the arr pipeline, not {pipeline}"
        if self.refixate is not None:
            return f"refixation is ARR's second look: it needs the arr pipeline, not {pipeline}"
        if self.include is not None:
            return (f"cells forced into the selection (include) are ARR's saccades: they need the arr pipeline, "
                    f"not {pipeline}")
        return None


def arr_options(request) -> Options:
    """The request's (a request.Request) ARR Options, Options() where it has none."""
    return next((o for o in request.options if type(o) is Options), Options())


def ablation_named(ablation: Ablation | str | None) -> Ablation:
    """An ablation as it is, or by name (None or "none": NO_ABLATION, nothing removed); InputError naming the
    choices for an unknown name."""
    if isinstance(ablation, Ablation):
        return ablation
    try:
        return ablations.get(ablation)
    except KeyError as e:
        raise InputError(e.args[0]) from None
